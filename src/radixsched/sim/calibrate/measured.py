"""Readers for client-side benchmark results, the input of ``radixsched calibrate``.

Every reader returns ``MeasuredRun``s: per successful request its prompt and output lengths,
TTFT and E2E (seconds), its send time when the tool records one, plus the run's arrival
process (a request rate, ``inf`` for all at once, and a max concurrency).

- ``radixsched bench --json`` (one run) and ``bench --sweep --json`` (``"format":
  "radixsched-bench-sweep"``, several): per-request ``requests`` records with send times and
  token times; the workload spec and seed, so replays regenerate the very prompts (shared
  prefixes included).
- ``sglang.bench_serving --output-file F.jsonl --output-details``: one JSON object a line, one
  run each: ``request_rate``, ``max_concurrency``, ``input_lens``, ``output_lens``, ``ttfts``
  (s), ``itls`` (per request, s), ``errors``; ``server_info`` names the model. No send times.
- vLLM ``benchmark_serving.py --save-result --save-detailed``: one JSON object: ``model_id``,
  ``request_rate`` (a number or ``"inf"``), ``max_concurrency``, ``input_lens``,
  ``output_lens``, ``ttfts``, ``itls``, ``errors``. No send times.
- GuideLLM (``guidellm benchmark --output-path F.json``, report layout of 0.2/0.3):
  ``{"benchmarks": [{"args": {"strategy": {"type_", "streams" | "rate" | ...}},
  "requests": {"successful": [{"prompt_tokens", "output_tokens", "start_time",
  "first_token_time", "last_token_time", "end_time"}]}}]}`` (epoch seconds).

Tools that record no prompt tokens are replayed with request-unique prompts of the recorded
lengths (no shared prefixes): right for their random and ShareGPT datasets."""

from __future__ import annotations

import dataclasses
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

    @property
    def itl_s(self) -> float | None:
        """Mean gap between output tokens (None below two tokens)."""
        if self.output_len < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


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
    where: str, prompt_len: int, output_len: int, ttft_s: float, e2e_s: float, sent: float | None
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
    return MeasuredRequest(prompt_len, output_len, ttft_s, max(e2e_s, ttft_s), sent)


# ---- radixsched ---------------------------------------------------------------------------


def _radixsched_run(doc: Mapping[str, Any], path: str, name: str) -> MeasuredRun:
    where = f"{path}: {name}"
    records = doc.get("requests")
    if not isinstance(records, list):
        raise ResultFileError(
            f"{where}: no per-request records (written by an older radixsched bench)"
        )
    cfg = _object(doc, "config", where)
    bench = _object(cfg, "bench", f"{where}: config")
    server = _object(cfg, "server", f"{where}: config")
    limits = _object(cfg, "limits", f"{where}: config")
    reqs = []
    rids = []
    failed = 0
    for i, r in enumerate(records):
        at = f"{where}: request {i}"
        if not isinstance(r, Mapping):
            raise ResultFileError(f"{at}: expected an object, got {_show(r)}")
        times = _list(r, "token_times", at) or []
        if r.get("error") or not times or r.get("finished_at") is None:
            failed += 1
            continue
        sent = _number(r.get("sent_at"), at, "sent_at")
        first = _number(times[0], at, "token_times")
        for t in times[1:]:
            _number(t, at, "token_times")
        reqs.append(
            _request(
                at,
                prompt_len=_count(r.get("prompt_len"), at, "prompt_len", 1),
                output_len=_count(len(times), at, "token_times (its length)", 1),
                ttft_s=first - sent,
                e2e_s=_number(r.get("finished_at"), at, "finished_at") - sent,
                sent=sent,
            )
        )
        rids.append(r.get("rid"))
    wl_info = _object(doc, "workload", where)
    params = _object(wl_info, "params", f"{where}: workload")
    scheduler = _object(server, "scheduler", f"{where}: config: server")
    at = f"{where}: config: bench"
    workload = {
        "spec": _optional(bench, "workload", at, str),
        # Every param bench generated with (its own defaults fill what the spec left out).
        "name": _optional(wl_info, "name", f"{where}: workload", str),
        "params": dict(params) or None,
        "num_requests": _conc(bench.get("num_requests"), at, "num_requests"),
        "seed": _optional(bench, "seed", at, int) or 0,
        "request_rate": _rate(bench.get("request_rate"), at, "request_rate"),
        "vocab_size": _conc(limits.get("vocab_size"), f"{where}: config: limits", "vocab_size"),
        "context_len": _conc(limits.get("context_len"), f"{where}: config: limits", "context_len"),
        # The successful requests' ids, in the order of ``requests``.
        "rids": rids,
        "scheduler": dict(scheduler) or None,
        "kv_slots": _conc(server.get("kv_slots"), f"{where}: config: server", "kv_slots"),
    }
    model = server.get("model")
    return MeasuredRun(
        name=name,
        source="radixsched",
        path=path,
        requests=tuple(reqs),
        request_rate=workload["request_rate"],
        max_concurrency=_conc(bench.get("max_concurrency"), at, "max_concurrency"),
        model=None if model is None else str(model),
        engine="radixsched",
        engine_version=_radixsched_version(),
        num_failed=failed,
        workload=workload,
    )


