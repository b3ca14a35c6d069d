"""Measured runs, the input of ``radixsched calibrate``, and the reading of result files.

``read_result_file`` detects the tool that wrote a file from its content and hands it to that
tool's reader (``sim.calibrate.readers``: radixsched bench, GuideLLM 0.2-0.8, vLLM's bench
client, sglang.bench_serving, inference-perf). Every reader returns ``MeasuredRun``s: per
successful request its prompt and output lengths, TTFT and E2E (seconds), its send time and
cached prompt tokens when the tool records them, plus the run's arrival process (a request
rate, ``inf`` for all at once, and a max concurrency) and what is known of how its prompts
share prefixes.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ResultFileError(ValueError):
    """A result file that cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class MeasuredRequest:
    prompt_len: int
    output_len: int
    ttft_s: float
    e2e_s: float
    sent_at: float | None = None  # seconds from the run's start
    # Prompt tokens the server reported as served from its prefix cache (GuideLLM 0.8).
    cached_tokens: int | None = None

    @property
    def itl_s(self) -> float | None:
        """Mean gap between output tokens (None below two tokens)."""
        if self.output_len < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class PrefixBucket:
    """Prompts that start with one of ``count`` shared prefixes of ``tokens`` tokens, a
    ``weight`` share of the requests (GuideLLM's synthetic ``prefix_buckets``; sglang's
    generated-shared-prefix groups)."""

    weight: float
    count: int
    tokens: int


@dataclass(frozen=True)
class MeasuredRun:
    name: str
    source: str  # "radixsched" | "sglang" | "vllm" | "guidellm"
    path: str
    requests: tuple[MeasuredRequest, ...]
    request_rate: float = math.inf  # requests/s; inf = all at once
    max_concurrency: int | None = None
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    num_failed: int = 0
    # radixsched runs: how to regenerate the prompts (load_workload arguments, server limits).
    workload: dict[str, Any] = field(default_factory=dict)
    # How the prompts shared prefixes: () none, None unknown (request-unique prompts are
    # replayed, and ``structure_note`` says what that may cost).
    prefixes: tuple[PrefixBucket, ...] | None = ()
    structure_note: str | None = None
    tool_version: str | None = None  # the client's version, when the file names it
    # Each request's prompt ids, from the user's trace (``calibrate --workload``); None: not
    # known, the replay builds them from ``prefixes``.
    prompts: tuple[Any, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "num_requests": len(self.requests),
            "num_failed": self.num_failed,
            "request_rate": self.request_rate if math.isfinite(self.request_rate) else "inf",
            "max_concurrency": self.max_concurrency,
        }


# One request's prompt or output beyond this many tokens is no measurement (no model's
# context holds it): a corrupt file, which a replay would try to allocate.
MAX_TOKENS = 1 << 24
# Timestamps of one request may disagree by this much (rounded token times) and still count
# as in order.
_TIME_SLACK_S = 1e-6


def _show(value: Any) -> str:
    """``value`` for a message: JSON's null as such, anything long cut short."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    """The JSON type of ``value``, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = ((Mapping, "an object"), (list, "an array"), (str, "a string"))
    return next((name for t, name in kinds if isinstance(value, t)), "a number")


def _bad(where: str, field: str, expected: str, value: Any) -> ResultFileError:
    return ResultFileError(f"{where}: field {field!r}: expected {expected}, got {_show(value)}")


def _number(value: Any, where: str, field: str) -> float:
    """A finite number (JSON's NaN and Infinity, booleans and strings are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(where, field, "a number", value)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _bad(where, field, "a finite number", value)
    return number


def _count(value: Any, where: str, field: str, minimum: int) -> int:
    """A whole number of tokens in ``[minimum, MAX_TOKENS]``."""
    number = _number(value, where, field)
    if not number.is_integer() or not minimum <= number <= MAX_TOKENS:
        raise _bad(where, field, f"a whole number from {minimum} to {MAX_TOKENS}", value)
    return int(number)


def _rate(value: Any, where: str, field: str) -> float:
    """Requests/s: a positive number, or ``inf`` (also null, "inf", "trace": all at once)."""
    if value is None or value in ("inf", "Infinity", "trace"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _bad(where, field, "a positive number or 'inf'", value)
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        return math.inf


def _conc(value: Any, where: str, field: str) -> int | None:
    """A max concurrency: a whole number >= 1, or null (none)."""
    if value is None:
        return None
    number = _number(value, where, field)
    if not number.is_integer() or number < 1:
        raise _bad(where, field, "a whole number >= 1 or null", value)
    return int(number)


def _object(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """``doc[key]``, an object; absent or null: an empty one."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(where, key, "an object", value)
    return value


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any] | None:
    """``doc[key]``, a list; absent or null: None."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(where, key, "a list", value)
    return value


def _optional(doc: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    """``doc[key]`` when it is null, absent or a ``kind`` (not a bool)."""
    value = doc.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _bad(where, key, f"{'a string' if kind is str else 'a whole number'} or null", value)


def _request(
    where: str,
    prompt_len: int,
    output_len: int,
    ttft_s: float,
    e2e_s: float,
    sent: float | None,
    cached: int | None = None,
) -> MeasuredRequest:
    """A measured request whose times are in order (first token after the send, finish
    after the first token)."""
    if ttft_s < -_TIME_SLACK_S:
        raise ResultFileError(f"{where}: first token {ttft_s:.6g} s before the request was sent")
    if e2e_s < ttft_s - _TIME_SLACK_S:
        raise ResultFileError(
            f"{where}: finished {e2e_s:.6g} s after the send, before its first token "
            f"({ttft_s:.6g} s)"
        )
    ttft_s = max(ttft_s, 0.0)
    return MeasuredRequest(prompt_len, output_len, ttft_s, max(e2e_s, ttft_s), sent, cached)


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
        from radixsched.sim.calibrate.readers import inference_perf

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
    from radixsched.sim.calibrate.readers.sglang_bench import sglang_runs

    return sglang_runs(lines, p)


def _plain(p: Path) -> Path:
    """``p`` without a ``.gz`` suffix (the name its siblings are found beside)."""
    return p.with_suffix("") if p.suffix.lower() == ".gz" else p


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _document_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    from radixsched.sim.calibrate.readers import guidellm, radixsched_bench, vllm_bench

    if radixsched_bench.is_radixsched(doc):
        return radixsched_bench.radixsched_runs(doc, p)
    if guidellm.is_guidellm(doc):
        return guidellm.guidellm_runs(doc, str(p))
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
