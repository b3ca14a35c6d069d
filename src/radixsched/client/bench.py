"""Load client: replay a simulator workload against a running server and measure it.

Requests come from the simulator's registry (``radixsched.sim.workloads.load.load_workload``), are
sent as token ids to ``POST /generate`` with ``stream: true`` at their arrival times (Poisson
or trace timestamps; ``inf`` = all at once; no rate: ``sim.settings.runconfig.RATE_RULE``), at most
``max_concurrency`` in flight. Generated workloads take ``BENCH_WORKLOAD_DEFAULTS`` for every
param the spec does not set: sizes a small model on a CPU serves in seconds, not the
simulator's (a 2,048-token system prompt, 256 output tokens). The result
is a ``PolicyResult`` built by the simulator's own ``summarize`` from client-side timestamps, so
``ttft_s``, ``itl_s``, ``e2e_s``, ``throughput`` ... mean exactly what they mean in a simulation
and a run can be put next to its simulation (same JSON document shape as ``simulate --json``).

Client-side definitions: arrival = when the request was sent; a streamed chunk carrying k new
tokens (``meta_info.completion_tokens`` grows by k) at time t puts them at evenly spaced times
between the previous chunk and t (the first chunk's tokens all at t), like SGLang's
bench_serving. ``queue_wait_s`` is not observable from a client and is reported empty (n=0).
The hit rate is the server's: the growth of ``radixsched_cached_prompt_tokens_total`` over
``radixsched_prompt_tokens_total`` during the run, read from ``/metrics`` with
prometheus-client's text parser (falling back to the sum of ``meta_info.cached_tokens`` when
the server has no such counters). A request that fails (an HTTP error, a timeout, a stream
that ends early) counts as aborted; ``BenchResult.failure_lines`` groups them by reason.

Behind sglang-router (which answers neither ``/server_info`` nor ``/metrics``), the workers it
lists at ``/workers`` give the limits (the first one) and the hit rate (the sum of every
worker's counters), and the result reports each worker's requests and hit rate.

Fitting the workload to the server (``/server_info``, else ``/v1/models``): token ids are taken
modulo the vocabulary size (a deterministic map, so shared prefixes stay shared); a request's
``max_new_tokens`` is capped to half the context and its prompt truncated at the end so that
prompt + output fit the context (prefixes stay intact). ``ignore_eos`` is set, as the
simulator assumes fixed output lengths.

The HTTP client is aiohttp (imported when a run starts), one session per run with at most
``max_concurrency`` connections: the client is the measuring instrument and shares the CPUs
with the server, and aiohttp costs 3-4x less CPU per streamed chunk than httpx did. No total
timeout cuts a long generation; ``timeout_s`` bounds each wait for data (a stalled stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixsched.client.workers import (
    WorkerCounters,
    WorkerShare,
    router_worker_urls,
    share_lines,
    worker_counters,
    worker_shares,
)
from radixsched.request import FinishReason, FinishState, Req, SamplingParams
from radixsched.results.metrics import PolicyResult, summarize
from radixsched.results.requests import SloTargets, failure_reasons
from radixsched.results.writers import to_jsonable, write_document
from radixsched.server.metrics import CACHED_PROMPT_TOKENS, PROMPT_TOKENS
from radixsched.sim.heap import frozen_heap
from radixsched.sim.workloads.load import Workload, load_workload, optimal_hit_rate

MAX_ERRORS_KEPT = 20

# bench's sizes for generated workloads, for every param a spec leaves out: a small model on
# a CPU (SmolLM2-135M) serves each of them in seconds. Traces are sent as they are.
BENCH_WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "shared-prefix": dict(groups=8, prompts=8, system_len=256, question_len=32, output_len=32),
    "multi-turn": dict(
        conversations=8, turns=3, first_len=128, turn_len=32, output_len=32, think_time_s=0.5
    ),
    "tree-of-thought": dict(
        trees=4, depth=3, branching=2, root_len=128, step_len=32, output_len=32, think_time_s=0.5
    ),
    "few-shot": dict(questions=64, shots=3, shot_len=64, question_len=32, num_subjects=8),
}
DEFAULT_BENCH_WORKLOAD = "shared-prefix"


class BenchError(Exception):
    """The server cannot be benchmarked (unreachable, unexpected answers)."""


@dataclass(frozen=True)
class BenchConfig:
    url: str
    workload: str = DEFAULT_BENCH_WORKLOAD
    request_rate: float | None = None  # None: sim.settings.runconfig.RATE_RULE
    num_requests: int | None = None
    max_concurrency: int | None = None
    api_key: str | None = None
    seed: int = 0
    timeout_s: float = 600.0
    temperature: float = 0.0
    slo: SloTargets = field(default_factory=SloTargets)
    flush_cache: bool = False  # POST /flush_cache before the run (each run starts cold)


def url_problem(url: str, flag: str = "--url") -> str | None:
    """Why ``url`` cannot be a server's base URL (``http[s]://HOST[:PORT][/PATH]``), or None:
    checked before a run, as aiohttp would only fail on it with a traceback."""
    from urllib.parse import urlsplit

    expected = "expected http://HOST[:PORT][/PATH]"
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:  # a bad port, an unclosed IPv6 bracket
        return f"{flag} {url!r}: {expected}: {e}"
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            return f"{flag} {url!r}: {expected}, got no host"
    elif parts.netloc:
        return f"{flag} {url!r}: {expected}, got the scheme {parts.scheme!r}"
    else:
        hint = f" (did you mean http://{url.strip()}?)" if url.strip() else ""
        return f"{flag} {url!r}: {expected}, got no http:// or https:// scheme{hint}"
    if port == 0:
        return f"{flag} {url!r}: port 0 is not a port a server listens on"
    if parts.query or parts.fragment:
        return f"{flag} {url!r}: a base URL takes no ?query or #fragment"
    return None


@dataclass(frozen=True)
class ServerLimits:
    model: str
    vocab_size: int
    context_len: int
    policy: str | None
    info: dict[str, Any]
    # Behind sglang-router: the workers it lists (limits come from the first one).
    workers: tuple[str, ...] = ()


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
    errors: tuple[str, ...]  # "request id: reason", the first MAX_ERRORS_KEPT
    records: tuple[RequestRecord, ...] = ()
    requests: tuple[Req, ...] = ()  # as summarised (client-side times)
    per_worker: tuple[WorkerShare, ...] = ()  # behind a router: what each worker served

    def to_document(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``{"meta", "workload", "config", "results": [one result], "requests": [...]}``, as
        ``simulate --json`` plus one record per request (``request_records``), which
        ``radixsched calibrate`` replays."""
        cfg = dataclasses.asdict(self.config)
        cfg.pop("api_key", None)
        limits = {"vocab_size": self.server.vocab_size, "context_len": self.server.context_len}
        return {
            "meta": to_jsonable(meta or {}),
            "workload": to_jsonable(self.workload_info),
            "config": to_jsonable({"bench": cfg, "server": self.server.info, "limits": limits}),
            "results": [to_jsonable(self.result.to_json())],
            "requests": request_records(self.records),
        }

    def failure_lines(self) -> list[str]:
        """Failed requests grouped by reason, most frequent first (empty when none failed)."""
        if not self.num_failed:
            return []
        r = self.result
        lines = [f"{self.num_failed:,} of {r.num_requests:,} requests failed:"]
        for example, n in failure_reasons(self.requests):
            lines.append(f"  {n:,} x {example}")
        return lines

    def render(self) -> str:
        from radixsched.results.format import aligned_rows, fmt_percent, fmt_rate, fmt_seconds

        r = self.result
        info = self.workload_info
        rate = info.get("request_rate")
        lines = [
            f"server {self.config.url} · model {self.server.model} · policy {r.policy}",
            f"workload {info['name']}: {info['params_text']}",
            f"         arrivals: {info['arrivals']}"
            + (" (no request rate given)" if rate is None else ""),
            f"requests {r.num_requests:,}: {r.num_completed:,} completed, {self.num_failed:,} "
            f"failed · hit rate {fmt_percent(r.hit_rate)} (optimal "
            f"{fmt_percent(r.optimal_hit_rate)}; {r.cached_tokens:,} of {r.prompt_tokens:,} "
            f"prompt tokens cached, from {r.extra.get('hit_rate_source')})",
            *share_lines(self.per_worker),
        ]
        stats = ("mean", "std", "p50", "p90", "p95", "p99", "max")
        rows = [["latency", *stats]]
        for label, name in (
            ("TTFT", "ttft_s"),
            ("ITL", "itl_s"),
            ("TPOT", "tpot_s"),
            ("E2E", "e2e_s"),
        ):
            s = getattr(r, name)
            rows.append([label, *(fmt_seconds(getattr(s, k)) if s.n else "-" for k in stats)])
        lines.extend(aligned_rows(rows))
        t = r.throughput
        lines.append(
            f"throughput {fmt_rate(t.requests_per_s)} req/s, {fmt_rate(t.input_tokens_per_s)} "
            f"input tok/s, {fmt_rate(t.output_tokens_per_s)} output tok/s; makespan "
            f"{fmt_seconds(r.makespan_s)}"
        )
        if r.slo is not None:
            lines.append(
                f"SLO ({self.config.slo.describe()}): {r.slo.met:,} of {r.slo.total:,} requests "
                f"met it ({fmt_percent(r.slo.attainment)}), goodput "
                f"{fmt_rate(r.slo.goodput_requests_per_s)} req/s"
            )
        lines.extend(self.failure_lines())
        return "\n".join(lines)