def _radixsched_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("radixsched")
    except PackageNotFoundError:
        return "unknown"


# ---- sglang / vLLM -------------------------------------------------------------------------


def _lists_run(doc: Mapping[str, Any], path: str, source: str) -> MeasuredRun:
    """sglang.bench_serving and vLLM's benchmark_serving share the detail lists."""
    rate = _rate(doc.get("request_rate"), path, "request_rate")
    conc = _conc(doc.get("max_concurrency"), path, "max_concurrency")
    name = _run_name(doc.get("request_rate"), rate, conc)
    where = f"{path}: {name}"
    need = ("input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if not isinstance(doc.get(k), list)]
    if missing:
        flag = "--output-details" if source == "sglang" else "--save-result --save-detailed"
        raise ResultFileError(
            f"{where}: no per-request lists ({', '.join(missing)}); rerun with {flag}"
        )
    lists = {k: doc[k] for k in need}
    errors = _list(doc, "errors", where)
    starts = _list(doc, "start_times", where)
    if errors:  # (an empty list: no errors recorded)
        lists["errors"] = errors
    if starts is not None:
        lists["start_times"] = starts
    if len({len(v) for v in lists.values()}) > 1:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in lists.items())
        raise ResultFileError(f"{where}: per-request lists of different lengths ({sizes})")
    t0 = min((_number(s, where, "start_times") for s in starts or [] if s is not None), default=0.0)
    reqs = []
    failed = 0
    for i, (inp, out, ttft, itl) in enumerate(zip(*(lists[k] for k in need), strict=True)):
        at = f"{where}: request {i}"
        # A failed request: an error, or (sglang, vLLM) a TTFT of 0 and no output.
        if (errors and errors[i]) or ttft is None or out is None:
            failed += 1
            continue
        ttft_s = _number(ttft, at, "ttfts")
        if ttft_s == 0 or _count(out, at, "output_lens", 0) < 1:
            failed += 1
            continue
        if itl is not None and not isinstance(itl, list):
            raise _bad(at, "itls", "a list of gaps", itl)
        gaps = [_number(g, at, "itls") for g in itl or []]
        if any(g < 0 for g in gaps):
            raise ResultFileError(f"{at}: field 'itls': negative gap {min(gaps):.6g} s")
        start = None if starts is None or starts[i] is None else float(starts[i])
        reqs.append(
            _request(
                at,
                prompt_len=_count(inp, at, "input_lens", 1),
                output_len=int(out),
                ttft_s=ttft_s,
                e2e_s=ttft_s + sum(gaps),
                sent=None if start is None else start - t0,
            )
        )
    server_info = _object(doc, "server_info", where)
    model = doc.get("model_id") or server_info.get("model_path") or doc.get("tag")
    version = server_info.get("version")
    return MeasuredRun(
        name=name,
        source=source,
        path=path,
        requests=tuple(reqs),
        request_rate=rate,
        max_concurrency=conc,
        model=None if model is None else str(model),
        engine=source if source == "vllm" else str(doc.get("backend") or source),
        engine_version=None if version is None else str(version),
        num_failed=failed,
    )


def _run_name(given: Any, rate: float, conc: int | None) -> str:
    if conc is not None and math.isinf(rate):
        return f"concurrency {conc}"
    return f"rate {given}" + ("" if conc is None else f" conc {conc}")


# ---- GuideLLM --------------------------------------------------------------------------------


