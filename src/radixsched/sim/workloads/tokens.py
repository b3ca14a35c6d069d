"""Token derivation shared by every workload: deterministic 64-bit keys, hashed token streams,
per-block tokens, and the drafts (prompt lengths and token sources) a builder returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


def _str_key(text: str) -> int:
    return _key(*text.encode())


def _hash_tokens(
    key: int, start: int, n: int, vocab: int, out: TokenArray | None = None
) -> TokenArray:
    """Tokens ``hash(key, position) mod vocab`` for positions ``start .. start+n`` (written
    into ``out`` when given)."""
    out = np.empty(n, dtype=np.int32) if out is None else out
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
