"""Trace readers: Mooncake's JSONL (hash_ids become token blocks) and radixsched's JSONL (token
ids or lengths, prefix groups, priority, tenant, arrival), plain, .gz or .zst. Bad input names
the file, the line and the field."""

from __future__ import annotations

import io
import itertools
import json
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast, overload

import numpy as np
import numpy.typing as npt

from radixsched.request import TokenArray
from radixsched.sim.workloads.tokens import (
    _INT64,
    _NO_TOKENS,
    _SALT_BLOCK,
    _SALT_GROUP,
    _SALT_PAD,
    _SALT_UNIQUE,
    MAX_ARRIVAL_S,
    MAX_PROMPT_TOKENS,
    WorkloadError,
    _block_table,
    _Draft,
    _each_in_threads,
    _hash_tokens,
    _key,
    _runs_in_threads,
    _str_key,
)

# ---- trace readers ---------------------------------------------------------------------


# Compressed traces, by file suffix: gzip from the standard library; zstandard from the
# ``zstandard`` package (or the standard library's ``compression.zstd`` from Python 3.14).


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
            import gzip

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
    try:
        arr = np.asarray(v) if v else np.zeros(0, dtype=np.int64)
    except (ValueError, TypeError):  # ragged, e.g. [1, [2]]
        raise _bad(where, name, "a list of non-negative integers", _clip(v)) from None
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


@dataclass(slots=True)  # one a trace line: a million of them
class _MooncakeRecord:
    """A Mooncake trace line's fields (``where``: its file and line, for errors)."""

    where: str
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: npt.NDArray[np.int64]  # only the ids the prompt uses


class _MooncakeLines(Sequence[_MooncakeRecord]):
    """The fast reader's records as columns: a record is made only when one is asked for
    (``_build_mooncake`` and the span check read the columns: no object a line)."""

    def __init__(self, name: str, cols: _MooncakeColumns, ids: list[npt.NDArray[np.int64]]):
        self.name, self.lines, self.stamps = name, cols.lines, cols.stamps
        self.inputs, self.outputs, self.ids = cols.inputs, cols.outputs, ids

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, i: int) -> _MooncakeRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[_MooncakeRecord]: ...
    def __getitem__(self, i: int | slice) -> _MooncakeRecord | list[_MooncakeRecord]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        at = f"{self.name}:{self.lines[i]}"
        return _MooncakeRecord(at, self.stamps[i], self.inputs[i], self.outputs[i], self.ids[i])


def _mooncake_records(path: Path, block: int) -> Sequence[_MooncakeRecord]:
    out: Sequence[_MooncakeRecord] | None = _fast_mooncake_records(path, block)
    if out is None:  # anything the fast reader does not take: the per-line checks decide
        out = _checked_mooncake_records(path, block)
    if not out:
        raise WorkloadError(f"{path}: no requests")
    stamps = _stamps(out)
    t0 = min(stamps)
    late = next((i for i, t in enumerate(stamps) if (t - t0) / 1e3 > MAX_ARRIVAL_S), None)
    if late is not None:
        ts = stamps[late]
        raise _late(out[late].where, "timestamp", ts, (ts - t0) / 1e3)
    return out


def _stamps(records: Sequence[_MooncakeRecord]) -> list[float]:
    if isinstance(records, _MooncakeLines):
        return records.stamps
    return [r.timestamp_ms for r in records]


class _Irregular(Exception):
    """A line the fast Mooncake reader leaves to the checked one."""


class _MooncakeColumns(NamedTuple):
    """A Mooncake trace's lines as columns: line numbers, fields, and every line's whole
    ``hash_ids`` list, the lists one after another."""

    lines: list[int]
    stamps: list[float]
    inputs: list[int]
    outputs: list[int]
    counts: list[int]  # each line's len(hash_ids)
    ids: list[int]


def _fast_mooncake_records(path: Path, block: int) -> _MooncakeLines | None:
    """``_checked_mooncake_records``'s records, read with orjson and the hash ids checked in
    one array; None where the trace has anything this reader does not take (then the checked
    reader reads it again: the same records, or its error for the first bad line). Regular
    files only: a pipe or FIFO cannot be read a second time."""
    if not path.is_file():
        return None
    read = _native_columns(path) or _orjson_columns(path)
    if read is None:
        return None
    cols, blocks = read
    views: list[npt.NDArray[np.int64]] = []
    first = 0
    for ids, rows in blocks:
        lines = slice(first, first + rows)
        views += _prompt_ids(ids, cols.counts[lines], cols.inputs[lines], block)
        first += rows
    return _MooncakeLines(str(path), cols, views)


