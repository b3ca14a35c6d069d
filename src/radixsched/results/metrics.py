"""Metrics of one simulated policy run: latency distributions, cache hit rate, throughput, fairness.

Everything here is computed from finished requests (``Req``) and a ``TimeSeries`` the driver
samples; no scheduler state is read. Empty inputs never produce NaN: a statistic over no values
is 0.0 (``Stats.n`` says how many values it summarises), a rate with a zero denominator is
0.0, and Jain's index over no tenants is 1.0. ``PolicyResult.to_json`` is therefore always valid
strict JSON.

Definitions (all times on the scheduler's clock, virtual seconds in the simulator):

- hit rate = sum(cached prompt tokens) / sum(prompt tokens), token-weighted, over requests that
  were scheduled at least once (a request aborted in the queue never had a chance to hit);
- TTFT = first_token - arrival; TPOT = (finish - first_token) / (output_len - 1) for requests
  with more than one output token; ITL = every gap between consecutive token times of one
  request, pooled over requests; e2e = finish - arrival; queue wait = first_scheduled - arrival;
- latency statistics cover completed (not aborted) requests that have the timestamps involved;
- makespan = last finish - first arrival; throughputs are over the makespan and count completed
  requests only;
- each latency is summarised by mean, population standard deviation, p50, p90, p95, p99 and max
  (``Stats``);
- SLO attainment = requests that completed within every target / all requests, goodput = those
  requests per second of makespan (``slo_result``);
- overload = requests offered faster than served while a backlog builds up (``load_check``)."""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from radixsched.request import FinishReason, Req

FloatArray: TypeAlias = npt.NDArray[np.float64]
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None

# Points a report chart gets per series; more would only bloat the HTML.
REPORT_MAX_POINTS = 2000

# Keys of ``Stats.to_json``, in order.
STATS_KEYS: tuple[str, ...] = ("mean", "std", "p50", "p90", "p95", "p99", "max")


def _as_float(x: float | np.floating[Any]) -> float:
    """Python float, with NaN/inf mapped to 0.0 so results stay strict JSON."""
    v = float(x)
    return v if math.isfinite(v) else 0.0


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Distribution statistics
# ---------------------------------------------------------------------------------------------


