"""A candidate's capacity: the highest request rate at which the SLOs hold for the asked share
of requests, found by bisection over the rate; and the roofline bound over it.

The search brackets the capacity between a rate that meets the SLOs (``lo``) and one that does
not (``hi``), doubling or halving from a start until both are known, then bisects
geometrically until ``hi / lo <= 1 + tolerance``. The reported capacity is ``lo``: a rate that
was simulated and met the SLOs; the next rate up that was simulated did not. Attainment need
not fall monotonically with the rate (a burst can land differently), so the bracket is about
the rates simulated, nothing more. A search that meets the SLOs at ``highest`` (the roofline
bound) or fails them at ``lowest`` reports that the capacity lies outside the simulated range.

``roofline_rate`` bounds a candidate's capacity from above without simulating: the trace's
tokens need at least their matmul FLOPs at the GPUs' peak (prompt tokens discounted by the
workload's optimal hit rate, the best any cache could do) and, for decode, one read of the
weights per step of at most ``max_running_requests`` sequences. A rate above it cannot be
sustained; the search uses it to start, to cap, and to drop candidates that cannot beat the
best found so far."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixsched.request import Req
from radixsched.results.requests import _completed, meets_slo

STATUSES = ("ok", "above range", "below range", "stopped early")


@dataclass(frozen=True)
class Slo:
    """Latency targets (seconds; None: none on that latency) and the share of requests that
    must meet all of them."""

    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    attainment: float = 0.9

    def met_share(self, reqs: Sequence[Req]) -> float:
        """Share of ``reqs`` that completed within every target (``meets_slo``; a failed
        request misses)."""
        met = sum(meets_slo(r, self.ttft_s, self.tpot_s, self.e2e_s) for r in _completed(reqs))
        return met / len(reqs) if reqs else 0.0

    def step_errors(self, fastest: tuple[float, str] | None) -> list[str]:
        """A target below one step's time on the fastest candidate (``(seconds, which)``)
        cannot be met: one line per such target, naming its flag."""
        if fastest is None or fastest[0] <= 0:
            return []
        step, where = fastest
        targets = (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s))
        return [
            f"--slo-{name}-ms {value * 1e3:g}: below one step's time on every candidate (the "
            f"fastest, {where}, takes at least {step * 1e3:.3g} ms a step)"
            for name, value in targets
            if value is not None and value < step
        ]

    def describe(self) -> str:
        parts = [
            f"{name} <= {v * 1e3:g} ms"
            for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s))
            if v is not None
        ]
        return " and ".join(parts) + f" for {self.attainment:.0%} of requests"


@dataclass(frozen=True)
class Probe:
    """One simulation at one request rate: whether it met the SLOs and why (or why not)."""

    rate: float
    attainment: float
    met: bool
    hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    queue_wait_mean_s: float
    peak_kv_usage: float
    output_tokens_per_s: float
    retractions: int
    failed: int

    @classmethod
    def missed(cls, rate: float) -> Probe:
        """A rate that could not be simulated (arrivals beyond the clock's range): missed."""
        inf = math.inf
        return cls(rate, 0.0, False, 0.0, inf, inf, inf, inf, 0.0, 0.0, 0, 0)

    @classmethod
    def of(cls, rate: float, run: Any, slo: Slo) -> Probe:
        """A probe from a ``SimRun``."""
        r = run.result
        share = slo.met_share(run.requests)
        return cls(
            rate=rate,
            attainment=share,
            met=share >= slo.attainment,
            hit_rate=r.hit_rate,
            ttft_p50_s=r.ttft_s.p50,
            ttft_p99_s=r.ttft_s.p99,
            tpot_p50_s=r.tpot_s.p50,
            queue_wait_mean_s=r.queue_wait_s.mean,
            peak_kv_usage=r.peak_kv_usage,
            output_tokens_per_s=r.output_tokens / r.makespan_s if r.makespan_s > 0 else 0.0,
            retractions=r.retractions,
            failed=r.num_failed,
        )


@dataclass(frozen=True)
class Capacity:
    """A search's outcome: ``rate`` met the SLOs (0.0: no rate did), ``upper`` did not (None:
    none failed); ``status`` one of ``STATUSES``; every probe, in the order run."""

    rate: float
    upper: float | None
    status: str
    probes: tuple[Probe, ...]

    @property
    def at_rate(self) -> Probe | None:
        """The probe at the reported rate (None when no rate met the SLOs)."""
        return next((p for p in reversed(self.probes) if p.rate == self.rate and p.met), None)


def find_capacity(
    probe: Callable[[float], Probe],
    *,
    start: float,
    lowest: float,
    highest: float,
    tolerance: float,
    give_up_below: float | None = None,
) -> Capacity:
    """Bisect ``probe`` over the rate (see the module docstring). ``give_up_below``: stop once
    the capacity is known to be below it (the search then reports ``stopped early``)."""
    if not 0 < lowest <= highest or tolerance <= 0:
        raise ValueError(f"bad search range [{lowest}, {highest}] or tolerance {tolerance}")
    probes: list[Probe] = []
    lo, hi = 0.0, math.inf

    def run(rate: float) -> None:
        nonlocal lo, hi
        p = probe(rate)
        probes.append(p)
        if p.met:
            lo = max(lo, rate)
        else:
            hi = min(hi, rate)

    def done(status: str) -> Capacity:
        return Capacity(lo, None if math.isinf(hi) else hi, status, tuple(probes))

    run(min(max(start, lowest), highest))
    while lo == 0.0:  # halve down until a rate meets the SLOs
        if give_up_below is not None and hi <= give_up_below:
            return done("stopped early")
        if hi <= lowest:
            return done("below range")
        run(max(hi / 2, lowest))
    while math.isinf(hi):  # double up until one does not
        if lo >= highest:
            return done("above range")
        run(min(lo * 2, highest))
    while hi / lo > 1 + tolerance:
        if give_up_below is not None and hi <= give_up_below:
            return done("stopped early")
        run(math.sqrt(lo * hi))
    if give_up_below is not None and hi <= give_up_below:
        return done("stopped early")
    return done("ok")


@dataclass(frozen=True)
class TraceTokens:
    """What the roofline bound reads of a workload: per-request means and the optimum."""

    requests: int
    prompt_tokens: float  # mean per request
    output_tokens: float  # mean per request
    optimal_hit_rate: float


def roofline_rate(tokens: TraceTokens, sim: Any, sched: Any) -> float:
    """Requests per second no deployment of ``sim`` can exceed on these tokens (module
    docstring); co-located replicas add up, a split deployment is its slower role."""
    from radixsched.sim.cost.build import build_cost_model

    prompt = tokens.prompt_tokens * (1.0 - tokens.optimal_hit_rate)
    if not sim.disaggregation:
        per = _request_time_s(build_cost_model(sim), sched, prompt, tokens.output_tokens)
        return sim.dp / per if per > 0 else math.inf
    from radixsched.sim.settings.deployment import role_specs

    pre, dec = role_specs(sim)
    pre_cost = build_cost_model(pre.sim_config(sim, host_tier=False))
    dec_cost = build_cost_model(dec.sim_config(sim, host_tier=False))
    pre_s = _request_time_s(pre_cost, sched, prompt, 0.0)
    dec_s = _request_time_s(dec_cost, sched, 0.0, tokens.output_tokens)
    rates = [n / s for n, s in ((sim.prefill_instances, pre_s), (sim.decode_instances, dec_s)) if s]
    return min(rates) if rates else math.inf


def _request_time_s(cost: Any, sched: Any, prompt: float, output: float) -> float:
    """A lower bound on one replica's busy time per request: the matmul FLOPs of its tokens
    at peak, or the weight reads of its decode steps at full batch, whichever is longer."""
    from radixsched.config import resolve_max_running_requests

    flops = 2.0 * cost.model.active_params * (prompt + output)
    compute_s = flops / (cost.gpu.peak_flops * cost.tp)
    batch = resolve_max_running_requests(
        sched, int(cost.kv_capacity_tokens()), cost.model.max_context_len
    )
    reads_s = output / batch * cost.weight_bytes_read(batch) / (cost.gpu.hbm_bw * cost.tp)
    return max(compute_s, reads_s)
