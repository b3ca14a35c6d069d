"""GuideLLM reports (``benchmarks.json``), versions 0.2 through 0.8, the version detected from
the file and named in every message.

Layouts, as the real clients write them (fixtures in tests/data/bench_tools/guidellm-*):

- 0.2-0.3: ``{"benchmarks": [{"args": {"strategy": {"type_", "rate" | "streams"}},
  "request_loader": {"data": "prefix_tokens=..,prompt_tokens=.."}, "worker": {"backend_model"},
  "requests": {"successful": [{"prompt_tokens", "output_tokens", "start_time",
  "first_token_time", "last_token_time", "end_time"}]}}]}`` (epoch seconds).
- 0.4-0.6: a top-level ``args`` (``data``: the data specs as given), ``metadata`` from 0.5;
  per benchmark ``config.strategy`` and ``config.backend.model``; per request
  ``request_start_time``, ``request_end_time``, ``info.timings.first_token_iteration`` and
  ``last_token_iteration``.
- 0.7-0.8 (``metadata.version`` 2): the run's spec in ``config.spec`` (``data``: synthetic
  specs with ``prefix_buckets``); 0.8 adds per-request ``cached_tokens`` and ``conclusions``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from radixsched.sim.calibrate.readers.cost_note import unknown_structure
from radixsched.sim.calibrate.readers.fields import (
    _concurrency,
    _count,
    _list,
    _number,
    _object,
    _rate,
    _request,
    _show,
)
from radixsched.sim.calibrate.runs import (
    MeasuredRequest,
    MeasuredRun,
    PrefixBucket,
    ResultFileError,
)

SUPPORTED = "0.2-0.8"
_SUPPORTED_MINORS = range(2, 9)


@dataclass(frozen=True)
class _Layout:
    version: str  # as named in messages: "0.8.1", "0.4", "0.2-0.3"
    legacy: bool  # 0.2-0.3 request fields (start_time, first_token_time, ...)


def is_guidellm(doc: Mapping[str, Any]) -> bool:
    return "benchmarks" in doc


def _unsupported(doc: Mapping[str, Any], path: str, version: Any) -> ResultFileError:
    fields = ", ".join(sorted(str(k) for k in doc)[:8])
    return ResultFileError(
        f"{path}: GuideLLM report version {version} is not supported (fields {fields}); "
        f"supported: {SUPPORTED}"
    )


def detect(doc: Mapping[str, Any], path: str) -> _Layout:
    """The report's layout; an unknown one raises naming its version and fields."""
    meta = doc.get("metadata")
    if isinstance(meta, Mapping) and meta.get("guidellm_version") is not None:
        version = str(meta["guidellm_version"])
        m = re.match(r"(\d+)\.(\d+)", version)
        if not m or int(m[1]) != 0 or int(m[2]) not in _SUPPORTED_MINORS:
            raise _unsupported(doc, path, version)
        return _Layout(version, legacy=int(m[2]) < 4)
    if meta is not None:  # a metadata block without the version: a layout not seen
        schema = meta.get("version") if isinstance(meta, Mapping) else meta
        raise _unsupported(doc, path, f"unknown (metadata version {_show(schema)})")
    benches = _list(doc, "benchmarks", path) or []
    first = benches[0] if benches and isinstance(benches[0], Mapping) else {}
    if isinstance(doc.get("args"), Mapping):
        return _Layout("0.4", legacy=False)  # 0.4 wrote no metadata
    if "config" in first and "args" not in first:
        raise _unsupported(doc, path, "unknown (per-benchmark 'config', no metadata)")
    return _Layout("0.2-0.3", legacy=True)


def guidellm_runs(doc: Mapping[str, Any], path: str) -> list[MeasuredRun]:
    layout = detect(doc, path)
    where = f"{path}: GuideLLM {layout.version} report"
    benchmarks = _list(doc, "benchmarks", where) or []
    prefixes, note = _structure(doc, benchmarks, layout)
    runs = []
    for k, bench in enumerate(benchmarks):
        at = f"{where}: benchmark {k}"
        if not isinstance(bench, Mapping):
            raise ResultFileError(f"{at}: expected an object, got {_show(bench)}")
        runs.append(_run(doc, bench, at, path, layout, prefixes, note))
    if not any(r.requests for r in runs):
        raise ResultFileError(f"{where} without successful requests")
    return runs