class Stats(NamedTuple):
    """Summary of a sample. Percentiles use numpy's linear interpolation between order
    statistics (``np.percentile`` default): p50 of [1, 2, 3, 4] is 2.5. ``std`` is the
    population standard deviation (``np.std``, ddof=0), as SGLang's and vLLM's benchmarks
    report it."""

    mean: float
    std: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    n: int  # how many values are summarised (0: every field is 0.0)

    @classmethod
    def of(cls, values: npt.ArrayLike, *, consume: bool = False) -> Stats:
        """``consume``: ``values`` is the caller's to give up (a float64 array nobody reads
        again), so the percentiles reorder it in place instead of sorting a copy."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.size == 0:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        mean, std, top = arr.mean(), arr.std(), arr.max()  # before any reordering
        p50, p90, p95, p99 = np.percentile(arr, [50.0, 90.0, 95.0, 99.0], overwrite_input=consume)
        return cls(
            mean=_as_float(mean),
            std=_as_float(std),
            p50=_as_float(p50),
            p90=_as_float(p90),
            p95=_as_float(p95),
            p99=_as_float(p99),
            max=_as_float(top),
            n=int(arr.size),
        )

    def to_json(self) -> dict[str, JSONValue]:
        return {k: getattr(self, k) for k in STATS_KEYS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], n: int = 0) -> Stats:
        values = {k: float(data[k]) for k in STATS_KEYS}
        return cls(**values, n=n)


def jain_index(values: npt.ArrayLike) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when all x are equal, 1/n when one
    party gets everything. Over no values, or all zeros (nobody got anything: equally), 1.0."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return 1.0
    sq = float(np.dot(arr, arr))
    if sq == 0.0:
        return 1.0
    return _as_float(float(arr.sum()) ** 2 / (arr.size * sq))


# ---------------------------------------------------------------------------------------------
# Time series
# ---------------------------------------------------------------------------------------------


class SeriesArrays(NamedTuple):
    t: FloatArray
    queue_len: FloatArray
    running: FloatArray
    kv_usage: FloatArray
    cumulative_cached_tokens: FloatArray
    cumulative_prompt_tokens: FloatArray

    @property
    def hit_rate(self) -> FloatArray:
        """Cumulative token hit rate at each sample (0.0 before any prompt token)."""
        den = self.cumulative_prompt_tokens
        out = np.zeros_like(den)
        np.divide(self.cumulative_cached_tokens, den, out=out, where=den > 0)
        return out


class TimeSeries:
    """Scheduler state sampled by the driver; append-only, times non-decreasing.

    Columns are ``array('d')`` buffers: O(1) append, 8 bytes a value (a million samples take
    48 MB, not the ~200 MB of lists of floats); ``arrays()`` copies them into numpy once.
    """

    __slots__ = ("_cached", "_kv", "_prompt", "_queue", "_running", "_t")

    def __init__(self) -> None:
        self._t = array("d")
        self._queue = array("d")
        self._running = array("d")
        self._kv = array("d")
        self._cached = array("d")
        self._prompt = array("d")

    def append(
        self,
        t: float,
        queue_len: int,
        running: int,
        kv_usage: float,
        cumulative_cached_tokens: int,
        cumulative_prompt_tokens: int,
    ) -> None:
        if self._t and t < self._t[-1]:
            raise ValueError(f"time series must not go back in time: {t} after {self._t[-1]}")
        self._t.append(t)
        self._queue.append(queue_len)
        self._running.append(running)
        self._kv.append(kv_usage)
        self._cached.append(cumulative_cached_tokens)
        self._prompt.append(cumulative_prompt_tokens)

    def __len__(self) -> int:
        return len(self._t)

    def arrays(self) -> SeriesArrays:
        # Copies, never views: a live view would pin the buffer and make the next append fail.
        return SeriesArrays(
            *(
                np.array(col, dtype=np.float64)
                for col in (
                    self._t,
                    self._queue,
                    self._running,
                    self._kv,
                    self._cached,
                    self._prompt,
                )
            )
        )

    def downsampled(self, max_points: int = REPORT_MAX_POINTS) -> SeriesArrays:
        """At most ``max_points`` real samples, first and last always kept.

        Min-max decimation on the queue length: the samples are cut into equal-count buckets
        and each bucket keeps its samples with the shortest and the longest queue, in time
        order. Queue spikes (starvation) and dips survive, the envelope a chart draws is the
        true one, and cumulative columns stay consistent because every kept point is real.
        """
        if max_points < 4:
            raise ValueError(f"max_points must be >= 4, got {max_points}")
        full = self.arrays()
        n = full.t.size
        if n <= max_points:
            return full
        picks: list[int] = [0]
        for b in np.array_split(np.arange(1, n - 1), (max_points - 2) // 2):
            if b.size:
                q = full.queue_len[b]
                lo, hi = int(b[np.argmin(q)]), int(b[np.argmax(q)])
                picks.extend(sorted({lo, hi}))
        picks.append(n - 1)
        idx = np.asarray(picks, dtype=np.int64)
        return SeriesArrays(*(col[idx] for col in full))


# ---------------------------------------------------------------------------------------------
# Per-request samples
# ---------------------------------------------------------------------------------------------


def _completed(reqs: Iterable[Req]) -> list[Req]:
    """Requests that finished without an abort; the latency samples cover only these."""
    abort = FinishReason.ABORT  # a local: enum member lookup is slow in a 1e5-request loop
    return [
        r
        for r in reqs
        if r.finish is not None and r.finish.reason is not abort and r.times.finish is not None
    ]


# The ``_x(done)`` helpers take an already-filtered list (``_completed``), so that summarize
# filters once; the public ``x_samples(reqs)`` wrappers filter themselves.


def _ttft(done: Sequence[Req]) -> FloatArray:
    return np.array(
        [r.times.first_token - r.times.arrival for r in done if r.times.first_token is not None],
        dtype=np.float64,
    )


def _tpot(done: Sequence[Req]) -> FloatArray:
    return np.array(
        [
            (r.times.finish - r.times.first_token) / (r.output_len - 1)
            for r in done
            if r.output_len > 1 and r.times.first_token is not None and r.times.finish is not None
        ],
        dtype=np.float64,
    )


def _itl(done: Sequence[Req]) -> FloatArray:
    """Every gap between consecutive tokens of one request, request by request, written into
    one array: a long trace has millions of tokens, and the gaps are its only large copy."""
    times = [r.times.token_times for r in done if len(r.times.token_times) > 1]
    out = np.empty(sum(map(len, times)) - len(times), dtype=np.float64)
    at = 0
    for tt in times:
        t = np.asarray(tt, dtype=np.float64)
        np.subtract(t[1:], t[:-1], out=out[at : at + len(t) - 1])
        at += len(t) - 1
    return out


def _e2e(done: Sequence[Req]) -> FloatArray:
    return np.array(
        [r.times.finish - r.times.arrival for r in done if r.times.finish is not None],
        dtype=np.float64,
    )


def _queue_wait(done: Sequence[Req]) -> FloatArray:
    return np.array(
        [
            r.times.first_scheduled - r.times.arrival
            for r in done
            if r.times.first_scheduled is not None
        ],
        dtype=np.float64,
    )


def ttft_samples(reqs: Iterable[Req]) -> FloatArray:
    """TTFT of every completed request that produced a token (for CDFs)."""
    return _ttft(_completed(reqs))


def tpot_samples(reqs: Iterable[Req]) -> FloatArray:
    """TPOT of every completed request with more than one output token."""
    return _tpot(_completed(reqs))


def itl_samples(reqs: Iterable[Req]) -> FloatArray:
    """All gaps between consecutive token times within each completed request, pooled."""
    return _itl(_completed(reqs))


def e2e_samples(reqs: Iterable[Req]) -> FloatArray:
    return _e2e(_completed(reqs))


def queue_wait_samples(reqs: Iterable[Req]) -> FloatArray:
    return _queue_wait(_completed(reqs))


# Columns of the per-request output (``--requests-csv``), in order: one row per request and
# policy, as Vidur's request_metrics.csv and bench_serving's --output-details give. Times are
# seconds on the run's clock; a latency a request never reached is empty.
REQUEST_COLUMNS: tuple[str, ...] = (
    "policy",
    "request_id",
    "tenant",
    "routing_key",
    "priority",
    "replica",
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "queue_wait_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "prompt_tokens",
    "cached_tokens",
    "host_cached_tokens",
    "computed_prefill_tokens",
    "output_tokens",
    "retractions",
    "preemptions",
    "finish_reason",
    "error",
    "slo_met",
)
RequestRow: TypeAlias = dict[str, str | int | float | bool | None]


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else t - t0


def request_rows(
    policy: str,
    reqs: Iterable[Req],
    replica_of: Mapping[str, int] | None = None,
    slo: SloTargets | None = None,
) -> list[RequestRow]:
    """One ``REQUEST_COLUMNS`` row per request, in arrival order."""
    rows: list[RequestRow] = []
    for r in sorted(reqs, key=lambda q: q.times.arrival):
        t = r.times
        done = r.finish is not None and r.finish.reason is not FinishReason.ABORT
        ttft = _since(t.first_token, t.arrival)
        tpot = (
            (t.finish - t.first_token) / (r.output_len - 1)
            if done and r.output_len > 1 and t.finish is not None and t.first_token is not None
            else None
        )
        met: bool | None = None
        if slo is not None and slo.active:
            met = done and ttft is not None
            if met and slo.ttft_s is not None and ttft is not None:
                met = ttft <= slo.ttft_s
            if met and slo.tpot_s is not None and tpot is not None:
                met = tpot <= slo.tpot_s
        rows.append(
            {
                "policy": policy,
                "request_id": r.rid,
                "tenant": r.tenant,
                "routing_key": r.routing_key,
                "priority": r.priority,
                "replica": None if replica_of is None else replica_of.get(r.rid),
                "arrival_s": t.arrival,
                "first_scheduled_s": t.first_scheduled,
                "first_token_s": t.first_token,
                "finish_s": t.finish,
                "queue_wait_s": _since(t.first_scheduled, t.arrival),
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": _since(t.finish, t.arrival) if done else None,
                "prompt_tokens": r.prompt_len,
                "cached_tokens": r.cached_tokens,
                "host_cached_tokens": r.host_cached_tokens,
                "computed_prefill_tokens": r.computed_prefill_tokens,
                "output_tokens": r.output_len,
                "retractions": r.retraction_count,
                "preemptions": r.preemption_count,
                "finish_reason": None if r.finish is None else r.finish.reason.value,
                "error": r.finish.message if r.finish is not None and not done else None,
                "slo_met": met,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Cache and fairness
# ---------------------------------------------------------------------------------------------


class HitRates(NamedTuple):
    """Token-weighted hit rates; ``total == device + host`` up to rounding."""

    total: float
    device: float
    host: float
    cached_tokens: int
    prompt_tokens: int


def hit_rates(reqs: Iterable[Req]) -> HitRates:
    scheduled = [r for r in reqs if r.times.first_scheduled is not None]
    cached = sum(r.cached_tokens for r in scheduled)
    host = sum(r.host_cached_tokens for r in scheduled)
    prompt = sum(r.prompt_len for r in scheduled)
    return HitRates(
        total=_ratio(cached, prompt),
        device=_ratio(cached - host, prompt),
        host=_ratio(host, prompt),
        cached_tokens=cached,
        prompt_tokens=prompt,
    )


def fairness_horizon(reqs: Iterable[Req]) -> float:
    """Default time at which service shares are compared: when half the completed requests
    had finished. The system is still loaded then, so a policy that starves a tenant shows it,
    whereas at the end of a drained run every tenant has been fully served."""
    finishes = [r.times.finish for r in _completed(reqs) if r.times.finish is not None]
    return float(np.median(finishes)) if finishes else 0.0


@dataclass(frozen=True)
class TenantResult:
    """One tenant's share. ``service_share`` = tokens served by the fairness horizon / tokens
    demanded by then (prompt + output tokens of the requests that had arrived); a prompt counts
    as served once the request's first token exists, an output token at its token time."""

    tenant: str
    num_requests: int
    hit_rate: float
    ttft_s: Stats
    queue_wait_s: Stats
    demand_tokens: int
    served_tokens: int
    service_share: float

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "tenant": self.tenant,
            "num_requests": self.num_requests,
            "hit_rate": self.hit_rate,
            "ttft_s": self.ttft_s.to_json(),
            "queue_wait_s": self.queue_wait_s.to_json(),
            "demand_tokens": self.demand_tokens,
            "served_tokens": self.served_tokens,
            "service_share": self.service_share,
        }