def request_records(records: tuple[RequestRecord, ...]) -> list[dict[str, Any]]:
    """What calibration replays: per request its sizes, when it was sent, and when each token
    arrived (seconds from the run's start; ``error`` set and times empty for a failure). Every
    time is rounded to 0.1 us alike: rounding keeps their order (the first token and the finish
    often arrive in one message, at the same instant)."""
    out = []
    for rec in records:
        end = rec.finished_at
        row: dict[str, Any] = {
            "rid": rec.req.rid,
            "prompt_len": rec.req.prompt_len,
            "output_len": len(rec.token_times),
            "max_new_tokens": rec.req.sampling.max_new_tokens,
            "sent_at": round(rec.sent_at, 7),
            "token_times": [round(t, 7) for t in rec.token_times],
            "finished_at": None if end is None else round(end, 7),
        }
        if rec.error is not None or rec.finish is None:
            row["error"] = rec.error or "no finish"
        out.append(row)
    return out


def write_json(path: str, result: BenchResult, meta: dict[str, Any] | None = None) -> None:
    write_document(path, result.to_document(meta))


# ---- talking to the server -----------------------------------------------------------------


CONNECT_TIMEOUT_S = 30.0  # to get a connection (from the pool, or a new one)
READ_BUFSIZE = 1 << 20  # a streamed line may reach twice this (each chunk repeats output_ids)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _base_url(url: str) -> str:
    """``url`` with one trailing slash: requests use relative paths ("generate"), so a path
    prefix (a server behind a proxy) is kept, as httpx's ``base_url`` did."""
    return url.rstrip("/") + "/"


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a request may raise for a server or network problem (aiohttp is imported late)."""
    import aiohttp
    from aiohttp.http_exceptions import HttpProcessingError  # e.g. LineTooLong

    return (aiohttp.ClientError, HttpProcessingError, asyncio.TimeoutError, TimeoutError)


def open_session(cfg: BenchConfig, max_connections: int | None = None) -> Any:
    """An ``aiohttp.ClientSession`` for ``cfg.url`` (to use as ``async with``): ``cfg``'s API
    key, at most ``max_connections`` connections (default ``cfg.max_concurrency``, else no
    limit), no total timeout, ``cfg.timeout_s`` for each read."""
    import aiohttp

    return aiohttp.ClientSession(
        base_url=_base_url(cfg.url),
        headers=_headers(cfg.api_key),
        connector=aiohttp.TCPConnector(limit=max_connections or cfg.max_concurrency or 0),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT_S, sock_read=cfg.timeout_s
        ),
        read_bufsize=READ_BUFSIZE,
    )


async def _request(client: Any, method: str, path: str) -> tuple[int, str]:
    """(status, body text) of a small request; raises ``_network_errors()``."""
    async with client.request(method, path) as r:
        return r.status, (await r.read()).decode("utf-8", "replace")


async def fetch_limits(client: Any) -> ServerLimits:
    """The server's limits from ``/server_info``; behind sglang-router (which has none), from
    the first worker its ``/workers`` lists; else from ``/v1/models``."""
    try:
        status, body = await _request(client, "GET", "server_info")
        if status == 200:
            return _limits_of_server_info(json.loads(body))
        workers: tuple[str, ...] = ()
        listed, listing = await _request(client, "GET", "workers")
        if listed == 200:
            workers = router_worker_urls(listing)
        if workers:
            status, body = await _request(client, "GET", f"{workers[0]}/server_info")
            if status == 200:
                limits = _limits_of_server_info(json.loads(body))
                return dataclasses.replace(limits, workers=workers)
        status, body = await _request(client, "GET", "v1/models")
    except _network_errors() as e:
        raise BenchError(f"cannot reach the server: {describe_error(e, None)}") from e
    if status != 200:
        raise BenchError(f"/v1/models answered {status}: {body[:200]}")
    card = json.loads(body)["data"][0]
    if "vocab_size" not in card or "max_model_len" not in card:
        raise BenchError("the server exposes neither /server_info nor vocab_size in /v1/models")
    return ServerLimits(
        model=str(card["id"]),
        vocab_size=int(card["vocab_size"]),
        context_len=int(card["max_model_len"]),
        policy=None,
        info={"model": card["id"]},
    )


def _limits_of_server_info(info: dict[str, Any]) -> ServerLimits:
    sched = info.get("scheduler") or {}
    return ServerLimits(
        model=str(info["model"]),
        vocab_size=int(info["vocab_size"]),
        context_len=int(info["context_len"]),
        policy=sched.get("schedule_policy"),
        info=info,
    )


async def read_worker_counters(
    client: Any, workers: tuple[str, ...]
) -> dict[str, WorkerCounters | None]:
    """Each worker's totals from its ``/metrics`` (None for one that did not answer)."""

    async def one(url: str) -> WorkerCounters | None:
        try:
            status, text = await _request(client, "GET", f"{url}/metrics")
        except _network_errors():
            return None
        return worker_counters(text) if status == 200 else None

    found = await asyncio.gather(*(one(url) for url in workers))
    return dict(zip(workers, found, strict=True))