def _strategy(bench: Mapping[str, Any], where: str, layout: _Layout) -> tuple[str, float, Any]:
    """(label, request rate, max concurrency) of one benchmark's strategy."""
    holder = "args" if layout.legacy else "config"
    strategy = _object(_object(bench, holder, where), "strategy", f"{where}: {holder}")
    at = f"{where}: {holder}: strategy"
    kind = str(strategy.get("type_", "unknown"))
    if kind == "synchronous":
        return kind, math.inf, 1
    if kind == "concurrent":
        conc = _concurrency(strategy.get("streams"), at, "streams")
        return f"concurrent@{conc}", math.inf, conc
    if kind in ("constant", "poisson", "async") and strategy.get("rate") is not None:
        # (0.4+ also record a max_concurrency here: the worker pool's cap, not a limit the
        # benchmark set.)
        rate = _rate(strategy.get("rate"), at, "rate")
        return f"{kind}@{rate:g}", rate, None
    if kind == "throughput":
        return kind, math.inf, _concurrency(strategy.get("max_concurrency"), at, "max_concurrency")
    return kind, math.inf, None  # (replayed all at once)


def _run(
    doc: Mapping[str, Any],
    bench: Mapping[str, Any],
    where: str,
    path: str,
    layout: _Layout,
    prefixes: tuple[PrefixBucket, ...] | None,
    note: str | None,
) -> MeasuredRun:
    label, rate, conc = _strategy(bench, where, layout)
    records = _object(bench, "requests", where)
    successful = _list(records, "successful", f"{where}: requests") or []
    failed = len(_list(records, "errored", f"{where}: requests") or [])
    reqs: list[tuple[float, MeasuredRequest]] = []
    for i, r in enumerate(successful):
        at = f"{where}: request {i}"
        if not isinstance(r, Mapping):
            raise ResultFileError(f"{at}: expected an object, got {_show(r)}")
        got = _legacy_request(r, at) if layout.legacy else _request_v4(r, at)
        if got is None:
            failed += 1  # nothing generated: no TTFT to calibrate on
        else:
            reqs.append(got)
    first_send = min((s for s, _ in reqs), default=0.0)
    chunks = [_token_chunks(r) for r in successful if isinstance(r, Mapping)]
    return MeasuredRun(
        name=label,
        source="guidellm",
        path=path,
        requests=tuple(replace(m, sent_at=s - first_send) for s, m in reqs),
        request_rate=rate,
        max_concurrency=conc,
        model=_model(doc, bench, layout, where),
        engine="openai_http",
        num_failed=failed,
        prefixes=prefixes,
        structure_note=note,
        tokens_per_chunk=_per_chunk(reqs, chunks),
        tool_version=layout.version,
    )


