"""Mooncake trace lines read into records (timestamp, lengths, the hash ids the prompt uses):
the fast reader (plain lines parsed natively a block at a time, else by orjson, into columns:
a record made only when one is asked for) and the checked reader, field by field, whose first
bad line's error is the trace's (the fast one only ever takes traces it accepts)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from radixsched.sim.workloads.tokens import (
    MAX_ARRIVAL_S,
    MAX_PROMPT_TOKENS,
    WorkloadError,
)
from radixsched.sim.workloads.trace_files import (
    _int_list,
    _json_lines,
    _late,
    _nonneg_number,
    _pos_int,
    open_trace,
)


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
    if isinstance(out, _MooncakeLines):  # its stamps are all floats: a column at once
        late = _first_late(stamps, t0)
    else:
        late = next((i for i, t in enumerate(stamps) if (t - t0) / 1e3 > MAX_ARRIVAL_S), None)
    if late is not None:
        ts = stamps[late]
        raise _late(out[late].where, "timestamp", ts, (ts - t0) / 1e3)
    return out


def _first_late(stamps: list[float], t0: float) -> int | None:
    """The first ``i`` with ``(stamps[i] - t0) / 1e3 > MAX_ARRIVAL_S``, or None: the same float64
    operations on the same floats (the fast reader's stamps, all floats), a column at once."""
    over = np.flatnonzero((np.array(stamps, dtype=np.float64) - t0) / 1e3 > MAX_ARRIVAL_S)
    return int(over[0]) if over.size else None


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
    for first, block, rows in _buffered_blocks(path):
        part = _native_block(parse, block, rows)
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


def _native_block(
    parse: Callable[..., int], block: bytes | memoryview, rows: int
) -> tuple[npt.NDArray[Any], ...] | None:
    """A block's (of ``rows`` lines) stamps, input and output lengths, id counts and ids
    (``mooncake_lines``), or None where the parser declines a line or a value is out of
    ``_add_columns``' and ``_checked_ids``' ranges (the parser takes non-negative integers
    only)."""
    stamps = np.empty(rows, dtype=np.float64)
    inputs, outputs, counts = (np.empty(rows, dtype=np.int64) for _ in range(3))
    # Each id takes two bytes at least (a digit, then a comma or the list's end): a bound
    # without a pass over the block. Its pages are touched only as far as the ids go.
    ids = np.empty(len(block) // 2 + 1, dtype=np.int64)
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
    for first, block, _rows in _line_blocks(path):
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


def _line_blocks(path: Path) -> Iterator[tuple[int, bytes, int]]:
    """``(number of its first line, block, its number of lines)``: the file's bytes as blocks
    of whole lines (split at ``\\n``, as ``_lines`` splits them), the last newline of each
    block left out."""
    with open_trace(path) as f:
        first, tail = 1, b""
        while data := f.read(_BLOCK_BYTES):
            data = tail + data
            cut = data.rfind(b"\n")
            if cut < 0:
                tail = data
                continue
            block, tail = data[:cut], data[cut + 1 :]
            rows = block.count(b"\n") + 1
            yield first, block, rows
            first += rows
        if tail:
            yield first, tail, tail.count(b"\n") + 1


def _buffered_blocks(path: Path) -> Iterator[tuple[int, bytes | memoryview, int]]:
    """``_line_blocks``' blocks, read into one buffer (``readinto``: the bytes are copied once,
    and its pages reused) where the file's reader can, each block a view of it that is good
    until the next is asked for (the native parser reads each before). The buffer grows where a
    line is longer than it; an unfinished line's bytes move to its start."""
    with open_trace(path) as f:
        read = getattr(f, "readinto", None)
        if read is None:
            yield from _line_blocks(path)
            return
        buf = bytearray(_BLOCK_BYTES)
        first, held = 1, 0  # held: the unfinished line's bytes, at buf's start
        while True:
            if held == len(buf):  # a line past the buffer: a larger one, the line copied
                buf = buf + bytearray(len(buf))
            got = read(memoryview(buf)[held:])
            if not got:
                break
            end = held + got
            cut = buf.rfind(b"\n", 0, end)
            if cut < 0:
                held = end
                continue
            rows = buf.count(b"\n", 0, cut) + 1
            yield first, memoryview(buf)[:cut], rows
            first += rows
            held = end - cut - 1
            buf[:held] = buf[cut + 1 : end]  # (a line's bytes: the same size, no resize)
        if held:
            yield first, memoryview(buf)[:held], buf.count(b"\n", 0, held) + 1


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