# A read's hash ids: arrays of consecutive lines' ids, one after another, each with its count
# of lines (the native reader's blocks, or one array of them all).
_IdBlocks = list[tuple[npt.NDArray[np.int64], int]]


def _prompt_ids(
    ids: npt.NDArray[np.int64], counts: list[int], inputs: list[int], block: int
) -> list[npt.NDArray[np.int64]]:
    """Each line's ids that its prompt uses, a view of ``ids`` (the lines' ids one after
    another, ``counts`` a line): its first ``ceil(input / block)``, as ids[: -(-n // block)]."""
    c = np.array(counts, dtype=np.int64)
    starts = np.cumsum(c) - c
    ends = starts + np.minimum(c, -(-np.array(inputs, dtype=np.int64) // block))
    return [ids[a:e] for a, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def _orjson_columns(path: Path) -> tuple[_MooncakeColumns, _IdBlocks] | None:
    """The trace's columns and its hash ids (``_checked_ids``), read with orjson; None where a
    line is not plainly good (``_mooncake_columns``) or an id is out of range."""
    try:
        import orjson
    except ImportError:  # a declared dependency; without it the checked reader serves
        return None
    try:
        cols = _mooncake_columns(path, orjson.loads)
    except Exception:  # anything unexpected (bad JSON, a read error, ...): checked reader
        return None
    ids = _checked_ids(cols.ids)
    if ids is None or not cols.lines:
        return None
    return cols, [(ids, len(cols.lines))]


def _native_columns(path: Path) -> tuple[_MooncakeColumns, _IdBlocks] | None:
    """``_orjson_columns``' columns and ids, parsed by the native core a block at a time
    (``mooncake_lines``: a line of plain integers only, ``_native/trace_lines.hpp``); None
    without the core, or where a line is not plain or fails ``_add_columns``' range checks
    (``_orjson_columns`` then reads the trace, and decides). ``ids`` holds no list; the ids
    stay in one array a block."""
    from radixsched.native import core

    parse = getattr(core(), "mooncake_lines", None)
    if parse is None:
        return None
    try:
        return _native_read(path, parse)
    except Exception:  # a read error (a truncated gzip, ...): the other readers decide
        return None


def _native_read(
    path: Path, parse: Callable[..., int]
) -> tuple[_MooncakeColumns, _IdBlocks] | None:
    cols = _MooncakeColumns([], [], [], [], [], [])
    parts: _IdBlocks = []
    for first, block in _line_blocks(path):
        part = _native_block(parse, block)
        if part is None:
            return None
        stamps, inputs, outputs, counts, ids = part
        cols.lines.extend(range(first, first + stamps.size))
        cols.stamps.extend(stamps.tolist())
        cols.inputs.extend(inputs.tolist())
        cols.outputs.extend(outputs.tolist())
        cols.counts.extend(counts.tolist())
        parts.append((ids, stamps.size))  # each block's own: no copy of them all
    if not cols.lines:
        return None
    return cols, parts


def _native_block(parse: Callable[..., int], block: bytes) -> tuple[npt.NDArray[Any], ...] | None:
    """A block's stamps, input and output lengths, id counts and ids (``mooncake_lines``), or
    None where the parser declines a line or a value is out of ``_add_columns``' and
    ``_checked_ids``' ranges (the parser takes non-negative integers only)."""
    rows = block.count(b"\n") + 1
    stamps = np.empty(rows, dtype=np.float64)
    inputs, outputs, counts = (np.empty(rows, dtype=np.int64) for _ in range(3))
    bound = rows + block.count(b",")  # each id is its list's first or follows a comma
    ids = np.empty(bound, dtype=np.int64)
    n = parse(block, stamps, inputs, outputs, counts, ids)
    if n < 0:
        return None
    ids = ids[:n].copy()  # (not a view: the bound's unused tail is freed)
    if not (inputs.min() > 0 and inputs.max() <= MAX_PROMPT_TOKENS and outputs.min() > 0):
        return None
    if ids.size and ids.max() >= 2**31:
        return None
    return stamps, inputs, outputs, counts, ids


# The fast reader reads whole lines about 4 MiB at once: a block's lines and decoded objects
# (about 6x its bytes) are all it holds beyond the columns.
_BLOCK_BYTES = 1 << 22


def _mooncake_columns(path: Path, loads: Callable[[bytes], Any]) -> _MooncakeColumns:
    """The trace's columns; ``_Irregular`` (or the decoder's error) at the first line that is
    not plainly good: a JSON object with a timestamp that is an int or float >= 0, int
    lengths in range and a list of hash ids (checked later, together). No ``true``/``false``
    anywhere on the line: numpy would read a bool among the ids as an int. Read a block of
    lines at a time, each block's fields checked column by column (any failure: the checked
    reader decides, so the order of the checks does not matter)."""
    cols = _MooncakeColumns([], [], [], [], [], [])
    for first, block in _line_blocks(path):
        if _has_bool(block):
            raise _Irregular
        lines = block.split(b"\n")
        numbers: Sequence[int] = range(first, first + len(lines))
        try:
            objs = list(map(loads, lines))
        except Exception:  # a blank line among them (skipped), or a bad one (raises again)
            kept = [(i, raw) for i, raw in enumerate(lines, first) if raw.strip()]
            numbers = [i for i, _ in kept]
            objs = [loads(raw) for _, raw in kept]
        _add_columns(cols, numbers, objs)
    return cols


def _has_bool(block: bytes) -> bool:
    """Whether ``true`` or ``false`` occurs in ``block``. Each is looked for only where its
    rarest byte occurs at all (a one-byte search, ``memchr``): no ``r`` nor ``f`` is in
    Mooncake's keys or numbers, so a plain trace's block is passed in two fast scans."""
    return (b"r" in block and b"true" in block) or (b"f" in block and b"false" in block)


def _line_blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(number of its first line, block)``: the file's bytes as blocks of whole lines (split
    at ``\\n``, as ``_lines`` splits them), the last newline of each block left out."""
    with open_trace(path) as f:
        first, tail = 1, b""
        while data := f.read(_BLOCK_BYTES):
            data = tail + data
            cut = data.rfind(b"\n")
            if cut < 0:
                tail = data
                continue
            block, tail = data[:cut], data[cut + 1 :]
            yield first, block
            first += block.count(b"\n") + 1
        if tail:
            yield first, tail


def _add_columns(cols: _MooncakeColumns, numbers: Sequence[int], objs: list[Any]) -> None:
    """Append the lines ``numbers`` (their decoded ``objs``) to ``cols``; ``_Irregular`` (or a
    lookup error: not an object, a field missing) unless every line is plainly good."""
    stamps = [o["timestamp"] for o in objs]
    inputs = [o["input_length"] for o in objs]
    outputs = [o["output_length"] for o in objs]
    hashes = [o["hash_ids"] for o in objs]
    if not (_all_of(inputs, int) and _all_of(outputs, int) and _all_of(hashes, list)):
        raise _Irregular
    if objs and not (min(inputs) > 0 and max(inputs) <= MAX_PROMPT_TOKENS and min(outputs) > 0):
        raise _Irregular
    kinds = set(map(type, stamps))
    if not kinds <= {int, float}:
        raise _Irregular
    if int in kinds:
        stamps = [float(t) for t in stamps]  # orjson's ints fit 64 bits: no OverflowError
    # orjson gives no inf or nan; -0.0 passes, as in _nonneg_number
    if objs and not min(stamps) >= 0:
        raise _Irregular
    cols.lines.extend(numbers)
    cols.stamps.extend(stamps)
    cols.inputs.extend(inputs)
    cols.outputs.extend(outputs)
    cols.counts.extend(map(len, hashes))
    cols.ids.extend(itertools.chain.from_iterable(hashes))


def _all_of(values: list[Any], kind: type) -> bool:
    """Whether every value's type is exactly ``kind`` (a bool is not an int)."""
    return set(map(type, values)) <= {kind}


# Hash ids packed per call: the argument tuple stays small however long the trace.
_ID_CHUNK = 1 << 16


def _checked_ids(ids: list[int]) -> npt.NDArray[np.int64] | None:
    """All lines' hash ids as one int64 array, or None unless every id is an int in
    [0, 2^31) (what ``_int_list`` takes). Packed as C ``long long`` (``struct``'s ``q``,
    64 bits), which takes ints alone: a float, string, null or list among them, or an int past
    64 bits, is a ``struct.error`` (numpy's ``np.array`` gives those another dtype or shape:
    the same outcome, at a seventh of its cost)."""
    if not ids:
        return np.zeros(0, dtype=np.int64)
    arr = np.empty(len(ids), dtype=np.int64)
    try:
        for lo in range(0, len(ids), _ID_CHUNK):
            part = ids[lo : lo + _ID_CHUNK]
            struct.pack_into(f"={len(part)}q", arr.data, 8 * lo, *part)
    except struct.error:
        return None
    if int(arr.min()) < 0 or int(arr.max()) >= 2**31:
        return None
    return arr


def _checked_mooncake_records(path: Path, block: int) -> list[_MooncakeRecord]:
    """Every line checked field by field: the reference reader, whose first bad line's error
    is the trace's error (the fast reader only ever takes traces this one accepts)."""
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
    stamps = _stamps(records)
    t0 = min(stamps)

    def fill(drafts: Sequence[_Draft]) -> None:
        _fill_mooncake(drafts, block, vocab)

    if isinstance(records, _MooncakeLines):  # its columns, no record made
        outputs, inputs, ids = records.outputs, records.inputs, records.ids
    else:
        outputs = [r.output_length for r in records]
        inputs = [r.input_length for r in records]
        ids = [r.hash_ids for r in records]
    columns = (stamps, outputs, inputs, ids)
    return [
        # (the hash ids, not the record: the drafts keep no object a line)
        _Draft(_NO_TOKENS, o, i, timestamp_s=(ts - t0) / 1e3, fill=fill, source=h, length=n)
        for i, (ts, o, n, h) in enumerate(zip(*columns, strict=True))
    ]


def _fill_mooncake(drafts: Sequence[_Draft], block: int, vocab: int) -> None:
    """Blocks that several of these prompts use are generated once, into the head of one
    table; the blocks only one prompt uses are generated a batch of requests at a time into
    its tail, so the table (the load's peak memory beside the prompts) holds the shared blocks
    and one batch's own. A block's tokens depend on its id only, a short id list's padding on
    the request's line: the same prompts whichever requests are built together. With the
    native core each prompt is written in one pass instead (``_native_prompt``, a batch a call: the same
    tokens, computed per position, no table)."""
    native = _native_prompt(block, vocab)
    if native is not None:
        salt = _key(_SALT_BLOCK)
        outs = [_prompt_buffer(d) for d in drafts]
        ids = [d.source for d in drafts]
        pads = [_key(_SALT_PAD, d.session) for d in drafts]

        def build(lo: int, hi: int) -> None:  # one native call a thread, without the GIL
            native(outs[lo:hi], ids[lo:hi], pads[lo:hi], salt, block, vocab)

        _runs_in_threads([d.length for d in drafts], build)
        for d, out in zip(drafts, outs, strict=True):
            d.prompt = out
        return
    id_lists: list[npt.NDArray[np.int64]] = [d.source for d in drafts]
    distinct, uses = np.unique(np.concatenate(id_lists), return_counts=True)
    shared = distinct[uses > 1]
    batches = [
        list(range(lo, min(lo + _BATCH, len(drafts)))) for lo in range(0, len(drafts), _BATCH)
    ]
    tail = max((sum(len(id_lists[j]) for j in b) for b in batches), default=0)
    table = np.empty((len(shared) + tail, block), dtype=np.int32)
    table[: len(shared)] = _block_table(shared, block, vocab)
    for batch in batches:
        own = [id_lists[j] for j in batch]
        for j, rows in zip(batch, _rows(own, shared, table, vocab), strict=True):
            d = drafts[j]
            d.prompt = _gather(table, rows, _prompt_buffer(d), d.session, vocab)


def _native_prompt(block: int, vocab: int) -> Callable[..., None] | None:
    """The native core's ``mooncake_prompts`` (``_native/prompts.cpp``: a list of prompts in
    one call), or None: no native core (or one built before it), or a shape it does not take
    (the numpy path then raises or builds as before)."""
    if not (block >= 1 and 1 <= vocab < 2**31):
        return None
    from radixsched.native import core

    fn = getattr(core(), "mooncake_prompts", None)
    return None if fn is None else cast(Callable[..., None], fn)


def _prompt_buffer(d: _Draft) -> TokenArray:
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
    batch: list[npt.NDArray[np.int64]], shared: npt.NDArray[np.int64], table: TokenArray, vocab: int
) -> list[npt.NDArray[np.int64]]:
    """Each request's rows of ``table`` (``batch``: their hash ids): a shared block's in the
    head; the batch's own blocks are generated into the tail first (ids used once, so each lies
    in one request)."""
    ids = np.concatenate(batch)
    at = np.searchsorted(shared, ids)
    found = at < len(shared)
    found[found] = shared[at[found]] == ids[found]
    own = ~found
    n_own = int(own.sum())
    if n_own:
        table[len(shared) : len(shared) + n_own] = _block_table(ids[own], table.shape[1], vocab)
        at[own] = len(shared) + np.arange(n_own)
    cuts = np.cumsum([len(h) for h in batch])[:-1]
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
    _each_in_threads(drafts, _hashed_prompt)


def _hashed_prompt(d: _Draft) -> None:
    g, shared, n, line, vocab = d.source
    out = _prompt_buffer(d)
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