def _service_by(reqs: Sequence[Req], horizon: float) -> tuple[int, int]:
    """(demanded, served) tokens of ``reqs`` at time ``horizon``."""
    demand = served = 0
    for r in reqs:
        if r.times.arrival > horizon:
            continue
        demand += r.prompt_len + r.output_len
        if r.times.first_token is not None and r.times.first_token <= horizon:
            served += r.prompt_len
        # token_times is sorted; counting the prefix <= horizon is a binary search, not a loop.
        served += bisect_right(r.times.token_times, horizon)
    return demand, served


def tenant_results(
    reqs: Sequence[Req], horizon: float | None = None
) -> tuple[list[TenantResult], float]:
    """Per-tenant results and Jain's index over their service shares (see ``TenantResult``)."""
    h = fairness_horizon(reqs) if horizon is None else horizon
    groups: dict[str, list[Req]] = {}
    for r in reqs:
        groups.setdefault(r.tenant_key, []).append(r)
    out: list[TenantResult] = []
    for tenant in sorted(groups):
        group = groups[tenant]
        done = _completed(group)
        demand, served = _service_by(group, h)
        out.append(
            TenantResult(
                tenant=tenant,
                num_requests=len(group),
                hit_rate=hit_rates(group).total,
                ttft_s=Stats.of(_ttft(done)),
                queue_wait_s=Stats.of(_queue_wait(done)),
                demand_tokens=demand,
                served_tokens=served,
                service_share=_ratio(served, demand),
            )
        )
    return out, jain_index([t.service_share for t in out if t.demand_tokens > 0])