def _token_chunks(r: Mapping[str, Any]) -> int | None:
    """The streamed chunks that carried tokens (GuideLLM 0.6+: ``info.timings.token_iterations``)."""
    info = r.get("info")
    timings = info.get("timings") if isinstance(info, Mapping) else None
    n = timings.get("token_iterations") if isinstance(timings, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _per_chunk(reqs: list[tuple[float, MeasuredRequest]], chunks: list[int | None]) -> float | None:
    """Output tokens per streamed chunk over the requests that recorded their chunks."""
    pairs = [(m.output_len, c) for (_, m), c in zip(reqs, chunks, strict=False) if c]
    return sum(o for o, _ in pairs) / sum(c for _, c in pairs) if pairs else None


def _legacy_request(r: Mapping[str, Any], at: str) -> tuple[float, MeasuredRequest] | None:
    start = _number(r.get("start_time"), at, "start_time")
    if _count(r.get("output_tokens"), at, "output_tokens", 0) < 1:
        return None
    last = "last_token_time" if r.get("last_token_time") is not None else "end_time"
    m = _request(
        at,
        prompt_len=_count(r.get("prompt_tokens"), at, "prompt_tokens", 1),
        output_len=int(r["output_tokens"]),
        ttft_s=_number(r.get("first_token_time"), at, "first_token_time") - start,
        e2e_s=_number(r.get(last), at, last) - start,
        sent=None,
    )
    return start, m


def _request_v4(r: Mapping[str, Any], at: str) -> tuple[float, MeasuredRequest] | None:
    start = _number(r.get("request_start_time"), at, "request_start_time")
    if _count(r.get("output_tokens"), at, "output_tokens", 0) < 1:
        return None
    timings = _object(_object(r, "info", at), "timings", f"{at}: info")
    tat = f"{at}: info: timings"
    if timings.get("last_token_iteration") is not None:
        end = _number(timings["last_token_iteration"], tat, "last_token_iteration")
    else:
        end = _number(r.get("request_end_time"), at, "request_end_time")
    cached = r.get("cached_tokens")
    m = _request(
        at,
        prompt_len=_count(r.get("prompt_tokens"), at, "prompt_tokens", 1),
        output_len=int(r["output_tokens"]),
        ttft_s=_number(timings.get("first_token_iteration"), tat, "first_token_iteration") - start,
        e2e_s=end - start,
        sent=None,
        cached=None if cached is None else _count(cached, at, "cached_tokens", 0),
    )
    return start, m


def _model(
    doc: Mapping[str, Any], bench: Mapping[str, Any], layout: _Layout, where: str
) -> str | None:
    if layout.legacy:
        model = _object(bench, "worker", where).get("backend_model") or doc.get("model")
    else:
        config = _object(bench, "config", where)
        model = _object(config, "backend", f"{where}: config").get("model")
    return None if model is None else str(model)


# ---- the prompts' prefix structure ---------------------------------------------------------


def _data_specs(doc: Mapping[str, Any], benchmarks: list[Any]) -> list[Any]:
    """The data specs the run was given, as recorded (strings or objects)."""
    config = doc.get("config")
    if isinstance(config, Mapping) and isinstance(config.get("spec"), Mapping):
        data = config["spec"].get("data")  # 0.7+
    elif isinstance(doc.get("args"), Mapping):
        data = doc["args"].get("data")  # 0.4-0.6
    else:
        first = benchmarks[0] if benchmarks and isinstance(benchmarks[0], Mapping) else {}
        loader = first.get("request_loader")
        data = loader.get("data") if isinstance(loader, Mapping) else None  # 0.2-0.3
    if data is None:
        return []
    return data if isinstance(data, list) else [data]


def _synthetic(spec: Any) -> dict[str, Any] | None:
    """A synthetic data spec as a dict (JSON, ``key=value,...``, or an object), else None."""
    if isinstance(spec, Mapping):
        return dict(spec) if "prompt_tokens" in spec else None
    if not isinstance(spec, str):
        return None
    text = spec.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) and "prompt_tokens" in parsed else None
    pairs = [p.split("=", 1) for p in text.split(",")]
    if not all(len(p) == 2 for p in pairs):
        return None  # a dataset name or path
    out: dict[str, Any] = {k.strip(): v.strip() for k, v in pairs}
    return out if "prompt_tokens" in out else None


def _buckets(spec: dict[str, Any], where: str) -> tuple[PrefixBucket, ...]:
    raw = spec.get("prefix_buckets")
    if raw:
        if not isinstance(raw, list):
            raise ResultFileError(f"{where}: field 'prefix_buckets': expected a list")
        items = [b if isinstance(b, Mapping) else {} for b in raw]
    elif spec.get("prefix_tokens") is not None:
        items = [{"prefix_tokens": spec["prefix_tokens"], "prefix_count": spec.get("prefix_count")}]
    else:
        return ()
    out = []
    for b in items:
        tokens = _count(_int(b.get("prefix_tokens", 0)), where, "prefix_tokens", 0)
        count = _count(_int(b.get("prefix_count") or 1), where, "prefix_count", 1)
        weight = _number(_int(b.get("bucket_weight", 100)), where, "bucket_weight")
        if tokens and weight > 0:
            out.append(PrefixBucket(weight, count, tokens))
    return tuple(out)


def _int(value: Any) -> Any:
    """A ``key=value`` spec's number as a number (other values as they are)."""
    if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
        return int(value)
    return value


def _structure(
    doc: Mapping[str, Any], benchmarks: list[Any], layout: _Layout
) -> tuple[tuple[PrefixBucket, ...] | None, str | None]:
    """(prefix buckets, note): the synthetic spec's shared prefixes; None and a note when the
    data is not one synthetic spec (its prompts are not recorded)."""
    where = f"GuideLLM {layout.version} data spec"
    specs = _data_specs(doc, benchmarks)
    parsed = [_synthetic(s) for s in specs]
    if len(parsed) == 1 and parsed[0] is not None:
        return _buckets(parsed[0], where), None
    shown = _show(specs[0] if len(specs) == 1 else specs)
    return None, unknown_structure(f"GuideLLM {layout.version}: data {shown} is not synthetic")