def _guidellm_runs(doc: Mapping[str, Any], path: str) -> list[MeasuredRun]:
    benchmarks = _list(doc, "benchmarks", path) or []
    runs = []
    for k, bench in enumerate(benchmarks):
        where = f"{path}: benchmark {k}"
        if not isinstance(bench, Mapping):
            raise ResultFileError(f"{where}: expected an object, got {_show(bench)}")
        strategy = _object(_object(bench, "args", where), "strategy", f"{where}: args")
        at = f"{where}: args: strategy"
        kind = str(strategy.get("type_", "unknown"))
        rate, conc = math.inf, None
        if kind == "synchronous":
            conc = 1
        elif kind == "concurrent":
            conc = _conc(strategy.get("streams"), at, "streams")
        elif kind in ("constant", "poisson"):
            rate = _rate(strategy.get("rate"), at, "rate")
        elif kind == "throughput":
            conc = _conc(strategy.get("max_concurrency"), at, "max_concurrency")
        records = _object(bench, "requests", where)
        successful = _list(records, "successful", f"{where}: requests") or []
        errored = _list(records, "errored", f"{where}: requests") or []
        reqs = []
        starts = []
        first_send = math.inf
        failed = len(errored)
        for i, r in enumerate(successful):
            at = f"{where}: request {i}"
            if not isinstance(r, Mapping):
                raise ResultFileError(f"{at}: expected an object, got {_show(r)}")
            start = _number(r.get("start_time"), at, "start_time")
            first_send = min(first_send, start)
            if _count(r.get("output_tokens"), at, "output_tokens", 0) < 1:
                failed += 1  # nothing generated: no TTFT to calibrate on
                continue
            last = "last_token_time" if r.get("last_token_time") is not None else "end_time"
            reqs.append(
                _request(
                    at,
                    prompt_len=_count(r.get("prompt_tokens"), at, "prompt_tokens", 1),
                    output_len=int(r["output_tokens"]),
                    ttft_s=_number(r.get("first_token_time"), at, "first_token_time") - start,
                    e2e_s=_number(r.get(last), at, last) - start,
                    sent=None,
                )
            )
            starts.append(start)
        # Send times relative to the run's first send.
        reqs = [
            dataclasses.replace(m, sent_at=s - first_send)
            for m, s in zip(reqs, starts, strict=True)
        ]
        label = kind if conc is None or kind != "concurrent" else f"concurrent@{conc}"
        if kind in ("constant", "poisson"):
            label = f"{kind}@{rate:g}"
        worker = _object(bench, "worker", where)
        backend = worker.get("backend_model") or doc.get("model")
        runs.append(
            MeasuredRun(
                name=label,
                source="guidellm",
                path=path,
                requests=tuple(reqs),
                request_rate=rate,
                max_concurrency=conc,
                model=None if backend is None else str(backend),
                engine=str(worker.get("backend_type") or "openai_http"),
                num_failed=failed,
            )
        )
    if not any(r.requests for r in runs):
        raise ResultFileError(f"{path}: GuideLLM report without successful requests")
    return runs


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
    return [_lists_run(obj, f"{p}:{i}", "sglang") for i, obj in lines]


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _document_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    if doc.get("format") == "radixsched-bench-sweep":
        runs = []
        for i, r in enumerate(_list(doc, "runs", str(p)) or []):
            if not isinstance(r, Mapping):
                raise ResultFileError(f"{p}: run {i}: expected an object, got {_show(r)}")
            runs.append(_radixsched_run(r, str(p), str(r.get("stage", f"run {i}"))))
        if not runs:
            raise ResultFileError(f"{p}: sweep without runs")
        return runs
    if "results" in doc and "requests" in doc:
        return [_radixsched_run(doc, str(p), "run")]
    if "benchmarks" in doc:
        return _guidellm_runs(doc, str(p))
    if "ttfts" in doc or "input_lens" in doc or "model_id" in doc:
        return [_lists_run(doc, str(p), "vllm")]
    if doc.get("format") == "radixsched-calibration":
        raise ResultFileError(
            f"{p}: a calibration file, not a result file (give it to "
            "'radixsched simulate --calibration')"
        )
    raise ResultFileError(f"{p}: not a result file radixsched knows")


def read_result_files(paths: Sequence[str | Path]) -> list[MeasuredRun]:
    return [run for p in paths for run in read_result_file(p)]