# ---------------------------------------------------------------------------------------------
# SLO goodput and load
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SloTargets:
    """Latency targets a request must meet to count as good (None: no target on that
    latency). Seconds, like every latency here; the CLI takes milliseconds."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("ttft", self.ttft_s), ("tpot", self.tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"the {name} SLO must be a positive number, got {v}")

    @property
    def active(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def describe(self) -> str:
        parts = [
            f"{name} <= {v * 1e3:g} ms"
            for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
            if v is not None
        ]
        return " and ".join(parts)


class SloResult(NamedTuple):
    """SLO attainment: ``met`` requests completed within every target; ``attainment`` is
    ``met / total`` over all requests (a rejected or aborted request misses); goodput is
    ``met`` per second of makespan (DistServe's goodput; bench_serving's ``--goodput``)."""

    ttft_ms: float | None
    tpot_ms: float | None
    met: int
    total: int
    attainment: float
    goodput_requests_per_s: float

    def to_json(self) -> dict[str, JSONValue]:
        return dict(self._asdict())


def slo_result(reqs: Sequence[Req], targets: SloTargets, makespan_s: float) -> SloResult:
    """Requests meeting ``targets``. A request with one output token has no TPOT and meets
    any TPOT target."""
    met = 0
    for r in _completed(reqs):
        t = r.times
        if t.first_token is None:
            continue
        if targets.ttft_s is not None and t.first_token - t.arrival > targets.ttft_s:
            continue
        if (
            targets.tpot_s is not None
            and r.output_len > 1
            and t.finish is not None
            and (t.finish - t.first_token) / (r.output_len - 1) > targets.tpot_s
        ):
            continue
        met += 1
    return SloResult(
        ttft_ms=None if targets.ttft_s is None else targets.ttft_s * 1e3,
        tpot_ms=None if targets.tpot_s is None else targets.tpot_s * 1e3,
        met=met,
        total=len(reqs),
        attainment=_ratio(met, len(reqs)),
        goodput_requests_per_s=_ratio(met, makespan_s),
    )


def failure_reasons(reqs: Iterable[Req]) -> list[tuple[str, int]]:
    """Why requests did not complete: (an example message, how many), most frequent first;
    messages that differ only in their numbers count as one reason."""
    groups: dict[str, tuple[str, int]] = {}
    for r in reqs:
        if r.finish is None or r.finish.reason is not FinishReason.ABORT:
            continue
        message = r.finish.message or "aborted"
        key = re.sub(r"\d+", "N", message)
        example, n = groups.get(key, (message, 0))
        groups[key] = (example, n + 1)
    return sorted(groups.values(), key=lambda x: -x[1])


def failure_summary(reqs: Sequence[Req]) -> str:
    """One line: how many requests failed and why (the most frequent reason, an example)."""
    reasons = failure_reasons(reqs)
    if not reasons:
        return ""
    rejected = sum(
        1
        for r in reqs
        if r.finish is not None
        and r.finish.reason is FinishReason.ABORT
        and r.times.first_scheduled is None
    )
    failed = sum(n for _, n in reasons)
    how = (
        "rejected at admission"
        if rejected == failed
        else "aborted"
        if rejected == 0
        else f"failed ({rejected:,} rejected at admission)"
    )
    text = f"{failed:,} {how}, e.g. {reasons[0][0]!r}"
    if len(reasons) > 1:
        text += f" ({reasons[0][1]:,} like it, {len(reasons) - 1} other reasons)"
    return text


# An overload verdict needs this many requests (fewer say nothing about a trend), and a
# backlog of at least this many requests and this share of them.
LOAD_MIN_REQUESTS = 8
LOAD_MIN_BACKLOG_SHARE = 0.1
# Offered rate above this multiple of the served rate (with a backlog) is overload.
OVERLOAD_RATIO = 1.1


class LoadCheck(NamedTuple):
    """Offered load against what the system served, and the queue it left behind.

    ``offered`` is the arrival rate over the arrival span; ``served`` is completed requests per
    second of makespan, which is the system's capacity when it is saturated. ``backlog`` is
    the number of requests that had arrived but not started by the last arrival: a system
    that keeps up has a few, an overloaded one a share that grows with the overload
    (``1 - served/offered`` of them in steady state). ``service_s`` is the median latency
    beyond the queue wait (it grows with the load: a large running batch decodes slowly).
    Overloaded: at least ``LOAD_MIN_REQUESTS`` requests arriving over a span of time (all at
    t=0 is a burst the user asked for, queued by design), offered > ``OVERLOAD_RATIO`` x
    served, and a backlog of at least ``LOAD_MIN_REQUESTS`` requests and
    ``LOAD_MIN_BACKLOG_SHARE`` of them."""

    offered_requests_per_s: float
    served_requests_per_s: float
    arrival_span_s: float
    backlog: int
    service_s: float
    overloaded: bool

    @property
    def load_ratio(self) -> float:
        return _ratio(self.offered_requests_per_s, self.served_requests_per_s)

    def to_json(self) -> dict[str, JSONValue]:
        return {**self._asdict(), "load_ratio": self.load_ratio}


def load_check(reqs: Sequence[Req], served_requests_per_s: float) -> LoadCheck:
    arrivals = [r.times.arrival for r in reqs]
    if not arrivals:
        return LoadCheck(0.0, _as_float(served_requests_per_s), 0.0, 0, 0.0, False)
    last = max(arrivals)
    span = last - min(arrivals)
    offered = _ratio(len(arrivals) - 1, span)
    # Started after the last arrival; never started and not aborted (a rejected request
    # never waited).
    backlog = sum(
        1
        for r in reqs
        if (r.times.first_scheduled is not None and r.times.first_scheduled > last)
        or (
            r.times.first_scheduled is None
            and not (r.finish is not None and r.finish.reason is FinishReason.ABORT)
        )
    )
    service = [
        t.finish - t.first_scheduled
        for t in (r.times for r in _completed(reqs))
        if t.finish is not None and t.first_scheduled is not None
    ]
    service_s = float(np.median(service)) if service else 0.0
    overloaded = (
        len(arrivals) >= LOAD_MIN_REQUESTS
        and span > 0
        and offered > OVERLOAD_RATIO * served_requests_per_s
        and backlog >= max(LOAD_MIN_REQUESTS, LOAD_MIN_BACKLOG_SHARE * len(arrivals))
    )
    return LoadCheck(
        offered_requests_per_s=_as_float(offered),
        served_requests_per_s=_as_float(served_requests_per_s),
        arrival_span_s=_as_float(span),
        backlog=backlog,
        service_s=_as_float(service_s),
        overloaded=overloaded,
    )


# ---------------------------------------------------------------------------------------------
# The result of one policy
# ---------------------------------------------------------------------------------------------


class Throughput(NamedTuple):
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "requests_per_s": self.requests_per_s,
            "input_tokens_per_s": self.input_tokens_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
        }


# Keys of ``PolicyResult.to_json``, in order. The first block is the stable contract; the second
# holds additions. ``extra`` from the driver is appended after both and may not shadow them.
REQUIRED_KEYS: tuple[str, ...] = (
    "policy",
    "hit_rate",
    "optimal_hit_rate",
    "prefill_tokens_computed",
    "num_requests",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "queue_wait_s",
    "throughput",
    "makespan_s",
    "retractions",
    "preemptions",
    "wall_s",
)
ADDITIONAL_KEYS: tuple[str, ...] = (
    "hit_rate_gap",
    "device_hit_rate",
    "host_hit_rate",
    "cached_tokens",
    "prompt_tokens",
    "output_tokens",
    "num_completed",
    "num_aborted",
    "requests_per_wall_s",
    "fairness_jain",
    "fairness_horizon_s",
    "peak_queue_len",
    "mean_running",
    "peak_kv_usage",
    "load",
    "slo",
    "tenants",
)
THROUGHPUT_KEYS: tuple[str, ...] = Throughput._fields


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    hit_rate: float
    optimal_hit_rate: float
    prefill_tokens_computed: int
    num_requests: int
    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    queue_wait_s: Stats
    throughput: Throughput
    makespan_s: float
    retractions: int
    preemptions: int
    wall_s: float
    device_hit_rate: float = 0.0
    host_hit_rate: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    num_completed: int = 0
    num_aborted: int = 0
    # Jain's index over tenants' service shares; 1.0 with a single tenant (nothing to compare).
    fairness_jain: float = 1.0
    fairness_horizon_s: float = 0.0
    # From the sampled time series (0 when none was given). The single-replica simulator
    # replaces them with exact per-step values from the scheduler: the peak waiting queue,
    # the running batch averaged over busy time (time-weighted), and the peak KV usage.
    peak_queue_len: int = 0
    mean_running: float = 0.0
    peak_kv_usage: float = 0.0
    # Filled only when the workload has more than one tenant.
    tenants: tuple[TenantResult, ...] = ()
    load: LoadCheck | None = None
    slo: SloResult | None = None  # None unless SLO targets were given
    extra: Mapping[str, JSONValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = set(self.extra) & (set(REQUIRED_KEYS) | set(ADDITIONAL_KEYS))
        if clash:
            raise ValueError(f"extra keys shadow result keys: {sorted(clash)}")

    @property
    def hit_rate_gap(self) -> float:
        """How far the achieved hit rate is below the workload's optimum (>= 0 when the
        optimum is a true upper bound)."""
        return self.optimal_hit_rate - self.hit_rate

    @property
    def served_nothing(self) -> bool:
        """No request completed: every latency and throughput figure is empty."""
        return self.num_completed == 0

    @property
    def num_failed(self) -> int:
        """Requests that did not complete: rejected at the door or aborted later."""
        return self.num_requests - self.num_completed

    @property
    def requests_per_wall_s(self) -> float:
        """Simulator speed: requests simulated per second of real time."""
        return _ratio(self.num_requests, self.wall_s)

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {
            "policy": self.policy,
            "hit_rate": self.hit_rate,
            "optimal_hit_rate": self.optimal_hit_rate,
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "num_requests": self.num_requests,
            "ttft_s": self.ttft_s.to_json(),
            "tpot_s": self.tpot_s.to_json(),
            "itl_s": self.itl_s.to_json(),
            "e2e_s": self.e2e_s.to_json(),
            "queue_wait_s": self.queue_wait_s.to_json(),
            "throughput": self.throughput.to_json(),
            "makespan_s": self.makespan_s,
            "retractions": self.retractions,
            "preemptions": self.preemptions,
            "wall_s": self.wall_s,
            "hit_rate_gap": self.hit_rate_gap,
            "device_hit_rate": self.device_hit_rate,
            "host_hit_rate": self.host_hit_rate,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "num_completed": self.num_completed,
            "num_aborted": self.num_aborted,
            "requests_per_wall_s": self.requests_per_wall_s,
            "fairness_jain": self.fairness_jain,
            "fairness_horizon_s": self.fairness_horizon_s,
            "peak_queue_len": self.peak_queue_len,
            "mean_running": self.mean_running,
            "peak_kv_usage": self.peak_kv_usage,
            "load": None if self.load is None else self.load.to_json(),
            "slo": None if self.slo is None else self.slo.to_json(),
            "tenants": [t.to_json() for t in self.tenants],
        }
        out.update(self.extra)
        return out


def summarize(
    policy: str,
    reqs: Sequence[Req],
    series: TimeSeries | None = None,
    *,
    optimal_hit_rate: float,
    wall_s: float,
    retractions: int,
    preemptions: int,
    extra: Mapping[str, JSONValue] | None = None,
    fairness_at: float | None = None,
    slo: SloTargets | None = None,
) -> PolicyResult:
    """Summarise one policy's run. ``reqs`` are the finished requests (aborted ones included:
    they count in ``num_requests``/``num_aborted`` and, if scheduled, in the hit rate).

    Latency, cache and throughput numbers come from the requests (the source of truth);
    ``series`` only adds peak queue length, mean running batch and peak KV usage.
    ``fairness_at`` overrides the fairness horizon (see ``fairness_horizon``); ``slo`` adds
    SLO attainment and goodput (see ``slo_result``).
    """
    sampled = series.arrays() if series is not None and len(series) else None
    completed = _completed(reqs)
    hits = hit_rates(reqs)
    arrivals = [r.times.arrival for r in reqs]
    finishes = [r.times.finish for r in completed if r.times.finish is not None]
    makespan = max(finishes) - min(arrivals) if finishes and arrivals else 0.0
    input_tokens = sum(r.prompt_len for r in completed)
    output_tokens = sum(r.output_len for r in completed)
    horizon = fairness_horizon(completed) if fairness_at is None else fairness_at
    # Per-tenant numbers only mean something with more than one tenant.
    multi_tenant = len({r.tenant_key for r in reqs}) > 1
    tenants, jain = tenant_results(reqs, horizon) if multi_tenant else ([], 1.0)
    return PolicyResult(
        policy=policy,
        hit_rate=hits.total,
        optimal_hit_rate=_as_float(optimal_hit_rate),
        prefill_tokens_computed=sum(r.computed_prefill_tokens for r in reqs),
        num_requests=len(reqs),
        ttft_s=Stats.of(_ttft(completed)),
        tpot_s=Stats.of(_tpot(completed)),
        itl_s=Stats.of(_itl(completed), consume=True),
        e2e_s=Stats.of(_e2e(completed)),
        queue_wait_s=Stats.of(_queue_wait(completed)),
        throughput=Throughput(
            requests_per_s=_ratio(len(completed), makespan),
            input_tokens_per_s=_ratio(input_tokens, makespan),
            output_tokens_per_s=_ratio(output_tokens, makespan),
        ),
        makespan_s=_as_float(makespan),
        retractions=retractions,
        preemptions=preemptions,
        wall_s=_as_float(wall_s),
        device_hit_rate=hits.device,
        host_hit_rate=hits.host,
        cached_tokens=hits.cached_tokens,
        prompt_tokens=hits.prompt_tokens,
        output_tokens=output_tokens,
        num_completed=len(completed),
        num_aborted=sum(
            1 for r in reqs if r.finish is not None and r.finish.reason is FinishReason.ABORT
        ),
        fairness_jain=jain,
        fairness_horizon_s=_as_float(horizon),
        peak_queue_len=int(sampled.queue_len.max()) if sampled is not None else 0,
        mean_running=_as_float(sampled.running.mean()) if sampled is not None else 0.0,
        peak_kv_usage=_as_float(sampled.kv_usage.max()) if sampled is not None else 0.0,
        tenants=tuple(tenants),
        load=load_check(reqs, _ratio(len(completed), makespan)),
        slo=slo_result(reqs, slo, makespan) if slo is not None and slo.active else None,
        extra=dict(extra or {}),
    )
