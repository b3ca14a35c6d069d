"""Token derivation shared by every workload: deterministic 64-bit keys, hashed token streams,
per-block tokens, and the drafts (prompt lengths and token sources) a builder returns."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from radixsched.request import TokenArray
from radixsched.sim.cost.splitmix import _splitmix64_inplace, splitmix64

DEFAULT_VOCAB = 128_000
U64 = npt.NDArray[np.uint64]
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Salts keep token streams of different origins apart.
_SALT_BLOCK, _SALT_PAD, _SALT_GROUP, _SALT_UNIQUE = 0x1B, 0x2C, 0x3D, 0x4E


# Limits that keep a load within memory and the simulated clock exact: one prompt (or one
# generated length param) at most 2^24 tokens (above every context window served: 10M); a
# generated workload at most 10M requests and 2^31 tokens (8 GiB of int32); arrivals within
# 1e9 s (31 years) of the first, where a float64 clock still resolves 0.2 microseconds.
MAX_PROMPT_TOKENS = 1 << 24
MAX_GENERATED_REQUESTS = 10_000_000
MAX_GENERATED_TOKENS = 1 << 31
MAX_ARRIVAL_S = 1e9
_INT64 = 1 << 63


class WorkloadError(ValueError):
    """Bad workload input; the message names the file, line and field (or the bad param)."""


# ---- hashed tokens -----------------------------------------------------------------------


def _key(*parts: int) -> int:
    """A 64-bit key from integers (Python ints: no uint64 scalar overflow warnings)."""
    k = 0
    for p in parts:
        k = ((k ^ (p & _MASK)) * _GOLDEN + 0x632BE59BD9B4E019) & _MASK
    return k


def _keys_after(first: int, parts: list[int]) -> list[int]:
    """``[_key(first, p) for p in parts]``, a column at once: numpy's uint64 arithmetic wraps
    as ``& _MASK`` does. Parts outside [0, 2^64) (no uint64: an ``OverflowError``) take
    ``_key`` one by one."""
    try:
        column = np.array(parts, dtype=np.uint64)
    except OverflowError:
        return [_key(first, p) for p in parts]
    keys = (column ^ np.uint64(_key(first))) * np.uint64(_GOLDEN) + np.uint64(0x632BE59BD9B4E019)
    out: list[int] = keys.tolist()
    return out


def _str_key(text: str) -> int:
    return _key(*text.encode())


def _hash_tokens(
    key: int, start: int, n: int, vocab: int, out: TokenArray | None = None
) -> TokenArray:
    """Tokens ``hash(key, position) mod vocab`` for positions ``start .. start+n`` (written
    into ``out`` when given): by the native core where it takes the shape (``_native_hash``),
    else by numpy (``_hash_tokens_numpy``); the same tokens."""
    out = np.empty(n, dtype=np.int32) if out is None else out
    native = _native_hash(vocab)
    if native is None or out.dtype != np.int32 or not out.flags.c_contiguous or n != len(out):
        return _hash_tokens_numpy(key, start, n, vocab, out)
    native(out, key & _MASK, start, vocab)
    return out


def _native_hash(vocab: int) -> Callable[..., None] | None:
    """The native core's ``hash_tokens`` (``_native/prompts.hpp``), or None: no native core
    (or one built before it), or a vocabulary it does not take."""
    if not 1 <= vocab < _INT64:
        return None
    from radixsched.native import core

    fn = getattr(core(), "hash_tokens", None)
    return None if fn is None else cast(Callable[..., None], fn)


def _hash_tokens_numpy(key: int, start: int, n: int, vocab: int, out: TokenArray) -> TokenArray:
    """``_hash_tokens`` in numpy (the reference of the native builder)."""
    z = np.arange(start, start + n, dtype=np.uint64)
    np.multiply(z, np.uint64(_GOLDEN), out=z)
    np.bitwise_xor(z, np.uint64(key), out=z)
    _splitmix64_inplace(z)
    _mod_into(z, vocab, out)
    return out


def _mod_into(z: npt.NDArray[np.uint64], vocab: int, out: TokenArray) -> None:
    """``out[...] = z % vocab``, clobbering ``z``. Written as ``z - (z // vocab) * vocab``
    (exact on unsigned integers): numpy divides by a scalar with a precomputed reciprocal,
    while its remainder divides element by element, three times slower."""
    v = np.uint64(vocab)
    q = np.floor_divide(z, v)
    np.multiply(q, v, out=q)
    np.subtract(z, q, out=z)
    out[...] = z


def _block_table(ids: npt.NDArray[np.int64], block: int, vocab: int) -> TokenArray:
    """Row i: the ``block`` tokens of block id ``ids[i]``, ``splitmix64(splitmix64(id ^ salt) ^
    position * golden) mod vocab``, computed in place on cache-sized chunks."""
    table = np.empty((len(ids), block), dtype=np.int32)
    pos = np.arange(block, dtype=np.uint64) * np.uint64(_GOLDEN)
    salt = np.uint64(_key(_SALT_BLOCK))
    rows = max(1, (1 << 17) // max(block, 1))  # about 1 MB of uint64 per chunk
    mixed = np.empty((rows, block), dtype=np.uint64)
    for lo in range(0, len(ids), rows):
        chunk = splitmix64(ids[lo : lo + rows].astype(np.uint64) ^ salt)
        z = mixed[: len(chunk)]
        np.bitwise_xor(chunk[:, None], pos[None, :], out=z)
        _splitmix64_inplace(z)
        _mod_into(z, vocab, table[lo : lo + len(chunk)])
    return table


@dataclass(slots=True)  # one a trace line: a million of them
class _Draft:
    """One request before arrival times and ids are assigned."""

    prompt: TokenArray
    output_len: int
    session: int  # requests of one session keep their offsets when arrivals are drawn
    offset_s: float = 0.0
    timestamp_s: float | None = None
    scripted: TokenArray | None = None
    priority: int | None = None
    routing_key: str | None = None
    tenant: str | None = None
    extra_key: str | None = None
    # A prompt built only for the requests the load keeps (``--num-requests``): ``fill``
    # writes ``prompt`` for a list of such drafts; ``prompt`` is empty until it has run.
    fill: Callable[[Sequence[_Draft]], None] | None = None
    source: Any = None  # what ``fill`` builds this draft's prompt from
    length: int = 0  # the deferred prompt's length; ``fill`` writes into ``prompt`` when it
    # already has that length (a buffer the prompt cache maps), else it allocates one


# ``_Draft``'s fields, in order: ``traces._build_mooncake`` passes them positionally.
DRAFT_FIELDS = (
    "prompt", "output_len", "session", "offset_s", "timestamp_s", "scripted", "priority",
    "routing_key", "tenant", "extra_key", "fill", "source", "length",
)  # fmt: skip

Builder = Callable[[dict[str, Any], int], list[_Draft]]


def _fill_prompts(drafts: Sequence[_Draft]) -> None:
    """Build the deferred prompts of ``drafts`` (in their order), once each."""
    pending: dict[Any, list[_Draft]] = {}
    for d in drafts:
        if d.fill is not None:
            pending.setdefault(d.fill, []).append(d)
    for fill, ds in pending.items():
        fill(ds)
        for d in ds:
            d.fill = d.source = None


_NO_TOKENS: TokenArray = np.zeros(0, dtype=np.int32)

# Prompts are built in threads when there are this many tokens or more per thread (4 MB of
# int32): the native builders release the GIL, and most of a fresh prompt's cost is the kernel
# faulting in its pages, which threads take in parallel. At most this many threads.
THREAD_MIN_TOKENS = 1 << 20
MAX_THREADS = 8


# A thread that builds prompts beside the run (``deferred``'s next batch) builds them alone:
# the run keeps the other CPUs.
_ALONE = threading.local()


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_alone() -> None:
    """This thread's prompt builds use no other thread (``build_threads`` is 1 here)."""
    _ALONE.on = True


def build_threads(tokens: int) -> int:
    """How many threads build ``tokens`` tokens of prompts: one per ``THREAD_MIN_TOKENS``, no
    more than the CPUs this process may run on, nor ``MAX_THREADS``; at least one (only one
    in a thread that builds alone: ``build_alone``)."""
    if getattr(_ALONE, "on", False):
        return 1
    return max(1, min(usable_cpus(), MAX_THREADS, tokens // THREAD_MIN_TOKENS))


def _each_in_threads(drafts: Sequence[_Draft], build: Callable[[_Draft], None]) -> None:
    """``build(d)`` for every draft, the list cut into ``build_threads`` runs of about equal
    tokens (``length``), each run in its own thread (the first in this one). Each draft's
    prompt is its own: the order they are built in changes no token. An exception is raised
    after every thread has stopped, the first run's that failed."""

    def run(lo: int, hi: int) -> None:
        for d in drafts[lo:hi]:
            build(d)

    _runs_in_threads([d.length for d in drafts], run)


def _runs_in_threads(lengths: list[int], run: Callable[[int, int], None]) -> None:
    """``run(lo, hi)`` over ``build_threads`` consecutive runs of items of about equal total
    ``lengths``, each in its own thread (the first in this one); the first failure raised
    after every thread has stopped."""
    bounds = _runs(lengths, build_threads(sum(lengths)))
    failed: list[BaseException | None] = [None] * (len(bounds) - 1)

    def one(k: int) -> None:
        try:
            run(bounds[k], bounds[k + 1])
        except BaseException as e:  # re-raised by the caller's thread below
            failed[k] = e

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(1, len(failed))]
    for t in threads:
        t.start()
    one(0)
    for t in threads:
        t.join()
    for e in failed:
        if e is not None:
            raise e


def _runs(lengths: list[int], n: int) -> list[int]:
    """Bounds ``0 = b0 <= b1 <= ... <= bn = len(lengths)`` cutting ``lengths`` into ``n``
    consecutive runs of about equal sums."""
    total, at, acc, bounds = sum(lengths), 0, 0, [0]
    for k in range(1, n):
        while at < len(lengths) and acc + lengths[at] <= total * k // n:
            acc += lengths[at]
            at += 1
        bounds.append(at)
    bounds.append(len(lengths))
    return bounds


# ---- generators --------------------------------------------------------------------------


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0x70CE])  # token stream (arrivals use another)


def _randint(rng: np.random.Generator, n: int, vocab: int) -> TokenArray:
    return rng.integers(0, vocab, size=n, dtype=np.int32)


def _shuffled(drafts: list[_Draft], rng: np.random.Generator, shuffle: bool) -> list[_Draft]:
    if not shuffle:
        return drafts
    order = rng.permutation(len(drafts))
    out = [drafts[i] for i in order]
    for i, d in enumerate(out):
        d.session = i
    return out
