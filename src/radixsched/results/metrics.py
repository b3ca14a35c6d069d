"""One policy run's result: every metric of the run in one record (``PolicyResult``), assembled
once by ``summarize`` from the requests and the sampled series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from radixsched.request import Req
from radixsched.results.reqarrays import RequestArrays
from radixsched.results.requests import SloTargets
from radixsched.results.series import TimeSeries
from radixsched.results.service import (
    LoadCheck,
    SloResult,
    TenantResult,
    load_check_of,
    slo_result,
    tenant_results,
)
from radixsched.results.stats import JSONValue, Stats, _as_float, _ratio, as_json, median

# ---- The result of one policy --------------------------------------------------------------------


class Throughput(NamedTuple):
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float

    def to_json(self) -> dict[str, JSONValue]:
        return dict(self._asdict())


# Keys of ``PolicyResult.to_json``, in order. The first block is the stable contract; the second
# holds additions. ``extra`` from the driver is appended after both and may not shadow them.
REQUIRED_KEYS: tuple[str, ...] = (
    "policy", "hit_rate", "optimal_hit_rate", "prefill_tokens_computed", "num_requests", "ttft_s",
    "tpot_s", "itl_s", "e2e_s", "queue_wait_s", "throughput", "makespan_s", "retractions",
    "preemptions", "wall_s",
)  # fmt: skip
ADDITIONAL_KEYS: tuple[str, ...] = (
    "hit_rate_gap", "device_hit_rate", "host_hit_rate", "cached_tokens", "prompt_tokens",
    "output_tokens", "num_completed", "num_aborted", "requests_per_wall_s", "fairness_jain",
    "fairness_horizon_s", "peak_queue_len", "mean_running", "peak_kv_usage", "load", "slo",
    "tenants",
)  # fmt: skip
THROUGHPUT_KEYS: tuple[str, ...] = Throughput._fields


@dataclass(frozen=True)
class PolicyResult:
    """One policy's run summarised: hit rates, latency statistics, throughput, fairness."""

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
        if clash := set(self.extra) & (set(REQUIRED_KEYS) | set(ADDITIONAL_KEYS)):
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
        """``REQUIRED_KEYS`` then ``ADDITIONAL_KEYS`` (nested results as their own JSON), then
        ``extra``."""
        out = {key: as_json(getattr(self, key)) for key in (*REQUIRED_KEYS, *ADDITIONAL_KEYS)}
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
    arrays: RequestArrays | None = None,
) -> PolicyResult:
    """Summarise one policy's run. ``reqs`` are the finished requests (aborted ones included:
    they count in ``num_requests``/``num_aborted`` and, if scheduled, in the hit rate).

    Latency, cache and throughput numbers come from the requests (the source of truth);
    ``series`` only adds peak queue length, mean running batch and peak KV usage.
    ``fairness_at`` overrides the fairness horizon (see ``fairness_horizon``); ``slo`` adds
    SLO attainment and goodput (see ``slo_result``). ``arrays``: ``RequestArrays.of(reqs)``,
    when the caller has read them already.
    """
    a = RequestArrays.of(reqs) if arrays is None else arrays
    sampled = series.arrays() if series is not None and len(series) else None
    num_completed = a.num_completed
    hits = a.hit_rates()
    makespan = a.makespan()
    done = a.completed
    input_tokens = int(a.prompt_len[done].sum())
    output_tokens = int(a.output_len[done].sum())
    finishes = a.completed_finishes()
    if fairness_at is not None:
        horizon = fairness_at
    else:  # ``fairness_horizon``: when half the completed requests had finished
        horizon = median(finishes) if finishes.size else 0.0
    # Per-tenant numbers only mean something with more than one tenant.
    tenants, jain = tenant_results(reqs, horizon) if a.num_tenants > 1 else ([], 1.0)
    return PolicyResult(
        policy=policy,
        hit_rate=hits.total,
        optimal_hit_rate=_as_float(optimal_hit_rate),
        prefill_tokens_computed=int(a.computed.sum()),
        num_requests=a.num_requests,
        ttft_s=Stats.of(a.ttft()),
        tpot_s=Stats.of(a.tpot()),
        itl_s=a.itl_stats(),
        e2e_s=Stats.of(a.e2e()),
        queue_wait_s=Stats.of(a.queue_wait()),
        throughput=Throughput(
            requests_per_s=_ratio(num_completed, makespan),
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
        num_completed=num_completed,
        num_aborted=int(np.count_nonzero(a.aborted)),
        fairness_jain=jain,
        fairness_horizon_s=_as_float(horizon),
        peak_queue_len=int(sampled.queue_len.max()) if sampled is not None else 0,
        mean_running=_as_float(sampled.running.mean()) if sampled is not None else 0.0,
        peak_kv_usage=_as_float(sampled.kv_usage.max()) if sampled is not None else 0.0,
        tenants=tuple(tenants),
        load=load_check_of(a, _ratio(num_completed, makespan)),
        slo=slo_result(reqs, slo, makespan) if slo is not None and slo.active else None,
        extra=dict(extra or {}),
    )
