"""Workloads for the simulator: trace readers and generators, selected by a spec string.

Spec strings
------------
``name:k=v,k=v`` (generators; ``name`` alone takes every default) or ``name:PATH`` (trace
readers; ``name:path=PATH,k=v`` also sets reader params). ``describe_workloads()`` lists every
name and param; ``load_workload(spec, request_rate=..., num_requests=..., seed=...)`` builds one.
Every request gets ``SamplingParams(max_new_tokens=output_len, ignore_eos=True)`` and a prompt
as a compact int32 array (one array per request, never one Python object per token).

Trace readers
-------------
``mooncake:PATH`` reads the Mooncake trace format (FAST'25 release): one JSON object a line
with ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``, one id per
512-token block. An id stands for its whole prefix, so each id becomes a fixed block of tokens
(``hash(id, position) mod vocab``): requests whose id lists start alike share exactly those
blocks. The last block is cut to ``input_length``; prompt positions beyond
``len(hash_ids) * 512`` get request-unique tokens. A block that several prompts use
is generated once into a table (vectorised); the others are generated with the rest of their
batch of 256 requests, and each prompt is gathered from its batch's rows. Memory is therefore
the prompts themselves, 4 bytes a token (the 3,993-request synthetic trace: 61M tokens, 245 MB),
plus the shared blocks' table while loading.
Params: ``vocab`` (128000), ``block_size`` (512).

``jsonl:PATH`` reads radixsched's own format, one JSON object a line (unknown fields are an
error, so typos cannot pass silently):

- prompt, exactly one of: ``input_ids`` (list of token ids), or ``input_length`` (tokens)
  with optional ``prefix_group`` (string or integer id) and ``prefix_length`` (the first
  ``prefix_length`` tokens are the group's shared prefix; required with ``prefix_group``).
  Group prefixes are ``hash(group, position) mod vocab``, so two requests of a group share
  ``min`` of their prefix lengths; the rest of the prompt is request-unique.
- ``output_length``: tokens to generate (defaults to ``len(output_ids)`` when that is given).
- ``output_ids``: scripted output tokens (the simulated model returns them in order).
- arrival, on every line or on none: ``arrival_time`` (seconds) or ``timestamp`` (ms).
- ``priority`` (integer), ``routing_key``, ``tenant``, ``extra_key`` (strings).
Params: ``vocab`` (128000) for generated prompt tokens.

Trace arrivals are shifted so that the earliest request arrives at t=0. Trace prompts depend
only on the file, never on the seed.

Generators (deterministic from the seed)
----------------------------------------
- ``shared-prefix``: ``groups`` groups of ``prompts`` requests; a request is its group's
  ``system_len``-token system prompt plus a ``question_len``-token question; ``shuffle``
  (default on) interleaves the groups in arrival order.
- ``multi-turn``: ``conversations`` chats of ``turns`` turns. Turn 1 is ``first_len`` tokens;
  turn k+1's prompt is turn k's prompt, turn k's (scripted) output and ``turn_len`` new
  tokens. Turn k arrives ``(k-1) * think_time_s`` after its conversation starts.
- ``tree-of-thought``: ``trees`` trees of ``depth`` levels with ``branching`` children per
  node. The root prompt is ``root_len`` tokens; a child's prompt is its parent's prompt, the
  parent's scripted output and ``step_len`` new tokens. Level l arrives
  ``l * think_time_s`` after the tree starts.
- ``few-shot``: ``questions`` MMLU-style questions over ``num_subjects`` subjects; each
  subject has ``shots`` examples of ``shot_len`` tokens shared by all its questions, followed
  by a ``question_len``-token question; ``shuffle`` as above.
Every generator takes ``output_len`` and ``vocab``.

Arrivals
--------
``request_rate=None``: trace timestamps where the workload has them, else ``default_rate``
(None: all at t=0).
``request_rate=inf``: all at t=0. A finite rate: Poisson arrivals (seeded, the first at t=0).
Multi-turn conversations and thought trees are sessions: the arrival process places session
starts (at ``request_rate`` divided by the mean requests per session, so the long-run request
rate is ``request_rate``) and later turns/levels keep their offsets. This is an open-loop
approximation: a turn may arrive before the previous one finished. ``num_requests`` keeps the
first N requests in arrival order.

Optimal hit rate
----------------
``optimal_hit_rate(reqs, page_size)``: an infinite cache in which every earlier request's
KV (prompt plus scripted output but its last token, which is never fed back) is present. Per
request in arrival order: the longest common prefix with any earlier request in the same
namespace, capped at ``prompt_len - 1`` (one token is always computed), rounded down to whole
pages; summed over requests and divided by all prompt tokens. Exact: the sequences go into a
radix tree of their own (``sim.optimal``). ``mooncake_block_hit_rate(path)`` is
the Mooncake README's block-level figure instead (leading ids already seen x 512, capped at
``input_length``, no ``-1`` cap): 65.1% on the synthetic trace."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from radixsched.request import Req, SamplingParams, TokenArray
from radixsched.sim.cost.splitmix import _splitmix64_inplace, splitmix64
from radixsched.sim.workloads import prompt_cache

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


@dataclass
class Workload:
    name: str
    params: dict[str, Any]
    requests: list[Req]  # sorted by arrival time
    has_timestamps: bool
    tenants: tuple[str, ...] | None = None
    arrivals: str = ""  # how arrival times were set, for reports
    prompts: str = "built"  # where the prompts came from (``PROMPT_SOURCES``), for reports
    # The prompt cache's key when the prompts are read-only views of its file (so they cannot
    # change in place: a request's prompt is its trace line's, whatever the run did since).
    prompt_key: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.sampling.max_new_tokens for r in self.requests)

    @property
    def params_text(self) -> str:
        """The params as a spec writes them: ``groups=256, prompts=8, ...``."""
        kind = WORKLOADS.get(self.name)
        if kind is None:
            return ", ".join(f"{k}={_fmt_param(v)}" for k, v in self.params.items())
        return describe_params(kind, self.params)

    def summary(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "params": dict(self.params),
            "requests": len(self.requests),
            "prompt_tokens": self.num_prompt_tokens,
            "output_tokens": self.num_output_tokens,
            "arrivals": self.arrivals,
            "last_arrival_s": self.requests[-1].arrival_time if self.requests else 0.0,
        }


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


# ---- params and the registry ----------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = 1  # inclusive lower bound for numbers (None: unchecked)
    maximum: float | None = None  # inclusive upper bound for numbers (None: unchecked)

    def parse(self, workload: str, text: str) -> Any:
        where = f"workload {workload}: param {self.name!r}"
        value: Any
        if self.type is bool:
            low = text.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise WorkloadError(f"{where}: expected a boolean (true/false), got {text!r}")
            value = low in ("1", "true", "yes", "on")
        elif self.type is int:
            try:
                value = int(text)
            except ValueError:
                raise WorkloadError(f"{where}: expected an integer, got {text!r}") from None
        elif self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise WorkloadError(f"{where}: expected a number, got {text!r}") from None
            if not math.isfinite(value):
                raise WorkloadError(f"{where}: expected a finite number, got {text!r}")
        else:
            value = text
        if self.minimum is not None and self.type in (int, float) and value < self.minimum:
            raise WorkloadError(f"{where}: must be >= {self.minimum:g}, got {text!r}")
        if self.maximum is not None and self.type in (int, float) and value > self.maximum:
            raise WorkloadError(f"{where}: must be <= {self.maximum:,.0f}, got {text!r}")
        return value


@dataclass
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


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    help: str
    params: tuple[Param, ...]
    build: Builder
    is_trace: bool = False  # takes a file path as its argument
    # A generator's (requests, tokens) for its params, checked against the limits before it runs.
    size: Callable[[Mapping[str, Any]], tuple[int, int]] | None = None

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


_VOCAB = Param(
    "vocab", int, DEFAULT_VOCAB, "token ids are drawn from [0, vocab)", minimum=2, maximum=2**31
)
_PATH = Param("path", str, None, "trace file")


# ---- trace readers ---------------------------------------------------------------------


# Compressed traces, by file suffix: gzip from the standard library; zstandard from the
# ``zstandard`` package (or the standard library's ``compression.zstd`` from Python 3.14).
COMPRESSED_SUFFIXES = (".gz", ".zst")


def _open_zstd(path: Path) -> BinaryIO:
    try:
        from compression import zstd  # Python >= 3.14

        return cast(BinaryIO, zstd.open(path, "rb"))
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise WorkloadError(
            f"{path}: reading .zst traces needs the zstandard package "
            "(pip install zstandard, or radixsched[traces])"
        ) from None
    reader = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
    return cast(BinaryIO, io.BufferedReader(reader))  # the reader itself has no readline


def open_trace(path: Path) -> BinaryIO:
    """The trace's bytes, decompressed by suffix (``.gz``, ``.zst``); ``WorkloadError`` with
    a one-line reason when the file cannot be opened."""
    try:
        if path.suffix == ".gz":
            return cast(BinaryIO, gzip.open(path, "rb"))
        if path.suffix == ".zst":
            return _open_zstd(path)
        return path.open("rb")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)``; decompression and read errors become one line."""
    f = open_trace(path)
    with f:
        i = 0
        try:
            for i, raw in enumerate(f, 1):
                yield i, raw
        except (OSError, EOFError, ValueError) as exc:
            what = "gzip" if path.suffix == ".gz" else "zstd" if path.suffix == ".zst" else "file"
            raise WorkloadError(f"{path}:{i + 1}: cannot read the {what} data: {exc}") from None


