"""Service as users see it: tenants' shares (fairness), SLO attainment and goodput, and whether
the offered load was served or queued."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from radixsched.request import Req
from radixsched.results.reqarrays import RequestArrays
from radixsched.results.requests import (
    SloTargets,
    _completed,
    _queue_wait,
    _ttft,
    hit_rates,
    meets_slo,
)
from radixsched.results.stats import (
    JSONValue,
    Stats,
    _as_float,
    _ratio,
    as_json,
    jain_index,
    median,
)


def fairness_horizon(reqs: Iterable[Req]) -> float:
    """Default time at which service shares are compared: when half the completed requests
    had finished. The system is still loaded then, so a policy that starves a tenant shows it,
    whereas at the end of a drained run every tenant has been fully served."""
    finishes = [r.times.finish for r in _completed(reqs) if r.times.finish is not None]
    return median(finishes) if finishes else 0.0


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
        return {f.name: as_json(getattr(self, f.name)) for f in fields(self)}


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
    """Requests meeting ``targets`` (``meets_slo``)."""
    met = sum(meets_slo(r, targets.ttft_s, targets.tpot_s) for r in _completed(reqs))
    return SloResult(
        ttft_ms=None if targets.ttft_s is None else targets.ttft_s * 1e3,
        tpot_ms=None if targets.tpot_s is None else targets.tpot_s * 1e3,
        met=met,
        total=len(reqs),
        attainment=_ratio(met, len(reqs)),
        goodput_requests_per_s=_ratio(met, makespan_s),
    )


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
    return load_check_of(RequestArrays.of(reqs), served_requests_per_s)


def load_check_of(arrays: RequestArrays, served_requests_per_s: float) -> LoadCheck:
    """``load_check`` of requests read into arrays."""
    if arrays.num_requests == 0:
        return LoadCheck(0.0, _as_float(served_requests_per_s), 0.0, 0, 0.0, False)
    n = arrays.num_requests
    last = float(arrays.arrival.max())
    span = last - float(arrays.arrival.min())
    offered = _ratio(n - 1, span)
    # Started after the last arrival; never started and not aborted (a rejected request
    # never waited).
    backlog = arrays.backlog(last)
    service = arrays.service()
    service_s = median(service) if service.size else 0.0
    overloaded = (
        n >= LOAD_MIN_REQUESTS
        and span > 0
        and offered > OVERLOAD_RATIO * served_requests_per_s
        and backlog >= max(LOAD_MIN_REQUESTS, LOAD_MIN_BACKLOG_SHARE * n)
    )
    return LoadCheck(
        offered_requests_per_s=_as_float(offered),
        served_requests_per_s=_as_float(served_requests_per_s),
        arrival_span_s=_as_float(span),
        backlog=backlog,
        service_s=_as_float(service_s),
        overloaded=overloaded,
    )
