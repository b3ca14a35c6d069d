"""What a plan found: one result per candidate, the ranking, and the recommendation's reasons.

Ranking: with a target rate, the candidates that sustain it, cheapest per hour first (then the
higher capacity); without one, capacity per dollar (requests per second per dollar-hour, the
same order as cost per million output tokens at capacity). Only candidates whose capacity was
found (``ok``, or ``above range``: at least the bound) can be recommended."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from radixsched.sim.plan.capacity import Capacity, Probe
from radixsched.sim.plan.pricing import cost_per_million_tokens
from radixsched.sim.plan.space import Candidate

RANKED = ("ok", "above range")


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's outcome. ``status``: ``ok``, ``above range``, ``below range``,
    ``stopped early`` (it could not beat the best), ``below target``, ``pruned`` (not run:
    ``reason`` says why)."""

    candidate: Candidate
    gpus: int
    cost_per_hour: float
    roofline_rate: float | None
    status: str
    reason: str = ""
    capacity: Capacity | None = None
    mean_output_tokens: float = 0.0

    @property
    def max_request_rate(self) -> float | None:
        if self.capacity is None or self.status not in RANKED:
            return None
        return self.capacity.rate

    @property
    def at_capacity(self) -> Probe | None:
        return None if self.capacity is None else self.capacity.at_rate

    def probe_at(self, rate: float) -> Probe | None:
        if self.capacity is None:
            return None
        return next((p for p in self.capacity.probes if p.rate == rate), None)

    def rate_per_dollar(self) -> float:
        rate = self.max_request_rate
        return 0.0 if rate is None else rate / self.cost_per_hour

    def cost_per_million_output_tokens(self, rate: float | None) -> float | None:
        if rate is None:
            return None
        return cost_per_million_tokens(self.cost_per_hour, rate * self.mean_output_tokens)

    def to_json(self, target: float | None) -> dict[str, Any]:
        c = self.candidate
        rate = self.max_request_rate
        # The probe the row is judged at: the target, or its capacity (none when it has none).
        probe = self.probe_at(target) if target is not None else self.at_capacity
        if target is None and rate is None:
            probe = None
        at = (target if target is not None else rate) if meets(self, target) else None
        return {
            "gpu": c.gpu,
            "tp": c.tp,
            "dp": c.dp,
            "policy": c.policy,
            "router": c.router,
            "disaggregation": None if c.deployment is None else c.deployment_label,
            **{k: v for k, v in c.flags},
            "status": self.status,
            "reason": self.reason or None,
            "max_request_rate": rate,
            "capacity_upper_bound": None if self.capacity is None else self.capacity.upper,
            "roofline_rate": self.roofline_rate,
            "gpus": self.gpus,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_million_output_tokens": self.cost_per_million_output_tokens(at),
            "slo_attainment": None if probe is None else probe.attainment,
            "hit_rate": None if probe is None else probe.hit_rate,
            "probes": [] if self.capacity is None else [p.__dict__ for p in self.capacity.probes],
        }


def meets(result: CandidateResult, target: float | None) -> bool:
    rate = result.max_request_rate
    return rate is not None and (target is None or rate >= target)


def rank(results: list[CandidateResult], target: float | None) -> list[CandidateResult]:
    """Every result, the recommendable ones first in the plan's order, then the others by
    status and capacity."""

    def key(r: CandidateResult) -> tuple[Any, ...]:
        if meets(r, target):
            if target is not None:
                return (0, r.cost_per_hour, -(r.max_request_rate or 0.0), r.candidate.index)
            return (0, -r.rate_per_dollar(), r.cost_per_hour, r.candidate.index)
        order = ("ok", "above range", "below target", "stopped early", "below range", "pruned")
        return (1, order.index(r.status) if r.status in order else 9, r.candidate.index)

    return sorted(results, key=key)


