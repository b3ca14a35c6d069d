"""Prompts built when their requests arrive and dropped when they finish: a trace too large to
hold every prompt at once (a million Mooncake requests: 61 GB of tokens) runs in the memory of
the requests in flight.

A deferred request carries a stand-in prompt (``stand_in``: the right length, zero tokens, no
memory: one int32 broadcast to that length) until the simulation reaches it. ``ArrivingRequests``
is the run's request sequence: indexing it (as the event loops do, arrival by arrival) builds
the prompts of that request's batch of ``BATCH`` requests first, and each build first reduces
the requests that have finished since to what the summary reads (``compact``: their prompts
and outputs back to stand-ins, their token times packed). Iterating it reads the
requests as they are and builds nothing (the run's set-up and its summary iterate, and read
only lengths and times). Where the process may use more than one CPU, the batch after the one
just built is built meanwhile in the run's builder thread (``Builder``), on copies of its
drafts (``Ahead``), and taken when the loop reaches it: the native builders release the GIL, so
the run goes on while its next prompts are written.

A prompt is its trace line's whichever requests are built with it (``traces._fill_mooncake``),
so a deferred run schedules exactly the tokens an eager one does: the same results, bit for
bit (``tests/test_deferred_prompts.py``).
"""

from __future__ import annotations

import itertools
import operator
import threading
import weakref
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from radixsched.native import core
from radixsched.request import Req, TokenArray
from radixsched.sim.workloads.prompt_cache import gib_setting
from radixsched.sim.workloads.tokens import _NO_TOKENS, _Draft, build_alone, usable_cpus

if TYPE_CHECKING:
    import queue

BATCH = 256  # requests whose prompts are built together (the trace reader's batch)
DEFAULT_EAGER_GB = 2.0
_ZERO = np.zeros(1, dtype=np.int32)
# Stand-ins up to this length are slices of one broadcast (a slice is ~30x cheaper to make than
# a broadcast, and keeps its stride 0 and its read-only flag); longer ones are broadcast anew.
_STAND_INS = np.broadcast_to(_ZERO, (1 << 24,))


def stand_in(n: int) -> TokenArray:
    """A read-only int32 array of length ``n`` holding no memory of its own (stride 0)."""
    return _STAND_INS[:n] if n <= len(_STAND_INS) else np.broadcast_to(_ZERO, (n,))


# Stand-ins by length, each shared by every request that holds one of that length (finished
# requests' prompts and outputs, a deferred load's prompts): read-only, so one serves all.
_SHARED: dict[int, TokenArray] = {}


def shared_stand_in(n: int) -> TokenArray:
    """``stand_in(n)``, one array for every caller (``_SHARED``)."""
    s = _SHARED.get(n)
    if s is None:
        s = _SHARED[n] = stand_in(n)
    return s


def is_stand_in(prompt: TokenArray) -> bool:
    return len(prompt) > 1 and prompt.strides == (0,)


def eager_limit_bytes() -> int:
    """Prompt bytes above which a trace's prompts are deferred: ``$RADIXSCHED_EAGER_PROMPTS_GB``
    GiB (unset or not a size: ``DEFAULT_EAGER_GB``)."""
    return gib_setting("RADIXSCHED_EAGER_PROMPTS_GB", DEFAULT_EAGER_GB)


_FILL = operator.attrgetter("fill")
_LENGTH = operator.attrgetter("length")


def should_defer(drafts: Sequence[_Draft]) -> bool:
    """Whether these drafts' prompts are deferred: every one is still to build (a trace whose
    prompts come from its lines) and together they exceed ``eager_limit_bytes``."""
    if not drafts or None in map(_FILL, drafts):
        return False
    return 4 * sum(map(_LENGTH, drafts)) > eager_limit_bytes()


def build_prompts(drafts: Sequence[_Draft]) -> list[TokenArray]:
    """The prompts of ``drafts`` (in order). ``fill`` writes each into its draft's ``prompt``
    (into the array there when it has the prompt's length): each draft's is set aside for the
    build, which then allocates the prompt, and put back after, so the drafts keep their
    sources and each run of a command builds them again (as on copies of the drafts, without
    making any)."""
    held = [d.prompt for d in drafts]
    pending: dict[Any, list[_Draft]] = {}
    try:
        for d in drafts:
            assert d.fill is not None  # should_defer: every draft is deferred
            d.prompt = _NO_TOKENS
            pending.setdefault(d.fill, []).append(d)
        for fill, group in pending.items():
            fill(group)
        built = [d.prompt for d in drafts]
    finally:
        for d, p in zip(drafts, held, strict=True):
            d.prompt = p
    for p in built:
        p.flags.writeable = False  # as the prompt cache's views: never written
    return built


