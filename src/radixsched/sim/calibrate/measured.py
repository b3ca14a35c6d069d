"""Measured runs, the input of ``radixsched calibrate``, and the reading of result files.

``read_result_file`` detects the tool that wrote a file from its content and hands it to that
tool's reader (``sim.calibrate.readers``: radixsched bench, GuideLLM 0.2-0.8, vLLM's
benchmark_serving.py and vllm bench serve, sglang.bench_serving, inference-perf). Every reader returns ``MeasuredRun``s: per
successful request its prompt and output lengths, TTFT and E2E (seconds), its send time and
cached prompt tokens when the tool records them, plus the run's arrival process (a request
rate, ``inf`` for all at once, and a max concurrency) and what is known of how its prompts
share prefixes.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers import (
    guidellm,
    inference_perf,
    radixsched_bench,
    sglang_bench,
    vllm_bench,
)
from radixsched.sim.calibrate.readers.fields import _kind
from radixsched.sim.calibrate.runs import (
    MeasuredRequest,
    MeasuredRun,
    PrefixBucket,
    ResultFileError,
)

__all__ = [
    "MeasuredRequest",
    "MeasuredRun",
    "PrefixBucket",
    "ResultFileError",
    "read_result_file",
    "read_result_files",
]

# ---- dispatch --------------------------------------------------------------------------------

_GZIP_MAGIC = b"\x1f\x8b"


def _read_text(p: Path) -> str:
    """The file's text: gzip-compressed (by its content, whatever its name) or not, UTF-8
    (a byte-order mark is dropped)."""
    try:
        data = p.read_bytes()
        if data[:2] == _GZIP_MAGIC or p.suffix.lower() == ".gz":
            data = gzip.decompress(data)
        return data.decode("utf-8-sig")
    except OSError as e:  # unreadable, a directory, or a .gz that is not gzip (BadGzipFile)
        raise ResultFileError(f"{p}: cannot read: {e.strerror or e}") from None
    except (EOFError, zlib.error) as e:  # cut short or corrupt gzip data
        raise ResultFileError(f"{p}: cannot read: corrupt gzip data ({e})") from None
    except UnicodeDecodeError as e:
        raise ResultFileError(
            f"{p}: cannot read: not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None


def _loads(text: str, p: Path, line: int | None = None) -> Any:
    """``json.loads``, every failure a ``ResultFileError`` naming the file and line (``line``:
    the file's line ``text`` is, for JSON Lines)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        end = " (the file ends there: cut short?)" if e.pos >= len(text.rstrip()) else ""
        raise ResultFileError(
            f"{p}:{line or e.lineno}: invalid JSON: {e.msg} (column {e.colno}){end}"
        ) from None
    except RecursionError:
        where = p if line is None else f"{p}:{line}"
        raise ResultFileError(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        where = p if line is None else f"{p}:{line}"
        raise ResultFileError(f"{where}: invalid JSON: {e}") from None


def read_result_file(path: str | Path) -> list[MeasuredRun]:
    """Every run in one result file, whatever tool wrote it (detected from its content)."""
    p = Path(path)
    text = _read_text(p)
    if not text.strip():
        raise ResultFileError(f"{p}: empty result file")
    is_jsonl = (p.with_suffix("") if p.suffix.lower() == ".gz" else p).suffix.lower() == ".jsonl"
    first_line = next(line for line in text.splitlines() if line.strip())
    # A JSON document, unless it is JSON Lines (by name, or a first line that is an object of
    # its own: sglang's file under another name).
    if not is_jsonl and not (first_line.strip() != text.strip() and _is_object(first_line)):
        doc = _loads(text, p)
        if inference_perf.is_inference_perf(doc):
            return inference_perf.inference_perf_runs(doc, _plain(p))
        if not isinstance(doc, dict):
            raise ResultFileError(
                f"{p}: expected a JSON object (a result document), got {_kind(doc)}"
            )
        return _document_runs(doc, p)
    lines: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        obj = _loads(line, p, i)
        if not isinstance(obj, dict):
            raise ResultFileError(f"{p}:{i}: expected a JSON object, got {_kind(obj)}")
        lines.append((i, obj))
    return sglang_bench.sglang_runs(lines, p)


def _plain(p: Path) -> Path:
    """``p`` without a ``.gz`` suffix (the name its siblings are found beside)."""
    return p.with_suffix("") if p.suffix.lower() == ".gz" else p


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _document_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    if radixsched_bench.is_radixsched(doc):
        return radixsched_bench.radixsched_runs(doc, p)
    if guidellm.is_guidellm(doc):
        return guidellm.guidellm_runs(doc, str(p))
    if sglang_bench.is_sglang(doc):  # one run's line, in a file not named .jsonl
        return sglang_bench.sglang_runs([(1, dict(doc))], p)
    if vllm_bench.is_vllm(doc):
        return vllm_bench.vllm_runs(doc, p)
    if doc.get("format") == "radixsched-calibration":
        raise ResultFileError(
            f"{p}: a calibration file, not a result file (give it to "
            "'radixsched simulate --calibration')"
        )
    raise ResultFileError(f"{p}: not a result file radixsched knows")


def read_result_files(paths: Sequence[str | Path]) -> list[MeasuredRun]:
    return [run for p in paths for run in read_result_file(p)]
