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
lengths (no shared prefixes): right for their random and ShareGPT datasets.
"""

from __future__ import annotations

import gzip
import json
import math
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


def _rate(value: Any) -> float:
    if value is None or value == "inf" or value == "trace":
        return math.inf
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return math.inf
    return rate if rate > 0 else math.inf


def _conc(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    return int(value)


# ---- radixsched ---------------------------------------------------------------------------


def _radixsched_run(doc: Mapping[str, Any], path: str, name: str) -> MeasuredRun:
    records = doc.get("requests")
    if not isinstance(records, list):
        raise ResultFileError(
            f"{path}: {name}: no per-request records (written by an older radixsched bench)"
        )
    cfg = doc.get("config", {})
    bench = cfg.get("bench", {}) if isinstance(cfg, Mapping) else {}
    server = cfg.get("server", {}) if isinstance(cfg, Mapping) else {}
    limits = cfg.get("limits", {}) if isinstance(cfg, Mapping) else {}
    reqs = []
    failed = 0
    for i, r in enumerate(records):
        times = r.get("token_times") or []
        if r.get("error") or not times or r.get("finished_at") is None:
            failed += 1
            continue
        try:
            sent = float(r["sent_at"])
            reqs.append(
                MeasuredRequest(
                    prompt_len=int(r["prompt_len"]),
                    output_len=len(times),
                    ttft_s=float(times[0]) - sent,
                    e2e_s=float(r["finished_at"]) - sent,
                    sent_at=sent,
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ResultFileError(f"{path}: {name}: request {i}: bad record ({e})") from None
    wl_info = doc.get("workload", {})
    params = wl_info.get("params") if isinstance(wl_info, Mapping) else None
    workload = {
        "spec": bench.get("workload"),
        # Every param bench generated with (its own defaults fill what the spec left out).
        "name": wl_info.get("name") if isinstance(wl_info, Mapping) else None,
        "params": dict(params) if isinstance(params, Mapping) else None,
        "num_requests": bench.get("num_requests"),
        "seed": bench.get("seed", 0),
        "request_rate": bench.get("request_rate"),
        "vocab_size": limits.get("vocab_size"),
        "context_len": limits.get("context_len"),
        "rids": [r.get("rid") for r in records if not r.get("error")],
        "scheduler": server.get("scheduler") if isinstance(server, Mapping) else None,
        "kv_slots": server.get("kv_slots") if isinstance(server, Mapping) else None,
    }
    return MeasuredRun(
        name=name,
        source="radixsched",
        path=path,
        requests=tuple(reqs),
        request_rate=_rate(bench.get("request_rate")),
        max_concurrency=_conc(bench.get("max_concurrency")),
        model=server.get("model") if isinstance(server, Mapping) else None,
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


def _lists_run(doc: Mapping[str, Any], path: str, name: str, source: str) -> MeasuredRun:
    """sglang.bench_serving and vLLM's benchmark_serving share the detail lists."""
    need = ("input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if not isinstance(doc.get(k), list)]
    if missing:
        flag = "--output-details" if source == "sglang" else "--save-result --save-detailed"
        raise ResultFileError(
            f"{path}: {name}: no per-request lists ({', '.join(missing)}); rerun with {flag}"
        )
    errors = doc.get("errors") or [""] * len(doc["ttfts"])
    starts = doc.get("start_times")
    reqs = []
    failed = 0
    for i, (inp, out, ttft, itl) in enumerate(
        zip(doc["input_lens"], doc["output_lens"], doc["ttfts"], doc["itls"], strict=False)
    ):
        err = errors[i] if i < len(errors) else ""
        if err or not ttft or out is None or int(out) < 1:
            failed += 1
            continue
        gaps = [float(g) for g in (itl or [])]
        sent = None
        if isinstance(starts, list) and i < len(starts) and starts[i] is not None:
            sent = float(starts[i]) - float(min(s for s in starts if s is not None))
        reqs.append(
            MeasuredRequest(
                prompt_len=int(inp),
                output_len=int(out),
                ttft_s=float(ttft),
                e2e_s=float(ttft) + sum(gaps),
                sent_at=sent,
            )
        )
    info = doc.get("server_info") if isinstance(doc.get("server_info"), Mapping) else {}
    model = doc.get("model_id") or (info or {}).get("model_path") or doc.get("tag")
    return MeasuredRun(
        name=name,
        source=source,
        path=path,
        requests=tuple(reqs),
        request_rate=_rate(doc.get("request_rate")),
        max_concurrency=_conc(doc.get("max_concurrency")),
        model=None if model is None else str(model),
        engine=source if source == "vllm" else str(doc.get("backend") or source),
        engine_version=(info or {}).get("version"),
        num_failed=failed,
    )


# ---- GuideLLM --------------------------------------------------------------------------------


def _guidellm_runs(doc: Mapping[str, Any], path: str) -> list[MeasuredRun]:
    runs = []
    for k, bench in enumerate(doc.get("benchmarks") or []):
        strategy = ((bench.get("args") or {}).get("strategy")) or {}
        kind = str(strategy.get("type_", "unknown"))
        rate, conc = math.inf, None
        if kind == "synchronous":
            conc = 1
        elif kind == "concurrent":
            conc = _conc(strategy.get("streams"))
        elif kind in ("constant", "poisson"):
            rate = _rate(strategy.get("rate"))
        elif kind == "throughput":
            conc = _conc(strategy.get("max_concurrency"))
        requests = (bench.get("requests") or {}).get("successful") or []
        errored = (bench.get("requests") or {}).get("errored") or []
        if not requests:
            continue
        t0 = min(float(r["start_time"]) for r in requests)
        reqs = []
        for i, r in enumerate(requests):
            try:
                start = float(r["start_time"])
                reqs.append(
                    MeasuredRequest(
                        prompt_len=int(r["prompt_tokens"]),
                        output_len=int(r["output_tokens"]),
                        ttft_s=float(r["first_token_time"]) - start,
                        e2e_s=float(r.get("last_token_time") or r["end_time"]) - start,
                        sent_at=start - t0,
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ResultFileError(
                    f"{path}: benchmark {k}: request {i}: missing or bad field ({e})"
                ) from None
        label = kind if conc is None or kind != "concurrent" else f"concurrent@{conc}"
        if kind in ("constant", "poisson"):
            label = f"{kind}@{rate:g}"
        backend = (bench.get("worker") or {}).get("backend_model") or doc.get("model")
        runs.append(
            MeasuredRun(
                name=label,
                source="guidellm",
                path=path,
                requests=tuple(reqs),
                request_rate=rate,
                max_concurrency=conc,
                model=None if backend is None else str(backend),
                engine=str((bench.get("worker") or {}).get("backend_type") or "openai_http"),
                num_failed=len(errored),
            )
        )
    if not runs:
        raise ResultFileError(f"{path}: GuideLLM report without successful requests")
    return runs


# ---- dispatch --------------------------------------------------------------------------------


def read_result_file(path: str | Path) -> list[MeasuredRun]:
    """Every run in one result file, whatever tool wrote it (detected from its content)."""
    p = Path(path)
    gz = p.suffix.lower() == ".gz"
    try:
        text = gzip.decompress(p.read_bytes()).decode("utf-8") if gz else p.read_text("utf-8")
    except OSError as e:  # unreadable, or a .gz that is not gzip (BadGzipFile)
        raise ResultFileError(f"{p}: cannot read: {e.strerror or e}") from None
    except (EOFError, UnicodeDecodeError) as e:
        raise ResultFileError(f"{p}: cannot read: {e}") from None
    doc = None
    if (p.with_suffix("") if gz else p).suffix.lower() != ".jsonl":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
    if isinstance(doc, dict):
        if doc.get("format") == "radixsched-bench-sweep":
            return [
                _radixsched_run(r, str(p), str(r.get("stage", f"run {i}")))
                for i, r in enumerate(doc.get("runs") or [])
            ]
        if "results" in doc and "requests" in doc:
            return [_radixsched_run(doc, str(p), "run")]
        if "benchmarks" in doc:
            return _guidellm_runs(doc, str(p))
        if "ttfts" in doc or "input_lens" in doc or "model_id" in doc:
            return [_lists_run(doc, str(p), _run_name(doc), "vllm")]
        raise ResultFileError(f"{p}: not a result file radixsched knows")
    lines: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultFileError(f"{p}:{i}: invalid JSON: {e.msg}") from None
        if not isinstance(obj, dict):
            raise ResultFileError(f"{p}:{i}: expected a JSON object")
        lines.append((i, obj))
    runs = [_lists_run(obj, f"{p}:{i}", _run_name(obj), "sglang") for i, obj in lines]
    if not runs:
        raise ResultFileError(f"{p}: empty result file")
    return runs


def _run_name(doc: Mapping[str, Any]) -> str:
    conc = _conc(doc.get("max_concurrency"))
    rate = _rate(doc.get("request_rate"))
    if conc is not None and math.isinf(rate):
        return f"concurrency {conc}"
    return f"rate {doc.get('request_rate')}" + ("" if conc is None else f" conc {conc}")


def read_result_files(paths: Sequence[str | Path]) -> list[MeasuredRun]:
    return [run for p in paths for run in read_result_file(p)]