def counter_value(text: str, name: str) -> float | None:
    """The unlabelled sample ``name`` of a Prometheus text exposition (prometheus-client's
    parser), or None when absent or the text does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and not sample.labels:
                    return float(sample.value)
    except ValueError:
        return None
    return None


async def read_hit_counters(client: Any) -> tuple[float, float] | None:
    """(cached prompt tokens, prompt tokens) from /metrics, or None when unavailable."""
    try:
        status, text = await _request(client, "GET", "metrics")
    except _network_errors():
        return None
    if status != 200:
        return None
    prompt = counter_value(text, PROMPT_TOKENS)
    if prompt is None:
        return None
    return counter_value(text, CACHED_PROMPT_TOKENS) or 0.0, prompt


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
        if (value := getattr(req, key)) is not None:
            body[key] = value
    return body


def _finish_state(info: dict[str, Any] | None) -> FinishState:
    kind = (info or {}).get("type")
    if kind == "length":
        return FinishState(FinishReason.LENGTH)
    if kind == "stop":
        return FinishState(FinishReason.STOP)
    return FinishState(FinishReason.ABORT, str((info or {}).get("message", "")))


# aiohttp's exceptions (by class name, so any aiohttp version) -> words; the first class of
# the exception's MRO found here wins. A timeout's words end with its limit.
_TIMEOUT_WORDS = {
    "ConnectionTimeoutError": "no connection",  # connect (or a free pooled connection)
    "SocketTimeoutError": "no data",  # sock_read: a stalled stream
    "ServerTimeoutError": "no data",  # aiohttp < 3.10's sock_read timeout
    "TimeoutError": "no progress",  # asyncio's
}
_ERROR_WORDS = {
    "ServerDisconnectedError": "the server closed the connection",
    "ClientPayloadError": "the server closed the connection",  # the body ended early
    "ClientConnectorError": "cannot connect",  # refused, unresolvable ...
}


def describe_error(exc: BaseException, timeout_s: float | None) -> str:
    """A request's failure in words (aiohttp's own messages are often empty or cryptic);
    ``timeout_s``: the read timeout, if known."""
    name = type(exc).__name__
    detail = str(exc).strip()
    for cls in type(exc).__mro__:
        if cls.__name__ in _TIMEOUT_WORDS:
            what = _TIMEOUT_WORDS[cls.__name__]
            if what == "no connection":
                return f"{name}: {what} within {CONNECT_TIMEOUT_S:g} s"
            limit = "" if timeout_s is None else f" within {timeout_s:g} s (--timeout)"
            return f"{name}: {what}{limit}"
        if cls.__name__ in _ERROR_WORDS:
            return f"{name}: {_ERROR_WORDS[cls.__name__]}" + (f" ({detail})" if detail else "")
    return f"{name}: {detail}" if detail else name


async def send_one(
    client: Any, rec: RequestRecord, t0: float, temperature: float, timeout_s: float = 600.0
) -> None:
    """Stream one request on ``client`` (an ``open_session``), filling ``rec`` (never raises
    for server or network errors)."""
    # ValueError: a bad JSON line (json.JSONDecodeError), a line too long (older aiohttp)
    errors: tuple[type[BaseException], ...] = (*_network_errors(), ValueError)
    rec.sent_at = time.perf_counter() - t0
    last = rec.sent_at
    seen = 0
    try:
        async with client.post("generate", json=_payload(rec.req, temperature)) as r:
            if r.status != 200:
                body = (await r.read()).decode("utf-8", "replace")
                rec.error = f"HTTP {r.status}: {_error_message(body)}"
                return
            async for line in r.content:  # bytes, one line each (b"\n" kept)
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    err = obj["error"]
                    rec.error = str(err.get("message", err) if isinstance(err, dict) else err)
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
    except errors as e:
        rec.error = describe_error(e, timeout_s)
        return
    if rec.finish is None and rec.error is None:
        rec.error = "the stream ended without a finish reason"
    elif rec.finish is not None and rec.finish.reason is FinishReason.ABORT and rec.error is None:
        rec.error = f"aborted by the server: {rec.finish.message or 'no reason given'}"


def _error_message(body: str) -> str:
    """The message of an OpenAI-shaped error body, else the body's start."""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:200]
    except (json.JSONDecodeError, AttributeError):
        pass
    return body[:200]


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
    wl = workload or load_bench_workload(cfg)
    n = len(wl.requests)
    conc = cfg.max_concurrency or n
    async with open_session(cfg, max(conc, 1)) as client:
        server = await fetch_limits(client)
        if cfg.flush_cache:
            for url in server.workers or ("",):
                await flush_server_cache(client, f"{url}/flush_cache" if url else "flush_cache")
        reqs = [fit_request(r, server) for r in wl.requests]
        records = [RequestRecord(r) for r in reqs]
        before = await read_hit_counters(client)
        workers_before = await read_worker_counters(client, server.workers)
        sem = asyncio.Semaphore(conc)

        async def one(rec: RequestRecord) -> None:
            delay = rec.req.arrival_time - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                await send_one(client, rec, t0, cfg.temperature, cfg.timeout_s)

        # The collector off the client's existing heap while it measures: a full collection
        # of a large process (a test runner's) took 100-180 ms, a stall in the latencies of
        # every request in flight (what the run allocates is still collected).
        gc.collect()
        with frozen_heap():
            t0 = time.perf_counter()
            await asyncio.gather(*(one(rec) for rec in records))
            wall = time.perf_counter() - t0
        after = await read_hit_counters(client)
        workers_after = await read_worker_counters(client, server.workers)
    shares = worker_shares(workers_before, workers_after) if server.workers else None

    finished = [_as_finished_req(rec) for rec in records]
    errors = tuple(f"{rec.req.rid}: {rec.error}" for rec in records if rec.error is not None)
    client_cached = sum(rec.cached_tokens for rec in records if rec.error is None)
    client_prompt = sum(rec.req.prompt_len for rec in records if rec.error is None)
    cached, prompt, hit_source = _served_from_cache(
        shares, before, after, (client_cached, client_prompt)
    )
    hit = cached / prompt if prompt > 0 else 0.0
    base = summarize(
        server.policy or "server",
        finished,
        optimal_hit_rate=optimal_hit_rate(reqs),
        wall_s=wall,
        retractions=0,
        preemptions=0,
        slo=cfg.slo,
        extra={
            "source": "bench",
            "hit_rate_source": hit_source,
            "client_hit_rate": client_cached / client_prompt if client_prompt else 0.0,
            "num_failed": len(errors),
            "model": server.model,
            **({"workers": [w.to_json() for w in shares]} if shares else {}),
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
    return BenchResult(
        result=result,
        server=server,
        workload_info=_workload_info(cfg, wl, result.optimal_hit_rate),
        config=cfg,
        num_failed=len(errors),
        errors=errors[:MAX_ERRORS_KEPT],
        records=tuple(records),
        requests=tuple(finished),
        per_worker=shares or (),
    )


def _workload_info(cfg: BenchConfig, wl: Workload, optimal_hit_rate: float) -> dict[str, Any]:
    rate = cfg.request_rate
    return {
        "spec": cfg.workload,
        "name": wl.name,
        "params": wl.params,
        "params_text": wl.params_text,
        "num_requests": len(wl.requests),
        "request_rate": None if rate is None else rate if math.isfinite(rate) else "inf",
        "optimal_hit_rate": optimal_hit_rate,
        "arrivals": wl.arrivals,
    }


def _served_from_cache(
    shares: tuple[WorkerShare, ...] | None,
    before: tuple[float, float] | None,
    after: tuple[float, float] | None,
    client_counts: tuple[int, int],
) -> tuple[float, float, str]:
    """(cached prompt tokens, prompt tokens, where they were read) over the run: the workers'
    counters behind a router, else the server's, else the answers' ``cached_tokens``."""
    if shares:
        cached = float(sum(w.cached_tokens for w in shares))
        prompt = float(sum(w.prompt_tokens for w in shares))
        return cached, prompt, f"the {len(shares)} workers' /metrics"
    if before is not None and after is not None:
        return after[0] - before[0], after[1] - before[1], "server /metrics"
    return float(client_counts[0]), float(client_counts[1]), "meta_info.cached_tokens"


def load_bench_workload(cfg: BenchConfig) -> Workload:
    """The workload ``cfg`` names, generated params defaulting to ``BENCH_WORKLOAD_DEFAULTS``."""
    return load_workload(
        cfg.workload,
        request_rate=cfg.request_rate,
        num_requests=cfg.num_requests,
        seed=cfg.seed,
        defaults=BENCH_WORKLOAD_DEFAULTS,
    )


async def flush_server_cache(client: Any, path: str = "flush_cache") -> None:
    """Empty the server's prefix cache (``POST /flush_cache``, or ``path``: one worker's),
    waiting for it to go idle."""
    for _ in range(100):
        try:
            status, body = await _request(client, "POST", path)
        except _network_errors() as e:
            raise BenchError(f"cannot flush the server's cache: {describe_error(e, 30.0)}") from e
        if status == 200:
            return
        if status == 404:
            raise BenchError("the server has no /flush_cache: run without --flush-cache")
        await asyncio.sleep(0.1)
    raise BenchError(f"/flush_cache kept answering {status}: {body[:200]}")


# ---- the calibrating sweep ---------------------------------------------------------------------

SWEEP_FORMAT = "radixsched-bench-sweep"


@dataclass(frozen=True)
class SweepResult:
    runs: tuple[tuple[str, BenchResult], ...]  # (stage name, result) in the order run

    @property
    def num_failed(self) -> int:
        return sum(r.num_failed for _, r in self.runs)

    def to_document(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``{"format", "version", "meta", "runs": [{"stage", <a bench document less meta>}]}``."""
        runs = []
        for name, r in self.runs:
            doc = r.to_document()
            doc.pop("meta")
            runs.append({"stage": name, **doc})
        return {"format": SWEEP_FORMAT, "version": 1, "meta": to_jsonable(meta or {}), "runs": runs}

    def failure_lines(self) -> list[str]:
        """Each stage's failures grouped by reason (empty when none failed)."""
        lines: list[str] = []
        for name, r in self.runs:
            lines.extend(
                f"{name}: {line}" if k == 0 else line for k, line in enumerate(r.failure_lines())
            )
        return lines

    def render(self) -> str:
        from radixsched.results.format import aligned_rows, fmt_rate, fmt_seconds

        rows = [
            ["stage", "sent/s", "conc", "served/s", "TTFT mean", "ITL mean", "E2E mean", "failed"]
        ]
        for name, b in self.runs:
            r, c = b.result, b.config
            rate = c.request_rate
            rows.append(
                [
                    name,
                    "trace" if rate is None else "inf" if math.isinf(rate) else fmt_rate(rate),
                    "-" if c.max_concurrency is None else str(c.max_concurrency),
                    fmt_rate(r.throughput.requests_per_s),
                    *(fmt_seconds(s.mean) if s.n else "-" for s in (r.ttft_s, r.itl_s, r.e2e_s)),
                    f"{b.num_failed:,}",
                ]
            )
        return "\n".join(aligned_rows(rows))


def sweep_rates(sync_rps: float, max_rps: float, between: int) -> list[float]:
    """``between`` Poisson rates evenly spaced strictly between the synchronous and the
    throughput probe's request rates (GuideLLM's sweep does the same)."""
    lo, hi = min(sync_rps, max_rps), max(sync_rps, max_rps)
    return [lo + (hi - lo) * (k + 1) / (between + 1) for k in range(between)]


async def run_sweep(cfg: BenchConfig, *, between: int = 3, warmup: bool = True) -> SweepResult:
    """The sweep that calibrates best: synchronous (one request at a time), a throughput
    probe (every request at once, ``cfg.max_concurrency`` still applying), then ``between``
    Poisson rates between the two. Each run starts with an empty prefix cache. With
    ``warmup`` the workload is first sent once, all at once, and not recorded: an engine's
    first run of a workload's batch shapes is slower than the next (the CPU engine's first
    64-request burst of 548-token prompts took 1.1-1.4 s, later ones 0.74-0.83 s), and the
    probe would measure that instead of the server."""
    if between < 0:
        raise BenchError(f"--sweep-rates must be >= 0, got {between}")
    base = dataclasses.replace(cfg, flush_cache=True)
    if warmup:
        await run_bench(dataclasses.replace(base, request_rate=math.inf))
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


def write_sweep_json(path: str, sweep: SweepResult, meta: dict[str, Any] | None = None) -> None:
    write_document(path, sweep.to_document(meta))


__all__ = [
    "BENCH_WORKLOAD_DEFAULTS",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "SweepResult",
    "load_bench_workload",
    "run_bench",
    "run_sweep",
    "url_problem",
    "write_json",
    "write_sweep_json",
]
