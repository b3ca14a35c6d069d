"""inference-perf's reports (``report.request_lifecycle.per_request: true``): the file given is
``per_request_lifecycle_metrics.json``, a JSON list, one record per request: ``start_time``,
``end_time`` (monotonic seconds), ``info.response_metrics.output_token_times`` and
``server_usage`` (prompt and completion tokens), ``error``. The records name no stage: the
``stage_N_lifecycle_metrics.json`` files beside it give each stage's requested rate and
request count (stages run one after another, so the records, in send order, split by those
counts), and ``config.yaml`` the load type and the data (``shared_prefix``: its groups)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers.cost_note import unknown_structure
from radixsched.sim.calibrate.readers.fields import (
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

_WHO = "inference-perf report"


def is_inference_perf(doc: Any) -> bool:
    return (
        isinstance(doc, list)
        and bool(doc)
        and isinstance(doc[0], Mapping)
        and {"start_time", "end_time", "info"} <= set(doc[0])
    )


def _stages(p: Path) -> list[tuple[int, float]]:
    """(requests sent, requested rate) per stage, from the stage files beside ``p``."""
    import json

    out = []
    k = 0
    while (f := p.parent / f"stage_{k}_lifecycle_metrics.json").exists():
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ResultFileError(f"{f}: {_WHO} stage file unreadable ({e})") from None
        load = _object(doc if isinstance(doc, Mapping) else {}, "load_summary", str(f))
        sent = _count(load.get("count"), str(f), "load_summary: count", 0)
        out.append(
            (sent, _rate(load.get("requested_rate"), str(f), "load_summary: requested_rate"))
        )
        k += 1
    return out


def _config(p: Path) -> Mapping[str, Any]:
    f = p.parent / "config.yaml"
    if not f.exists():
        return {}
    import yaml

    try:
        doc = yaml.safe_load(f.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ResultFileError(f"{f}: {_WHO} config unreadable ({e})") from None
    return doc if isinstance(doc, Mapping) else {}


def _structure(config: Mapping[str, Any]) -> tuple[tuple[PrefixBucket, ...] | None, str | None]:
    raw = config.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    kind = data.get("type")
    spec = data.get("shared_prefix")
    if kind == "shared_prefix" and isinstance(spec, Mapping):
        groups = spec.get("num_unique_system_prompts", spec.get("num_groups"))
        tokens = spec.get("system_prompt_len")
        if isinstance(groups, int) and isinstance(tokens, int) and groups > 0 and tokens > 0:
            return (PrefixBucket(100.0, groups, tokens),), None
    if kind == "random":
        return (), None
    return None, unknown_structure(f"{_WHO}: data type {_show(kind)} (prompts not recorded)")


def _record(r: Any, at: str) -> tuple[float, MeasuredRequest] | None:
    if not isinstance(r, Mapping):
        raise ResultFileError(f"{at}: expected an object, got {_show(r)}")
    start = _number(r.get("start_time"), at, "start_time")
    if r.get("error"):
        return None
    info = _object(r, "info", at)
    resp = _object(info, "response_metrics", f"{at}: info")
    rat = f"{at}: info: response_metrics"
    times = _list(resp, "output_token_times", rat) or []
    if not times:
        return None
    usage = _object(resp, "server_usage", rat)
    prompt = usage.get("prompt_tokens", info.get("input_tokens"))
    output = usage.get("completion_tokens", resp.get("output_tokens"))
    m = _request(
        at,
        prompt_len=_count(prompt, at, "server_usage: prompt_tokens", 1),
        output_len=_count(output, at, "server_usage: completion_tokens", 1),
        ttft_s=_number(times[0], rat, "output_token_times") - start,
        e2e_s=_number(times[-1], rat, "output_token_times") - start,
        sent=None,
        cached=_cached(usage, f"{rat}: server_usage"),
    )
    return start, m


def _cached(usage: Mapping[str, Any], where: str) -> int | None:
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping) or details.get("cached_tokens") is None:
        return None
    return _count(details["cached_tokens"], where, "prompt_tokens_details: cached_tokens", 0)


def inference_perf_runs(records: list[Any], p: Path) -> list[MeasuredRun]:
    where = f"{p}: {_WHO}"
    stages = _stages(p)
    if not stages:
        raise ResultFileError(
            f"{where}: no stage_0_lifecycle_metrics.json beside it (the stages' rates)"
        )
    if sum(n for n, _ in stages) != len(records):
        sizes = "+".join(str(n) for n, _ in stages)
        raise ResultFileError(f"{where}: {len(records)} records, the stage files count {sizes}")
    config = _config(p)
    prefixes, note = _structure(config)
    ordered = sorted(
        enumerate(records),
        key=lambda ir: _number(
            ir[1].get("start_time") if isinstance(ir[1], Mapping) else None,
            f"{where}: request {ir[0]}",
            "start_time",
        ),
    )
    runs, first = [], 0
    for k, (sent, rate) in enumerate(stages):
        got = [_record(r, f"{where}: request {i}") for i, r in ordered[first : first + sent]]
        first += sent
        ok = [g for g in got if g is not None]
        t0 = min((s for s, _ in ok), default=0.0)
        runs.append(
            MeasuredRun(
                name=f"stage {k} rate {rate:g}" if math.isfinite(rate) else f"stage {k}",
                source="inference-perf",
                path=str(p),
                requests=tuple(_sent(m, s - t0) for s, m in ok),
                request_rate=rate,
                num_failed=len(got) - len(ok),
                model=_model(config),
                prefixes=prefixes,
                structure_note=note,
            )
        )
    return runs


def _sent(m: MeasuredRequest, at: float) -> MeasuredRequest:
    return replace(m, sent_at=at)


def _model(config: Mapping[str, Any]) -> str | None:
    server = config.get("server")
    model = server.get("model_name") if isinstance(server, Mapping) else None
    return None if model is None else str(model)
