"""Load client: replay a simulator workload against a running server and measure it.

Requests come from the simulator's registry (``radixsched.sim.workloads.load_workload``), are
sent as token ids to ``POST /generate`` with ``stream: true`` at their arrival times (Poisson
or trace timestamps; ``inf`` = all at once), at most ``max_concurrency`` in flight. The result
is a ``PolicyResult`` built by the simulator's own ``summarize`` from client-side timestamps, so
``ttft_s``, ``itl_s``, ``e2e_s``, ``throughput`` ... mean exactly what they mean in a simulation
and a run can be put next to its simulation (same JSON document shape as ``simulate --json``).

Client-side definitions: arrival = when the request was sent; a streamed chunk carrying k new
tokens (``meta_info.completion_tokens`` grows by k) at time t puts them at evenly spaced times
between the previous chunk and t (the first chunk's tokens all at t), like SGLang's
bench_serving. ``queue_wait_s`` is not observable from a client and is reported empty (n=0).
The hit rate is the server's: the growth of ``radixsched_cached_prompt_tokens_total`` over
``radixsched_prompt_tokens_total`` during the run, read from ``/metrics`` (falling back to the
sum of ``meta_info.cached_tokens`` when the server has no such counters).

Fitting the workload to the server (``/server_info``, else ``/v1/models``): token ids are taken
modulo the vocabulary size (a deterministic map, so shared prefixes stay shared); a request's
``max_new_tokens`` is capped to half the context and its prompt truncated at the end so that
prompt + output fit the context (prefixes stay intact). ``ignore_eos`` is set, as the
simulator assumes fixed output lengths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixsched.request import FinishReason, FinishState, Req, SamplingParams
from radixsched.server.metrics import CACHED_PROMPT_TOKENS, PROMPT_TOKENS, parse_counter
from radixsched.sim.metrics import PolicyResult, summarize
from radixsched.sim.workloads import Workload, load_workload, optimal_hit_rate

MAX_ERRORS_KEPT = 20


class BenchError(Exception):
    """The server cannot be benchmarked (unreachable, unexpected answers)."""


@dataclass(frozen=True)
class BenchConfig:
    url: str
    workload: str
    request_rate: float = math.inf
    num_requests: int | None = None
    max_concurrency: int | None = None
    api_key: str | None = None
    seed: int = 0
    timeout_s: float = 600.0
    temperature: float = 0.0
    flush_cache: bool = False  # POST /flush_cache before the run (each run starts cold)


@dataclass(frozen=True)
class ServerLimits:
    model: str
    vocab_size: int
    context_len: int
    policy: str | None
    info: dict[str, Any]


@dataclass
class RequestRecord:
    """Client-side observation of one request (times relative to the run's start)."""

    req: Req
    sent_at: float = 0.0
    token_times: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    finished_at: float | None = None
    finish: FinishState | None = None
    cached_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class BenchResult:
    result: PolicyResult
    server: ServerLimits
    workload_info: dict[str, Any]
    config: BenchConfig
    num_failed: int
    errors: tuple[str, ...]
    records: tuple[RequestRecord, ...] = ()

    def to_document(self) -> dict[str, Any]:
        """``{"workload", "config", "results": [one result], "requests": [...]}``, as
        ``simulate --json`` plus one record per request (``request_records``)."""
        from radixsched.sim.table import to_jsonable

        cfg = dataclasses.asdict(self.config)
        cfg.pop("api_key", None)
        limits = {"vocab_size": self.server.vocab_size, "context_len": self.server.context_len}
        return {
            "workload": to_jsonable(self.workload_info),
            "config": to_jsonable({"bench": cfg, "server": self.server.info, "limits": limits}),
            "results": [to_jsonable(self.result.to_json())],
            "requests": request_records(self.records),
        }

    def render(self) -> str:
        r = self.result
        lines = [
            f"server {self.config.url}  model {self.server.model}  policy {r.policy}",
            f"workload {self.workload_info['name']} {self.workload_info['params']}  "
            f"requests {r.num_requests} (completed {r.num_completed}, failed {self.num_failed})",
            f"hit rate {r.hit_rate:.1%} (optimal {r.optimal_hit_rate:.1%})  "
            f"prompt tokens {r.prompt_tokens}  cached {r.cached_tokens}",
        ]
        for name in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
            s = getattr(r, name)
            lines.append(
                f"{name:<7} mean {s.mean * 1e3:9.2f} ms  p50 {s.p50 * 1e3:9.2f}  "
                f"p90 {s.p90 * 1e3:9.2f}  p99 {s.p99 * 1e3:9.2f}  max {s.max * 1e3:9.2f}"
            )
        t = r.throughput
        lines.append(
            f"throughput {t.requests_per_s:.2f} req/s  {t.input_tokens_per_s:.1f} input tok/s  "
            f"{t.output_tokens_per_s:.1f} output tok/s  (makespan {r.makespan_s:.2f} s)"
        )
        lines.extend(f"error: {e}" for e in self.errors)
        return "\n".join(lines)


def request_records(records: tuple[RequestRecord, ...]) -> list[dict[str, Any]]:
    """What calibration replays: per request its sizes, when it was sent, and when each token
    arrived (seconds from the run's start; ``error`` set and times empty for a failure)."""
    out = []
    for rec in records:
        row: dict[str, Any] = {
            "rid": rec.req.rid,
            "prompt_len": rec.req.prompt_len,
            "output_len": len(rec.token_times),
            "max_new_tokens": rec.req.sampling.max_new_tokens,
            "sent_at": rec.sent_at,
            "token_times": [round(t, 7) for t in rec.token_times],
            "finished_at": rec.finished_at,
        }
        if rec.error is not None or rec.finish is None:
            row["error"] = rec.error or "no finish"
        out.append(row)
    return out


def write_json(path: str, result: BenchResult) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result.to_document(), f, indent=2, allow_nan=False)
        f.write("\n")