def best_two(
    ranked: list[CandidateResult], target: float | None
) -> tuple[CandidateResult | None, CandidateResult | None]:
    ok = [r for r in ranked if meets(r, target)]
    return (ok[0] if ok else None, ok[1] if len(ok) > 1 else None)


def why_best(best: CandidateResult, target: float | None) -> str:
    rate = best.max_request_rate or 0.0
    c = best.candidate
    per_m = best.cost_per_million_output_tokens(target if target is not None else rate)
    money = f"${best.cost_per_hour:,.2f}/h" + (
        "" if per_m is None else f", ${per_m:,.3g} per million output tokens"
    )
    if target is not None:
        return (
            f"best: {c.label} — the cheapest that sustains {target:g} req/s: {best.gpus} "
            f"GPU(s), {money}; capacity {rate:.3g} req/s"
        )
    return (
        f"best: {c.label} — the most capacity per dollar: {rate:.3g} req/s on {best.gpus} "
        f"GPU(s) for {money} ({best.rate_per_dollar():.3g} req/s per $/h)"
    )


def what_separates(
    best: CandidateResult, runner: CandidateResult, target: float | None
) -> list[str]:
    """The runner-up and what separates it from the best: cost, capacity, and at the rate
    each was judged (the target, or its own capacity) hit rate, queueing and KV pressure."""
    b_rate, r_rate = best.max_request_rate or 0.0, runner.max_request_rate or 0.0
    lines = [
        f"runner-up: {runner.candidate.label} — {r_rate:.3g} req/s on {runner.gpus} GPU(s) "
        f"for ${runner.cost_per_hour:,.2f}/h ({_delta(r_rate, b_rate)} capacity, "
        f"{_delta(runner.cost_per_hour, best.cost_per_hour)} cost)"
    ]
    pb = best.probe_at(target) if target is not None else best.at_capacity
    pr = runner.probe_at(target) if target is not None else runner.at_capacity
    if pb is None or pr is None:
        return lines
    where = f"at {target:g} req/s" if target is not None else "each at its capacity"
    lines.append(
        f"  {where}: prefix hit rate {pb.hit_rate:.1%} vs {pr.hit_rate:.1%}; mean queue wait "
        f"{_ms(pb.queue_wait_mean_s)} vs {_ms(pr.queue_wait_mean_s)}; peak KV use "
        f"{pb.peak_kv_usage:.0%} vs {pr.peak_kv_usage:.0%}; TTFT p99 {_ms(pb.ttft_p99_s)} vs "
        f"{_ms(pr.ttft_p99_s)}; SLO met {pb.attainment:.1%} vs {pr.attainment:.1%}"
    )
    return lines


def _delta(value: float, reference: float) -> str:
    if reference <= 0 or not math.isfinite(value / reference):
        return "n/a"
    return f"{(value / reference - 1) * 100:+.0f}%"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:,.3g} s"


def plan_json(spec: Any, ranked: list[CandidateResult], meta: Any) -> dict[str, Any]:
    """The ``--json`` document: settings, one object per candidate (ranked), ``best``."""
    best, runner = best_two(ranked, spec.target_rate)
    slo = spec.slo
    return {
        "meta": meta,
        "workload": spec.workload,
        "slo": {
            "ttft_ms": None if slo.ttft_s is None else slo.ttft_s * 1e3,
            "tpot_ms": None if slo.tpot_s is None else slo.tpot_s * 1e3,
            "e2e_ms": None if slo.e2e_s is None else slo.e2e_s * 1e3,
            "attainment": slo.attainment,
        },
        "target_request_rate": spec.target_rate,
        "tolerance": spec.tolerance,
        "simulations": sum(len(r.capacity.probes) for r in ranked if r.capacity is not None),
        "prices_per_gpu_hour": spec.prices,
        "candidates": [r.to_json(spec.target_rate) for r in ranked],
        "best": None if best is None else best.to_json(spec.target_rate),
        "runner_up": None if runner is None else runner.to_json(spec.target_rate),
    }
