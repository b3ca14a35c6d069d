"""Trace files: a trace opened (plain, .gz or .zst) and read line by line, and the checks of
a line's fields, each error naming the file, the line and the field."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from radixsched.request import TokenArray
from radixsched.sim.workloads.tokens import MAX_ARRIVAL_S, WorkloadError

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


def _late(where: str, name: str, value: float, after_s: float) -> WorkloadError:
    return WorkloadError(
        f"{where}: field {name!r}: {value:g} is {after_s:.3g} s after the first request, "
        f"beyond the {MAX_ARRIVAL_S:.0e} s a trace may span (the simulated clock would lose "
        "its microseconds)"
    )