# ---- talking to the server -----------------------------------------------------------------


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def fetch_limits(client: Any) -> ServerLimits:
    import httpx

    try:
        r = await client.get("/server_info")
        if r.status_code == 200:
            info = r.json()
            sched = info.get("scheduler") or {}
            return ServerLimits(
                model=str(info["model"]),
                vocab_size=int(info["vocab_size"]),
                context_len=int(info["context_len"]),
                policy=sched.get("schedule_policy"),
                info=info,
            )
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach the server: {e}") from e
    if r.status_code != 200:
        raise BenchError(f"/v1/models answered {r.status_code}: {r.text[:200]}")
    card = r.json()["data"][0]
    if "vocab_size" not in card or "max_model_len" not in card:
        raise BenchError("the server exposes neither /server_info nor vocab_size in /v1/models")
    return ServerLimits(
        model=str(card["id"]),
        vocab_size=int(card["vocab_size"]),
        context_len=int(card["max_model_len"]),
        policy=None,
        info={"model": card["id"]},
    )


async def read_hit_counters(client: Any) -> tuple[float, float] | None:
    """(cached prompt tokens, prompt tokens) from /metrics, or None when unavailable."""
    import httpx

    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or PROMPT_TOKENS not in r.text:
        return None
    return parse_counter(r.text, CACHED_PROMPT_TOKENS), parse_counter(r.text, PROMPT_TOKENS)


