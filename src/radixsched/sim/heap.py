"""Heap tuning for simulator processes (glibc only; elsewhere a no-op).

A simulation allocates and frees many mid-sized numpy arrays per step: KV rows of tens of
thousands of slots, cache node copies, match results, eviction batches. Under glibc's default
policy blocks above a sliding threshold are served by ``mmap`` and freed memory at the top of
the heap is trimmed back to the OS, so the same pages are unmapped and faulted in again all run
long: on the Mooncake trace about 20k minor page faults per policy, 3-6% of the wall time.
Raising ``M_MMAP_THRESHOLD`` keeps such blocks in the heap, where freed ones are reused
(measured: 23k faults become 6k; peak RSS grows about 10 MB).

``radixsched simulate`` calls ``tune_heap()`` after loading the workload and before it
simulates: under the setting the load's thousands of prompt-sized arrays fault in more pages
(3x-shared: 302k minor faults, against 195k). The library's ``simulate()`` never changes
process-wide settings on its own.

The cyclic garbage collector, for the length of one phase and restored after (these change no
result: reference counting frees as ever): a load of a large trace creates several objects a
request and no garbage cycle, yet each of the collector's full passes walks every object made
so far (``paused_gc``: 9 passes, 0.9 s of a 100k-request load, none collecting anything); a
run's loop starts with all of them alive (``frozen_heap``: left out of its passes).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 256 << 20  # blocks below this come from the heap


def tune_heap() -> bool:
    """Serve blocks below ``MMAP_THRESHOLD_BYTES`` from the heap (glibc ``mallopt``). Returns
    whether the setting took effect; False (and nothing changed) off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # no dynamic symbols, or a libc without mallopt (musl)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block (a bulk load: objects that all stay alive); the
    collector's state is restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# A run of fewer requests leaves the collector alone: its passes are cheap, while a process that
# simulates again and again (a calibration's fit: hundreds of runs) would pay a full collection
# of its whole heap per run.
FREEZE_MIN_REQUESTS = 20_000


@contextmanager
def frozen_heap(requests: int | None = None) -> Iterator[None]:
    """The objects alive when the block starts (a run's workload, requests and replicas) are
    left out of the collector's passes inside it (``gc.freeze``) and handed back after
    (``gc.unfreeze``); a cycle among them waits for the block's end. A caller's own frozen
    heap stays frozen. The outermost block collects first: garbage frozen with the heap would
    outlive the run, and, handed back into the oldest generation, wait for a full pass that a
    large heap makes rare (a process running simulation after simulation, as calibration does,
    grew from 5.7 to 19 GB). ``requests``: the run's size (below ``FREEZE_MIN_REQUESTS``
    nothing is done); None: freeze whatever the size."""
    if requests is not None and requests < FREEZE_MIN_REQUESTS:
        yield
        return
    thaw = gc.get_freeze_count() == 0
    if thaw:
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if thaw:
            gc.unfreeze()
