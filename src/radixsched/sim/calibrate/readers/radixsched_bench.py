"""``radixsched bench --json`` (one run) and ``bench --sweep --json`` (``"format":
"radixsched-bench-sweep"``, several): per-request ``requests`` records with send times and token
times, and the workload spec and seed, so that a replay regenerates the very prompts (shared
prefixes included)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers.fields import (
    _concurrency,
    _count,
    _list,
    _number,
    _object,
    _optional,
    _rate,
    _request,
    _show,
)
from radixsched.sim.calibrate.runs import MeasuredRun, ResultFileError


def is_radixsched(doc: Mapping[str, Any]) -> bool:
    return doc.get("format") == "radixsched-bench-sweep" or ("results" in doc and "requests" in doc)


def radixsched_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    if doc.get("format") != "radixsched-bench-sweep":
        return [_radixsched_run(doc, str(p), "run")]
    runs = []
    for i, r in enumerate(_list(doc, "runs", str(p)) or []):
        if not isinstance(r, Mapping):
            raise ResultFileError(f"{p}: run {i}: expected an object, got {_show(r)}")
        runs.append(_radixsched_run(r, str(p), str(r.get("stage", f"run {i}"))))
    if not runs:
        raise ResultFileError(f"{p}: sweep without runs")
    return runs


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
        "num_requests": _concurrency(bench.get("num_requests"), at, "num_requests"),
        "seed": _optional(bench, "seed", at, int) or 0,
        "request_rate": _rate(bench.get("request_rate"), at, "request_rate"),
        "vocab_size": _concurrency(
            limits.get("vocab_size"), f"{where}: config: limits", "vocab_size"
        ),
        "context_len": _concurrency(
            limits.get("context_len"), f"{where}: config: limits", "context_len"
        ),
        # The successful requests' ids, in the order of ``requests``.
        "rids": rids,
        "scheduler": dict(scheduler) or None,
        "kv_slots": _concurrency(server.get("kv_slots"), f"{where}: config: server", "kv_slots"),
    }
    model = server.get("model")
    return MeasuredRun(
        name=name,
        source="radixsched",
        path=path,
        requests=tuple(reqs),
        request_rate=workload["request_rate"],
        max_concurrency=_concurrency(bench.get("max_concurrency"), at, "max_concurrency"),
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