def fit_request(req: Req, limits: ServerLimits) -> Req:
    """The request as sent: ids modulo the vocabulary, prompt + output within the context."""
    ctx = limits.context_len
    max_new = max(1, min(req.sampling.max_new_tokens, ctx // 2))
    keep = max(1, min(req.prompt_len, ctx - max_new - 1))
    ids = np.asarray(req.prompt_ids[:keep], dtype=np.int64) % limits.vocab_size
    return Req(
        rid=req.rid,
        prompt_ids=ids.astype(np.int32),
        sampling=SamplingParams(max_new_tokens=max_new, ignore_eos=True),
        priority=req.priority,
        routing_key=req.routing_key,
        extra_key=req.extra_key,
        cache_salt=req.cache_salt,
        tenant=req.tenant,
        arrival_time=req.arrival_time,
    )


def _payload(req: Req, temperature: float) -> dict[str, Any]:
    body: dict[str, Any] = {
        "input_ids": req.prompt_ids.tolist(),
        "sampling_params": {
            "max_new_tokens": req.sampling.max_new_tokens,
            "ignore_eos": req.sampling.ignore_eos,
            "temperature": temperature,
        },
        "stream": True,
    }
    for key in ("priority", "routing_key", "extra_key", "cache_salt"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    return body


def _finish_state(info: dict[str, Any] | None) -> FinishState:
    kind = (info or {}).get("type")
    if kind == "length":
        return FinishState(FinishReason.LENGTH)
    if kind == "stop":
        return FinishState(FinishReason.STOP)
    return FinishState(FinishReason.ABORT, str((info or {}).get("message", "")))


async def send_one(client: Any, rec: RequestRecord, t0: float, temperature: float) -> None:
    """Stream one request, filling ``rec`` (never raises for server or network errors)."""
    import httpx

    rec.sent_at = time.perf_counter() - t0
    last = rec.sent_at
    seen = 0
    try:
        async with client.stream("POST", "/generate", json=_payload(rec.req, temperature)) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode("utf-8", "replace")
                rec.error = f"{rec.req.rid}: HTTP {r.status_code}: {body[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    rec.error = f"{rec.req.rid}: {obj['error'].get('message', obj['error'])}"
                    return
                now = time.perf_counter() - t0
                meta = obj.get("meta_info", {})
                total = int(meta.get("completion_tokens", len(obj.get("output_ids", []))))
                k = total - seen
                if k > 0:
                    if seen == 0:
                        rec.token_times.extend([now] * k)
                    else:
                        step = (now - last) / k
                        rec.token_times.extend(last + step * (j + 1) for j in range(k))
                    seen = total
                    last = now
                rec.output_ids = list(obj.get("output_ids", rec.output_ids))
                rec.cached_tokens = int(meta.get("cached_tokens", rec.cached_tokens))
                if meta.get("finish_reason") is not None:
                    rec.finish = _finish_state(meta["finish_reason"])
                    rec.finished_at = now
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        rec.error = f"{rec.req.rid}: {type(e).__name__}: {e}"
        return
    if rec.finish is None and rec.error is None:
        rec.error = f"{rec.req.rid}: stream ended without a finish reason"


def _as_finished_req(rec: RequestRecord) -> Req:
    """A ``Req`` carrying the client's observations, for ``summarize``."""
    r = rec.req
    done = Req(rid=r.rid, prompt_ids=r.prompt_ids, sampling=r.sampling, tenant=r.tenant)
    done.output_ids = list(rec.output_ids)[: len(rec.token_times)] or [0] * len(rec.token_times)
    done.times.arrival = rec.sent_at
    done.cached_tokens = rec.cached_tokens
    if rec.error is not None or rec.finish is None:
        done.finish = FinishState(FinishReason.ABORT, rec.error or "")
        done.times.finish = rec.finished_at
        return done
    done.finish = rec.finish
    done.times.token_times = list(rec.token_times)
    done.times.first_token = rec.token_times[0] if rec.token_times else None
    done.times.finish = rec.finished_at
    return done


async def run_bench(cfg: BenchConfig, workload: Workload | None = None) -> BenchResult:
    import httpx

    wl = workload or load_workload(
        cfg.workload, request_rate=cfg.request_rate, num_requests=cfg.num_requests, seed=cfg.seed
    )
    n = len(wl.requests)
    conc = cfg.max_concurrency or n
    limits = httpx.Limits(max_connections=max(conc, 1), max_keepalive_connections=max(conc, 1))
    timeout = httpx.Timeout(cfg.timeout_s, connect=30.0)
    async with httpx.AsyncClient(
        base_url=cfg.url, headers=_headers(cfg.api_key), limits=limits, timeout=timeout
    ) as client:
        server = await fetch_limits(client)
        if cfg.flush_cache:
            await flush_server_cache(client)
        reqs = [fit_request(r, server) for r in wl.requests]
        records = [RequestRecord(r) for r in reqs]
        before = await read_hit_counters(client)
        sem = asyncio.Semaphore(conc)
        t0 = time.perf_counter()
        wall0 = time.perf_counter()

        async def one(rec: RequestRecord) -> None:
            delay = rec.req.arrival_time - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                await send_one(client, rec, t0, cfg.temperature)

        await asyncio.gather(*(one(rec) for rec in records))
        wall = time.perf_counter() - wall0
        after = await read_hit_counters(client)

    finished = [_as_finished_req(rec) for rec in records]
    errors = tuple(rec.error for rec in records if rec.error is not None)
    client_cached = sum(rec.cached_tokens for rec in records if rec.error is None)
    client_prompt = sum(rec.req.prompt_len for rec in records if rec.error is None)
    if before is not None and after is not None:
        cached, prompt = after[0] - before[0], after[1] - before[1]
        hit_source = "server /metrics"
    else:
        cached, prompt = float(client_cached), float(client_prompt)
        hit_source = "meta_info.cached_tokens"
    hit = cached / prompt if prompt > 0 else 0.0
    base = summarize(
        server.policy or "server",
        finished,
        optimal_hit_rate=optimal_hit_rate(reqs),
        wall_s=wall,
        retractions=0,
        preemptions=0,
        extra={
            "source": "bench",
            "hit_rate_source": hit_source,
            "client_hit_rate": client_cached / client_prompt if client_prompt else 0.0,
            "num_failed": len(errors),
            "model": server.model,
        },
    )
    result = dataclasses.replace(
        base,
        hit_rate=hit,
        device_hit_rate=hit,
        host_hit_rate=0.0,
        cached_tokens=int(cached),
        prompt_tokens=int(prompt),
        prefill_tokens_computed=int(prompt - cached),
    )
    workload_info = {
        "spec": cfg.workload,
        "name": wl.name,
        "params": wl.params,
        "num_requests": n,
        "request_rate": cfg.request_rate if math.isfinite(cfg.request_rate) else "inf",
        "optimal_hit_rate": result.optimal_hit_rate,
        "arrivals": wl.arrivals,
    }
    return BenchResult(
        result=result,
        server=server,
        workload_info=workload_info,
        config=cfg,
        num_failed=len(errors),
        errors=errors[:MAX_ERRORS_KEPT],
        records=tuple(records),
    )


async def flush_server_cache(client: Any) -> None:
    """Empty the server's prefix cache (``POST /flush_cache``), waiting for it to go idle."""
    import httpx

    for _ in range(100):
        try:
            r = await client.post("/flush_cache")
        except httpx.HTTPError as e:
            raise BenchError(f"cannot flush the server's cache: {e}") from e
        if r.status_code == 200:
            return
        if r.status_code == 404:
            raise BenchError("the server has no /flush_cache: run without --flush-cache")
        await asyncio.sleep(0.1)
    raise BenchError(f"/flush_cache kept answering {r.status_code}: {r.text[:200]}")


# ---- the calibrating sweep ---------------------------------------------------------------------

SWEEP_FORMAT = "radixsched-bench-sweep"


@dataclass(frozen=True)
class SweepResult:
    runs: tuple[tuple[str, BenchResult], ...]  # (stage name, result) in the order run

    def to_document(self) -> dict[str, Any]:
        return {
            "format": SWEEP_FORMAT,
            "version": 1,
            "runs": [{"stage": name, **r.to_document()} for name, r in self.runs],
        }

    def render(self) -> str:
        lines = [
            f"{'stage':<14} {'rate':>8} {'conc':>5} {'req/s':>8} {'TTFT ms':>9} {'ITL ms':>8} "
            f"{'E2E ms':>9} {'failed':>6}"
        ]
        for name, b in self.runs:
            r, c = b.result, b.config
            rate = "inf" if math.isinf(c.request_rate) else f"{c.request_rate:.2f}"
            conc = "-" if c.max_concurrency is None else str(c.max_concurrency)
            lines.append(
                f"{name:<14} {rate:>8} {conc:>5} {r.throughput.requests_per_s:8.2f} "
                f"{r.ttft_s.mean * 1e3:9.2f} {r.itl_s.mean * 1e3:8.2f} {r.e2e_s.mean * 1e3:9.2f} "
                f"{b.num_failed:>6}"
            )
        return "\n".join(lines)


def sweep_rates(sync_rps: float, max_rps: float, between: int) -> list[float]:
    """``between`` Poisson rates evenly spaced strictly between the synchronous and the
    throughput probe's request rates (GuideLLM's sweep does the same)."""
    lo, hi = min(sync_rps, max_rps), max(sync_rps, max_rps)
    return [lo + (hi - lo) * (k + 1) / (between + 1) for k in range(between)]


async def run_sweep(cfg: BenchConfig, *, between: int = 3) -> SweepResult:
    """The sweep that calibrates best: synchronous (one request at a time), a throughput
    probe (every request at once, ``cfg.max_concurrency`` still applying), then ``between``
    Poisson rates between the two. Each run starts with an empty prefix cache."""
    if between < 0:
        raise BenchError(f"--sweep-rates must be >= 0, got {between}")
    base = dataclasses.replace(cfg, flush_cache=True)
    sync = await run_bench(dataclasses.replace(base, request_rate=math.inf, max_concurrency=1))
    probe = await run_bench(dataclasses.replace(base, request_rate=math.inf))
    runs = [("synchronous", sync), ("throughput", probe)]
    rates = sweep_rates(
        sync.result.throughput.requests_per_s, probe.result.throughput.requests_per_s, between
    )
    for rate in rates:
        res = await run_bench(dataclasses.replace(base, request_rate=rate, max_concurrency=None))
        runs.append((f"rate {rate:.3g}", res))
    return SweepResult(tuple(runs))


def write_sweep_json(path: str, sweep: SweepResult) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(sweep.to_document(), f, indent=2, allow_nan=False)
        f.write("\n")


__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "SweepResult",
    "run_bench",
    "run_sweep",
    "write_json",
    "write_sweep_json",
]