def _json_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file:line, object)`` for every non-blank line (UTF-8 JSON, one object a line)."""
    for i, raw in _lines(path):
        where = f"{path}:{i}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkloadError(
                f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                f"{exc.start + 1}); traces are UTF-8 JSON lines"
            ) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj


def check_trace(path: str | Path) -> None:
    """Fail now, in one line, if the trace cannot be opened and its first line read (the
    early check of the CLI; the whole file is validated when it is loaded)."""
    for _ in _lines(Path(path)):
        break


def _bad(where: str, name: str, expected: str, value: Any) -> WorkloadError:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return WorkloadError(f"{where}: field {name!r}: expected {expected}, got {text}")


def _pos_int(obj: dict[str, Any], name: str, where: str, maximum: int | None = None) -> int:
    v = obj.get(name)
    if v is None:
        raise WorkloadError(f"{where}: missing field {name!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _bad(where, name, "a positive integer", v)
    if maximum is not None and v > maximum:
        raise _bad(where, name, f"at most {maximum:,} tokens", v)
    return v


def _nonneg_number(obj: dict[str, Any], name: str, where: str) -> float:
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(where, name, "a non-negative number", v)
    try:
        number = float(v)
    except OverflowError:  # an integer beyond float's range
        raise _bad(where, name, "a non-negative number below 1e308", v) from None
    if not math.isfinite(number) or number < 0:
        raise _bad(where, name, "a non-negative number", v)
    return number


def _int_list(obj: dict[str, Any], name: str, where: str, *, nonempty: bool) -> TokenArray:
    v = obj[name]
    if not isinstance(v, list) or (nonempty and not v):
        raise _bad(where, name, "a non-empty list of token ids" if nonempty else "a list", v)
    arr = np.asarray(v) if v else np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise _bad(where, name, "a list of non-negative integers", _clip(v))
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 2**31):
        raise _bad(where, name, "integers in [0, 2^31)", _clip(v))
    return arr.astype(np.int32)


def _clip(v: list[Any]) -> str:
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _opt_str(obj: dict[str, Any], name: str, where: str) -> str | None:
    v = obj.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _bad(where, name, "a string", v)
    return v


@dataclass
class _MooncakeRecord:
    where: str
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: npt.NDArray[np.int64]  # only the ids the prompt uses


def _mooncake_records(path: Path, block: int) -> list[_MooncakeRecord]:
    out = []
    for where, obj in _json_lines(path):
        for name in ("timestamp", "input_length", "output_length", "hash_ids"):
            if name not in obj:
                raise WorkloadError(f"{where}: missing field {name!r}")
        ts = _nonneg_number(obj, "timestamp", where)
        n = _pos_int(obj, "input_length", where, MAX_PROMPT_TOKENS)
        o = _pos_int(obj, "output_length", where)
        ids = _int_list(obj, "hash_ids", where, nonempty=False).astype(np.int64)
        out.append(_MooncakeRecord(where, ts, n, o, ids[: -(-n // block)]))
    if not out:
        raise WorkloadError(f"{path}: no requests")
    t0 = min(r.timestamp_ms for r in out)
    late = next((r for r in out if (r.timestamp_ms - t0) / 1e3 > MAX_ARRIVAL_S), None)
    if late is not None:
        raise _late(late.where, "timestamp", late.timestamp_ms, (late.timestamp_ms - t0) / 1e3)
    return out


def _late(where: str, name: str, value: float, after_s: float) -> WorkloadError:
    return WorkloadError(
        f"{where}: field {name!r}: {value:g} is {after_s:.3g} s after the first request, "
        f"beyond the {MAX_ARRIVAL_S:.0e} s a trace may span (the simulated clock would lose "
        "its microseconds)"
    )


_BATCH = 256  # requests whose own blocks are generated together


def _build_mooncake(p: dict[str, Any], seed: int) -> list[_Draft]:
    """The trace's requests, their prompts deferred: only those the load keeps are built
    (``_fill_mooncake``)."""
    block, vocab = p["block_size"], p["vocab"]
    records = _mooncake_records(Path(p["path"]), block)
    t0 = min(r.timestamp_ms for r in records)

    def fill(drafts: Sequence[_Draft]) -> None:
        _fill_mooncake(drafts, block, vocab)

    return [
        _Draft(
            _NO_TOKENS,
            r.output_length,
            i,
            timestamp_s=(r.timestamp_ms - t0) / 1e3,
            fill=fill,
            source=r,
            length=r.input_length,
        )
        for i, r in enumerate(records)
    ]


_NO_TOKENS: TokenArray = np.zeros(0, dtype=np.int32)


def _fill_mooncake(drafts: Sequence[_Draft], block: int, vocab: int) -> None:
    """Blocks that several of these prompts use are generated once, into the head of one
    table; the blocks only one prompt uses are generated a batch of requests at a time into
    its tail, so the table (the load's peak memory beside the prompts) holds the shared blocks
    and one batch's own. A block's tokens depend on its id only, a short id list's padding on
    the request's line: the same prompts whichever requests are built together."""
    records: list[_MooncakeRecord] = [d.source for d in drafts]
    distinct, uses = np.unique(np.concatenate([r.hash_ids for r in records]), return_counts=True)
    shared = distinct[uses > 1]
    batches = [
        list(range(lo, min(lo + _BATCH, len(drafts)))) for lo in range(0, len(drafts), _BATCH)
    ]
    tail = max((sum(len(records[j].hash_ids) for j in b) for b in batches), default=0)
    table = np.empty((len(shared) + tail, block), dtype=np.int32)
    table[: len(shared)] = _block_table(shared, block, vocab)
    for batch in batches:
        recs = [records[j] for j in batch]
        for j, rows in zip(batch, _rows(recs, shared, table, vocab), strict=True):
            d = drafts[j]
            d.prompt = _gather(table, rows, _out(d), d.session, vocab)


def _out(d: _Draft) -> TokenArray:
    """The buffer ``d``'s prompt is built in: the one the prompt cache lent, else a new one."""
    return d.prompt if len(d.prompt) == d.length else np.empty(d.length, dtype=np.int32)


def _gather(
    table: TokenArray, rows: npt.NDArray[np.int64], out: TokenArray, line: int, vocab: int
) -> TokenArray:
    """``out`` filled with the blocks at ``rows`` of ``table``, cut to its length (the last
    block may be partial), then the request's own padding past the last block."""
    n, block = len(out), table.shape[1]
    full = min(len(rows), n // block)
    np.take(table, rows[:full], axis=0, out=out[: full * block].reshape(full, block))
    at = full * block
    if full < len(rows):  # the last block, cut to the prompt's length
        m = min(block, n - at)
        out[at : at + m] = table[rows[full], :m]
        at += m
    if at < n:
        _hash_tokens(_key(_SALT_PAD, line), at, n - at, vocab, out[at:])
    return out


def _rows(
    batch: list[_MooncakeRecord], shared: npt.NDArray[np.int64], table: TokenArray, vocab: int
) -> list[npt.NDArray[np.int64]]:
    """Each request's rows of ``table``: a shared block's in the head; the batch's own blocks
    are generated into the tail first (ids used once, so each lies in one request)."""
    ids = np.concatenate([r.hash_ids for r in batch])
    at = np.searchsorted(shared, ids)
    found = at < len(shared)
    found[found] = shared[at[found]] == ids[found]
    own = ~found
    n_own = int(own.sum())
    if n_own:
        table[len(shared) : len(shared) + n_own] = _block_table(ids[own], table.shape[1], vocab)
        at[own] = len(shared) + np.arange(n_own)
    cuts = np.cumsum([len(r.hash_ids) for r in batch])[:-1]
    return np.split(at, cuts)


def mooncake_block_hit_rate(path: str | Path, block_size: int = 512) -> float:
    """The Mooncake README's optimal reuse: per request in file order, the leading hash ids
    already seen, times ``block_size``, capped at ``input_length``, over all prompt tokens."""
    seen: set[int] = set()
    hit = total = 0
    for r in _mooncake_records(Path(path), block_size):
        ids = r.hash_ids.tolist()
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit += min(k * block_size, r.input_length)
        total += r.input_length
        seen.update(ids)
    return hit / total


_JSONL_FIELDS = (
    "input_ids",
    "input_length",
    "prefix_group",
    "prefix_length",
    "output_length",
    "output_ids",
    "arrival_time",
    "timestamp",
    "priority",
    "routing_key",
    "tenant",
    "extra_key",
)


def _jsonl_draft(where: str, obj: dict[str, Any], index: int, vocab: int) -> _Draft:
    unknown = sorted(set(obj) - set(_JSONL_FIELDS))
    if unknown:
        raise WorkloadError(
            f"{where}: unknown field {unknown[0]!r}; valid: {', '.join(_JSONL_FIELDS)}"
        )
    if ("input_ids" in obj) == ("input_length" in obj):
        raise WorkloadError(f"{where}: give exactly one of 'input_ids' and 'input_length'")
    if "input_ids" in obj:
        for name in ("prefix_group", "prefix_length"):
            if name in obj:
                raise WorkloadError(
                    f"{where}: field {name!r} needs 'input_length', not 'input_ids'"
                )
        prompt = _int_list(obj, "input_ids", where, nonempty=True)
        source = None
    else:
        n = _pos_int(obj, "input_length", where, MAX_PROMPT_TOKENS)
        group = obj.get("prefix_group")
        if (group is None) != ("prefix_length" not in obj):
            raise WorkloadError(f"{where}: 'prefix_group' and 'prefix_length' go together")
        shared = 0
        if group is not None:
            if isinstance(group, bool) or not isinstance(group, str | int):
                raise _bad(where, "prefix_group", "a string or integer", group)
            shared = _pos_int(obj, "prefix_length", where)
            if shared > n:
                raise WorkloadError(
                    f"{where}: field 'prefix_length': must be <= input_length ({n}), got {shared}"
                )
        prompt = _NO_TOKENS  # hashed when the load keeps the request (_fill_hashed)
        source = _HashedPrompt(None if group is None else str(group), shared, n, index, vocab)
    scripted = _int_list(obj, "output_ids", where, nonempty=False) if "output_ids" in obj else None
    if "output_length" in obj or scripted is None or not len(scripted):
        out = _pos_int(obj, "output_length", where)
    else:
        out = len(scripted)
    if "arrival_time" in obj and "timestamp" in obj:
        raise WorkloadError(f"{where}: give 'arrival_time' or 'timestamp', not both")
    ts: float | None = None
    if "arrival_time" in obj:
        ts = _nonneg_number(obj, "arrival_time", where)
    elif "timestamp" in obj:
        ts = _nonneg_number(obj, "timestamp", where) / 1e3
    priority = obj.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise _bad(where, "priority", "an integer", priority)
    if priority is not None and not -_INT64 <= priority < _INT64:
        raise _bad(where, "priority", "a signed 64-bit integer", priority)
    return _Draft(
        prompt,
        out,
        index,
        timestamp_s=ts,
        scripted=scripted,
        priority=priority,
        routing_key=_opt_str(obj, "routing_key", where),
        tenant=_opt_str(obj, "tenant", where),
        extra_key=_opt_str(obj, "extra_key", where),
        fill=None if source is None else _fill_hashed,
        source=source,
        length=0 if source is None else source.n,
    )


class _HashedPrompt(NamedTuple):
    """A prompt given by its length: ``shared`` tokens of its group's prefix, then its own."""

    group: str | None
    shared: int
    n: int
    line: int  # the request's line (its own tokens' key)
    vocab: int


def _fill_hashed(drafts: Sequence[_Draft]) -> None:
    for d in drafts:
        g, shared, n, line, vocab = d.source
        out = _out(d)
        if g is not None:
            _hash_tokens(_key(_SALT_GROUP, _str_key(g)), 0, shared, vocab, out[:shared])
        _hash_tokens(_key(_SALT_UNIQUE, line), shared, n - shared, vocab, out[shared:])
        d.prompt = out


def _build_jsonl(p: dict[str, Any], seed: int) -> list[_Draft]:
    path = Path(p["path"])
    drafts: list[_Draft] = []
    wheres: list[tuple[str, str]] = []  # each line's place and arrival field
    first_timed: bool | None = None
    for where, obj in _json_lines(path):
        d = _jsonl_draft(where, obj, len(drafts), p["vocab"])
        wheres.append((where, "arrival_time" if "arrival_time" in obj else "timestamp"))
        timed = d.timestamp_s is not None
        if first_timed is None:
            first_timed = timed
        elif timed != first_timed:
            raise WorkloadError(
                f"{where}: arrival given on some lines only: set 'arrival_time' or 'timestamp' "
                "on every line or on none"
            )
        drafts.append(d)
    if not drafts:
        raise WorkloadError(f"{path}: no requests")
    if first_timed:
        t0 = min(d.timestamp_s for d in drafts if d.timestamp_s is not None)
        for d, (where, name) in zip(drafts, wheres, strict=True):
            assert d.timestamp_s is not None
            if d.timestamp_s - t0 > MAX_ARRIVAL_S:
                value = d.timestamp_s if name == "arrival_time" else d.timestamp_s * 1e3
                raise _late(where, name, value, d.timestamp_s - t0)
            d.timestamp_s -= t0
    return drafts


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


def _build_shared_prefix(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab = _rng(seed), p["vocab"]
    drafts: list[_Draft] = []
    for _ in range(p["groups"]):
        system = _randint(rng, p["system_len"], vocab)
        for _ in range(p["prompts"]):
            question = _randint(rng, p["question_len"], vocab)
            drafts.append(_Draft(np.concatenate([system, question]), p["output_len"], len(drafts)))
    return _shuffled(drafts, rng, p["shuffle"])


def _build_multi_turn(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab, out_len = _rng(seed), p["vocab"], p["output_len"]
    drafts: list[_Draft] = []
    for conv in range(p["conversations"]):
        context = _randint(rng, p["first_len"], vocab)
        for turn in range(p["turns"]):
            if turn:
                # The next turn sees the whole previous exchange, then the new user message.
                prev = drafts[-1]
                assert prev.scripted is not None
                context = np.concatenate(
                    [prev.prompt, prev.scripted, _randint(rng, p["turn_len"], vocab)]
                )
            output = _randint(rng, out_len, vocab)
            drafts.append(
                _Draft(context, out_len, conv, offset_s=turn * p["think_time_s"], scripted=output)
            )
    return drafts


def _build_tree_of_thought(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab, out_len = _rng(seed), p["vocab"], p["output_len"]
    drafts: list[_Draft] = []
    for tree in range(p["trees"]):
        level = [_Draft(_randint(rng, p["root_len"], vocab), out_len, tree)]
        level[0].scripted = _randint(rng, out_len, vocab)
        for depth in range(p["depth"]):
            drafts.extend(level)
            if depth + 1 == p["depth"]:
                break
            children = []
            for parent in level:
                assert parent.scripted is not None
                for _ in range(p["branching"]):
                    step = _randint(rng, p["step_len"], vocab)
                    prompt = np.concatenate([parent.prompt, parent.scripted, step])
                    children.append(
                        _Draft(
                            prompt,
                            out_len,
                            tree,
                            offset_s=(depth + 1) * p["think_time_s"],
                            scripted=_randint(rng, out_len, vocab),
                        )
                    )
            level = children
    return drafts


def _build_few_shot(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab = _rng(seed), p["vocab"]
    shots = [_randint(rng, p["shots"] * p["shot_len"], vocab) for _ in range(p["num_subjects"])]
    drafts: list[_Draft] = []
    for q in range(p["questions"]):
        question = _randint(rng, p["question_len"], vocab)
        prompt = np.concatenate([shots[q % p["num_subjects"]], question])
        drafts.append(_Draft(prompt, p["output_len"], q))
    return _shuffled(drafts, rng, p["shuffle"])


def _p(name: str, default: Any, help_: str, minimum: float | None = 1) -> Param:
    return Param(name, type(default), default, help_, minimum)


def _len(name: str, default: int, help_: str) -> Param:
    """A length in tokens: at most ``MAX_PROMPT_TOKENS``."""
    return Param(name, int, default, help_, 1, MAX_PROMPT_TOKENS)


# ---- generated sizes: (requests, tokens of prompts and scripted outputs), checked before a
# generator runs (a tree's levels are summed only until the limits are passed)


def _size_shared_prefix(p: Mapping[str, Any]) -> tuple[int, int]:
    n = p["groups"] * p["prompts"]
    return n, n * (p["system_len"] + p["question_len"])


def _size_multi_turn(p: Mapping[str, Any]) -> tuple[int, int]:
    turns, grow = p["turns"], p["output_len"] + p["turn_len"]
    per_chat = turns * (p["first_len"] + p["output_len"]) + grow * turns * (turns - 1) // 2
    return p["conversations"] * turns, p["conversations"] * per_chat


def _size_tree_of_thought(p: Mapping[str, Any]) -> tuple[int, int]:
    n = tokens = 0
    for level in range(p["depth"]):
        nodes = p["trees"] * p["branching"] ** level
        n += nodes
        tokens += nodes * (
            p["root_len"] + level * (p["output_len"] + p["step_len"]) + p["output_len"]
        )
        if n > MAX_GENERATED_REQUESTS or tokens > MAX_GENERATED_TOKENS:
            break
    return n, tokens


def _size_few_shot(p: Mapping[str, Any]) -> tuple[int, int]:
    shots = p["shots"] * p["shot_len"]
    return p["questions"], p["questions"] * (shots + p["question_len"]) + p["num_subjects"] * shots


_OUT = "tokens generated per request"
_SHUFFLE = _p("shuffle", True, "interleave requests in a seeded random arrival order", None)
_THINK = "seconds between a session's consecutive requests"

WORKLOADS: dict[str, WorkloadKind] = {
    k.name: k
    for k in (
        WorkloadKind(
            "mooncake",
            "Mooncake JSONL trace (timestamp ms, input/output_length, 512-token hash_ids)",
            (_PATH, _VOCAB, _len("block_size", 512, "tokens per hash id")),
            _build_mooncake,
            is_trace=True,
        ),
        WorkloadKind(
            "jsonl",
            "radixsched JSONL trace (format in sim/workloads.py)",
            (_PATH, _VOCAB),
            _build_jsonl,
            is_trace=True,
        ),
        WorkloadKind(
            "shared-prefix",
            "groups of requests sharing a system prompt",
            (
                _p("groups", 64, "groups (distinct system prompts)"),
                _p("prompts", 16, "requests per group"),
                _len("system_len", 2048, "shared system-prompt tokens"),
                _len("question_len", 128, "unique question tokens per request"),
                _len("output_len", 256, _OUT),
                _SHUFFLE,
                _VOCAB,
            ),
            _build_shared_prefix,
            size=_size_shared_prefix,
        ),
        WorkloadKind(
            "multi-turn",
            "chats whose turns extend the previous turn's context and output",
            (
                _p("conversations", 64, "conversations"),
                _p("turns", 5, "turns per conversation"),
                _len("first_len", 512, "tokens of the first turn's prompt"),
                _len("turn_len", 128, "new user tokens per later turn"),
                _len("output_len", 128, _OUT),
                _p("think_time_s", 2.0, _THINK, 0),
                _VOCAB,
            ),
            _build_multi_turn,
            size=_size_multi_turn,
        ),
        WorkloadKind(
            "tree-of-thought",
            "branching prompts: each child extends its parent's prompt and output",
            (
                _p("trees", 32, "independent trees"),
                _p("depth", 3, "levels, the root included"),
                _p("branching", 3, "children per node"),
                _len("root_len", 512, "root prompt tokens"),
                _len("step_len", 64, "new tokens per child step"),
                _len("output_len", 128, _OUT),
                _p("think_time_s", 1.0, "seconds between a tree's levels", 0),
                _VOCAB,
            ),
            _build_tree_of_thought,
            size=_size_tree_of_thought,
        ),
        WorkloadKind(
            "few-shot",
            "MMLU-like k-shot questions; each subject shares its examples",
            (
                _p("questions", 1024, "requests"),
                _p("shots", 5, "examples per subject"),
                _len("shot_len", 128, "tokens per example"),
                _len("question_len", 128, "unique question tokens"),
                _len("output_len", 1, _OUT),
                _p("num_subjects", 57, "subjects, each with its own examples"),
                _SHUFFLE,
                _VOCAB,
            ),
            _build_few_shot,
            size=_size_few_shot,
        ),
    )
}


# Per-workload parameter defaults that replace the generators' own (``defaults=`` of
# ``load_workload``): a caller such as ``bench`` sizes workloads for its setting, and a spec
# that names only some params keeps the caller's values for the others.
Defaults = Mapping[str, Mapping[str, Any]]


def workload_defaults(kind: WorkloadKind, defaults: Defaults | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {p.name: p.default for p in kind.params}
    params.update((defaults or {}).get(kind.name, {}))
    return params


def describe_workloads(defaults: Defaults | None = None) -> str:
    """Every workload with its params and defaults (for ``--help``)."""
    lines = []
    for k in WORKLOADS.values():
        usage = f"{k.name}:PATH" if k.is_trace else f"{k.name}[:k=v,...]"
        lines.append(f"  {usage}  {k.help}")
        values = workload_defaults(k, defaults)
        params = [f"{p.name}={_fmt_param(values[p.name])}" for p in k.params if p.name != "path"]
        lines.append("      " + ", ".join(params))
    return "\n".join(lines)


def describe_params(kind: WorkloadKind, params: Mapping[str, Any]) -> str:
    """``k=v, k=v`` of a workload's params as a spec writes them (the path first for traces)."""
    return ", ".join(f"{p.name}={_fmt_param(params[p.name])}" for p in kind.params)


def _fmt_param(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_workload_spec(
    spec: str, defaults: Defaults | None = None
) -> tuple[WorkloadKind, dict[str, Any]]:
    """``name:k=v,...`` or ``name:PATH`` -> (kind, params with defaults filled in)."""
    name, _, arg = spec.strip().partition(":")
    kind = WORKLOADS.get(name)
    if kind is None:
        raise WorkloadError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    items: list[str] = []
    params = workload_defaults(kind, defaults)
    if kind.is_trace:
        if not arg:
            raise WorkloadError(f"workload {name} needs a file: {name}:PATH")
        if arg.startswith("path="):
            items = arg.split(",")
        else:
            params["path"] = arg
    elif arg:
        items = arg.split(",")
    given: set[str] = set()
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        p = kind.param(key)
        if not eq or p is None:
            valid = ", ".join(q.name for q in kind.params)
            what = f"unknown param {key!r}" if eq else f"expected k=v, got {item!r}"
            raise WorkloadError(f"workload {name}: {what}; valid params: {valid}")
        if key in given:
            raise WorkloadError(f"workload {name}: param {key!r} is given twice")
        given.add(key)
        params[key] = p.parse(name, value)
    if kind.is_trace and not params["path"]:
        raise WorkloadError(f"workload {name} needs a file: {name}:PATH")
    if kind.size is not None:
        n, tokens = kind.size(params)
        if n > MAX_GENERATED_REQUESTS or tokens > MAX_GENERATED_TOKENS:
            raise WorkloadError(
                f"workload {name}: these params make over {MAX_GENERATED_REQUESTS:,} requests "
                f"or {MAX_GENERATED_TOKENS:,} tokens, the most a generated workload may hold; "
                "lower them"
            )
    return kind, params


def check_workload_spec(spec: str, defaults: Defaults | None = None) -> None:
    """Fail now, in one line, on a bad spec or a trace that cannot be read (nothing built)."""
    kind, params = parse_workload_spec(spec, defaults)
    if kind.is_trace:
        check_trace(params["path"])


# ---- arrivals and assembly ---------------------------------------------------------------


def _arrival_times(
    drafts: Sequence[_Draft], request_rate: float | None, default_rate: float | None, seed: int
) -> tuple[npt.NDArray[np.float64], str]:
    if request_rate is None:
        if all(d.timestamp_s is not None for d in drafts):
            return np.array([d.timestamp_s for d in drafts], dtype=np.float64), "trace timestamps"
        request_rate = math.inf if default_rate is None else default_rate
    if math.isnan(request_rate) or request_rate <= 0:
        raise WorkloadError(f"request_rate must be > 0 (or inf), got {request_rate}")
    sessions = np.array([d.session for d in drafts], dtype=np.int64)
    offsets = np.array([d.offset_s for d in drafts], dtype=np.float64)
    num_sessions = int(sessions.max()) + 1
    if math.isinf(request_rate):
        return offsets.copy(), "sessions at t=0" if offsets.any() else "all at t=0"
    # Session starts at a rate that makes the long-run request rate ``request_rate``.
    session_rate = request_rate * num_sessions / len(drafts)
    gaps = np.random.default_rng([seed, 0xA771]).exponential(1.0 / session_rate, num_sessions)
    starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return starts[sessions] + offsets, f"poisson {request_rate:g} req/s"


def trace_version(kind: WorkloadKind, params: Mapping[str, Any]) -> int | None:
    """The modification time of the trace file a workload reads (None: a generated one)."""
    return Path(params["path"]).stat().st_mtime_ns if kind.is_trace else None


class DraftMemo:
    """The drafts of the last workload built through it, with the prompts built so far. A next
    load of the same spec, params and seed (at another request rate, or keeping other
    requests) reuses them and builds only the prompts it has not built yet: a prompt depends on
    its request alone, never on the arrivals. A trace whose file changed is read again."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._drafts: list[_Draft] = []

    def drafts(self, kind: WorkloadKind, params: Mapping[str, Any], seed: int) -> list[_Draft]:
        key = (kind.name, sorted(params.items()), seed, trace_version(kind, params))
        if key != self._key:
            self._key, self._drafts = None, []  # the previous drafts go before the next are built
            self._drafts = kind.build(dict(params), seed)
            self._key = key
        return self._drafts


def load_workload(
    spec: str,
    *,
    request_rate: float | None = None,
    num_requests: int | None = None,
    seed: int = 0,
    default_rate: float | None = None,
    defaults: Defaults | None = None,
    memo: DraftMemo | None = None,
) -> Workload:
    """Build the workload ``spec`` names (see the module docstring). ``default_rate`` is the
    request rate used when ``request_rate`` is None and the workload has no timestamps
    (None: all at t=0); ``defaults`` replaces generators' param defaults (see ``Defaults``);
    ``memo`` lends the prompts an earlier load of the same spec built."""
    kind, params = parse_workload_spec(spec, defaults)
    if num_requests is not None and num_requests < 1:
        raise WorkloadError(f"num_requests must be >= 1, got {num_requests}")
    before = prompt_cache.file_id(Path(params["path"])) if kind.is_trace else None
    drafts = kind.build(params, seed) if memo is None else memo.drafts(kind, params, seed)
    arrival, how = _arrival_times(drafts, request_rate, default_rate, seed)
    last = float(arrival.max())
    if not last <= MAX_ARRIVAL_S:  # traces are checked line by line as they are read
        think = " (or shorten think_time_s)" if kind.param("think_time_s") else ""
        raise WorkloadError(
            f"workload {kind.name}: arrivals ({how}) span {last:.3g} s, beyond the "
            f"{MAX_ARRIVAL_S:.0e} s the simulated clock keeps to the microsecond; raise the "
            f"request rate{think}"
        )
    order = np.argsort(arrival, kind="stable")
    if num_requests is not None:
        order = order[:num_requests]
    kept = order.tolist()
    source, key = _fill_kept(kind, params, drafts, kept, before)
    reqs = []
    for i in kept:
        d = drafts[i]
        reqs.append(
            Req(
                rid=f"{kind.name}-{i}",
                prompt_ids=d.prompt,
                sampling=SamplingParams(max_new_tokens=d.output_len, ignore_eos=True),
                priority=d.priority,
                routing_key=d.routing_key,
                extra_key=d.extra_key,
                tenant=d.tenant,
                arrival_time=float(arrival[i]),
                scripted_output=d.scripted,
            )
        )
    tenants = sorted({r.tenant for r in reqs if r.tenant is not None})
    return Workload(
        name=kind.name,
        params=params,
        requests=reqs,
        has_timestamps=all(d.timestamp_s is not None for d in drafts),
        tenants=tuple(tenants) if tenants else None,
        arrivals=how,
        prompts=source,
        prompt_key=key,
    )


PROMPT_SOURCES = ("built", "built, cached", "from the cache")


def _prompt_key(
    kind: WorkloadKind,
    params: Mapping[str, Any],
    drafts: list[_Draft],
    before: tuple[int, ...] | None,
) -> str | None:
    """The prompt cache's key of a trace whose every prompt is still to build, hashed from the
    file that was parsed; None when the cache does not apply (a generator, token ids given,
    prompts built by an earlier load, not a regular file, a file that changed meanwhile)."""
    if before is None or prompt_cache.cache_dir() is None or any(d.fill is None for d in drafts):
        return None
    path = Path(params["path"])
    try:
        key = prompt_cache.trace_key(kind.name, path, params)
    except OSError:
        return None
    return key if prompt_cache.file_id(path) == before else None


def _fill_kept(
    kind: WorkloadKind,
    params: Mapping[str, Any],
    drafts: list[_Draft],
    kept: list[int],
    before: tuple[int, ...] | None,
) -> tuple[str, str | None]:
    """Build the prompts of ``drafts[i]`` for ``i`` in ``kept``: mapped from the prompt cache
    when a full load of this trace stored them, else built (and stored when every prompt of
    the trace was). ``before``: the trace file's ``prompt_cache.file_id`` before it was parsed
    (None: not a regular file, never cached). Returns where they came from
    (``PROMPT_SOURCES``) and their cache key when they are views of the cache's file."""
    want = [drafts[i] for i in kept]
    key = _prompt_key(kind, params, drafts, before)
    folder = prompt_cache.cache_dir()
    if key is None or folder is None:
        _fill_prompts(want)
        return PROMPT_SOURCES[0], None
    cached = prompt_cache.load(folder, key, [d.length for d in drafts])
    if cached is not None:
        for i in kept:
            drafts[i].prompt = cached[i]
            drafts[i].fill = drafts[i].source = None
        return PROMPT_SOURCES[2], key
    file = None
    if len(want) == len(drafts):  # a full load: built in the new cache file's mapping
        file = prompt_cache.PromptFile.create(folder, key, [d.length for d in drafts])
    if file is None:
        _fill_prompts(want)
        return PROMPT_SOURCES[0], None
    for d, view in zip(drafts, file.views, strict=True):
        d.prompt = view
    try:
        _fill_prompts(want)
    except BaseException:
        file.abandon()
        raise
    return (PROMPT_SOURCES[1], key) if file.commit() else (PROMPT_SOURCES[0], None)


# ---- optimal hit rate ------------------------------------------------------------------


def optimal_hit_rate(reqs: Sequence[Req], page_size: int = 1) -> float:
    """Share of prompt tokens an infinite prefix cache could serve (``sim.optimal``)."""
    from radixsched.results.optimal import optimal_hit_rate as optimal

    return optimal(reqs, page_size)


def workload_optimal_hit_rate(workload: Workload, page_size: int = 1) -> float:
    """``optimal_hit_rate`` of the workload's requests, kept beside the trace's prompts in
    the prompt cache: a later run of the same requests reads it instead."""
    folder, key = prompt_cache.cache_dir(), workload.prompt_key
    if folder is None or key is None:
        return optimal_hit_rate(workload.requests, page_size)
    bound = _bound_key(workload.requests, page_size)
    value = prompt_cache.load_bound(folder, key, bound)
    if value is None:
        value = optimal_hit_rate(workload.requests, page_size)
        prompt_cache.store_bound(folder, key, bound, value)
    return value


def _bound_key(reqs: Sequence[Req], page_size: int) -> str:
    """What the bound depends on beyond the trace's bytes (the cache key): which lines, in
    which order, when, and how much of each is prompt and fed-back output, in which
    namespace. A prompt's tokens are its line's (the key's file), named by the request id."""
    h = hashlib.sha256(f"optimal\0{page_size}\0".encode())
    for r in reqs:
        h.update(
            f"{r.rid}\0{r.arrival_time!r}\0{r.prompt_len}\0{r.sampling.max_new_tokens}\0"
            f"{r.namespace!r}\0{r.scripted_output is not None}\n".encode()
        )
    return h.hexdigest()[:32]