class Builder:
    """The thread that builds a run's batches ahead (``Ahead``), in the order handed to it,
    building alone (``tokens.build_alone``). One thread a run, not one a batch: a thread's
    start waits until it runs (390 starts for 100k requests). It ends after the batches handed
    to it before ``close``: once every batch is built, or when the run's requests are freed
    first (a thread still running at exit would cost the process its fast exit,
    ``cli.main.exit_now``)."""

    def __init__(self) -> None:
        import queue  # (here: a run that builds nothing ahead never imports it)

        self._jobs: queue.SimpleQueue[Ahead | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        build_alone()
        while (job := self._jobs.get()) is not None:
            job.run()

    def submit(self, job: Ahead) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class Ahead:
    """``build_prompts`` of copies of ``drafts`` (requests ``lo`` to ``hi``), run by ``builder``
    in its thread. The copies share only what a build reads (each draft's source): nothing the
    run's thread touches is written."""

    def __init__(self, lo: int, hi: int, drafts: Sequence[_Draft], builder: Builder) -> None:
        self.lo, self.hi = lo, hi
        self._drafts = build_copies(drafts)
        self._built: list[TokenArray] | None = None
        self._failed: BaseException | None = None
        self._done = threading.Event()
        builder.submit(self)

    def run(self) -> None:
        """The build (the builder's thread)."""
        try:
            self._built = build_prompts(self._drafts)
        except BaseException as e:  # raised in the run's thread when it takes the batch
            self._failed = e
        finally:
            self._done.set()

    def take(self) -> list[TokenArray]:
        """The prompts, once built (the build's exception, re-raised here)."""
        self._done.wait()
        if self._failed is not None:
            raise self._failed
        assert self._built is not None
        return self._built


def build_copy(d: _Draft) -> _Draft:
    """A copy of what ``build_prompts`` and each ``fill`` read of ``d`` (its prompt, fill,
    source, session and length; its output length, required), the other fields left at their
    defaults: a build writes only the copy's ``prompt``. A tenth of ``copy.copy``'s cost."""
    return _Draft(d.prompt, d.output_len, d.session, fill=d.fill, source=d.source, length=d.length)


# What ``build_copy`` copies of a draft, and the draft each copy starts from (every other field
# at its default, shared: each one immutable, ``tests/test_deferred_prompts.py``).
_COPIED = ("prompt", "output_len", "session", "fill", "source", "length")
_DRAFT_LIKE = _Draft(_NO_TOKENS, 0, 0)


def build_copies(drafts: Sequence[_Draft]) -> list[_Draft]:
    """``[build_copy(d) for d in drafts]``, copied natively where the core can
    (``_core.copy_slots``: copies of ``_DRAFT_LIKE`` with each draft's ``_COPIED`` fields,
    a fifth of the constructor's cost)."""
    copy = getattr(core(), "copy_slots", None)
    copies: list[_Draft] | None = None if copy is None else copy(_DRAFT_LIKE, list(drafts), _COPIED)
    return [build_copy(d) for d in drafts] if copies is None else copies


class ArrivingRequests(Sequence[Req]):
    """A run's requests (arrival order) whose prompts are built as the loop reaches them (see
    the module). ``drafts[i]`` builds ``reqs[i]``'s prompt."""

    def __init__(self, reqs: list[Req], drafts: Sequence[_Draft], batch: int | None = None) -> None:
        assert len(reqs) == len(drafts)
        self._reqs, self._drafts = reqs, drafts
        self._batch = max(BATCH if batch is None else batch, 1)
        self._built = 0  # reqs[:_built] have had their prompts built (and maybe dropped since)
        self._live: list[Req] = []  # built requests whose prompts are still held
        self._ahead: Ahead | None = None  # the next batch, building beside the run
        self._prefetch = usable_cpus() > 1
        self._builder: Builder | None = None  # started with the first batch built ahead

    def __len__(self) -> int:
        return len(self._reqs)

    @overload
    def __getitem__(self, i: int) -> Req: ...
    @overload
    def __getitem__(self, i: slice) -> list[Req]: ...
    def __getitem__(self, i: int | slice) -> Req | list[Req]:
        if isinstance(i, slice):
            return self._reqs[i]
        if i < 0:
            i += len(self._reqs)
        if i >= self._built:
            self._build_through(i)
        return self._reqs[i]

    def __iter__(self) -> Iterator[Req]:
        return iter(self._reqs)

    def through(self, i: int, j: int) -> list[Req]:
        """``self[j - 1]`` (the prompts through it built), then ``self[i:j]``, in one call
        (``0 <= i < j <= len(self)``: the open loop's deliveries)."""
        if j > self._built:
            self._build_through(j - 1)
        return self._reqs[i:j]

    @property
    def live(self) -> int:
        """Requests whose prompts are held now."""
        return len(self._live)

    def _build_through(self, i: int) -> None:
        """Build the batches up to the one holding ``i``, after dropping finished prompts;
        then start building the next one beside the run (more than one CPU)."""
        self.release_finished()
        while self._built <= i:
            lo, hi = self._built, min(self._built + self._batch, len(self._reqs))
            for r, p in zip(self._reqs[lo:hi], self._prompts(lo, hi), strict=True):
                r.prompt_ids = p
                self._live.append(r)
            self._built = hi
        lo = self._built
        hi = min(lo + self._batch, len(self._reqs))
        if self._prefetch and lo < hi:
            builder = self._builder or self._start_builder()
            self._ahead = Ahead(lo, hi, self._drafts[lo:hi], builder)
        elif lo == len(self._reqs) and self._builder is not None:
            self._builder.close()  # every batch built (however reached): the thread ends
            self._builder = None

    def _start_builder(self) -> Builder:
        """The run's ``Builder``, which also ends when these requests are freed first."""
        self._builder = Builder()
        weakref.finalize(self, self._builder.close)
        return self._builder

    def _prompts(self, lo: int, hi: int) -> list[TokenArray]:
        """The prompts of requests ``lo`` to ``hi``: built ahead, else now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (ahead.lo, ahead.hi) == (lo, hi):
            return ahead.take()
        return build_prompts(self._drafts[lo:hi])

    def release_finished(self) -> None:
        """Reduce each finished request to what the summary reads (``compact``)."""
        keep: list[Req] = []
        done: list[Req] = []
        for r in self._live:
            (keep if r.finish is None else done).append(r)
        compact(done)
        self._live = keep


def compact(reqs: Sequence[Req]) -> None:
    """Finished requests reduced to the numbers the summary reads: each one's prompt and output
    become stand-ins of their lengths (``shared_stand_in``: the summary counts tokens, never
    reads them) and its
    token times a float64 ``array`` (8 bytes a token, not a list's 32: the gaps between tokens
    are the summary's inter-token latencies; ``packed_times``). The scheduler is done with
    them: a finished request is never scheduled again. The native core does it in one pass
    (``_core.compact_requests``: the same objects and values, each request's freed in turn)."""
    native = getattr(core(), "compact_requests", None)
    if native is not None:
        native(list(reqs), _SHARED, shared_stand_in, _ONE_FLOAT)
        return
    times = packed_times([r.times.token_times for r in reqs])
    shared = _SHARED.get  # ``shared_stand_in``, its call only on a length's first
    for r, packed in zip(reqs, times, strict=True):
        n = len(r.prompt_ids)
        s = shared(n)
        r.prompt_ids = shared_stand_in(n) if s is None else s
        n = len(r.output_ids)
        s = shared(n)
        r.output_ids = shared_stand_in(n) if s is None else s  # type: ignore[assignment]
        r.times.token_times = packed  # type: ignore[assignment]


_ONE_FLOAT = array("d", [0.0])  # ``pack_times``' prototype: ``_ONE_FLOAT * n``, n zeros


def packed_times(seqs: Sequence[Sequence[float]]) -> list[array[float]]:
    """Each of ``seqs`` as an ``array('d')`` of the same floats. Lists of floats are packed
    natively (``pack_times``: each array made at its size and written in place, a tenth of
    the cost of ``array('d', seq)``), else read natively into one buffer (``join_floats``, a
    core built before ``pack_times``), each array then made from its bytes; ``array('d',
    seq)`` serves without the core or where an item is not exactly a float (both say so)."""
    mod = core()
    if mod is None:
        return [array("d", s) for s in seqs]
    pack = getattr(mod, "pack_times", None)
    if pack is not None:
        packed: list[array[float]] | None = pack(list(seqs), _ONE_FLOAT)
        return [array("d", s) for s in seqs] if packed is None else packed
    lens = [len(s) for s in seqs]
    joined = np.empty(sum(lens), dtype=np.float64)
    if not mod.join_floats(seqs, joined):
        return [array("d", s) for s in seqs]
    raw = joined.tobytes()
    ends = itertools.accumulate(8 * n for n in lens)  # each sequence's end in ``raw``
    return [array("d", raw[end - 8 * n : end]) for end, n in zip(ends, lens, strict=True)]
