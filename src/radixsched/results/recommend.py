"""The written recommendation: which policy, why, at what cost, with the numbers; and the
warnings a run's results call for (overload, a policy that served nothing)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixsched.results.format import (
    Better,
    fmt_fraction,
    fmt_int,
    fmt_percent,
    fmt_rate,
    fmt_seconds,
)
from radixsched.results.metrics import PolicyResult

# ---- Recommendation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    """What a recommendation ranks policies by: a result's value and which way is better."""

    name: str
    get: Callable[[PolicyResult], float]
    better: Better  # HIGHER or LOWER
    fmt: Callable[[float], str]

    def score(self, r: PolicyResult) -> float:
        """Larger is better, whatever the direction."""
        v = self.get(r)
        return v if self.better is Better.HIGHER else -v


# The three axes a policy is judged on; the Pareto set is computed over exactly these.
HIT_RATE = Objective("hit rate", lambda r: r.hit_rate, Better.HIGHER, fmt_percent)
THROUGHPUT = Objective(
    "throughput",
    lambda r: r.throughput.output_tokens_per_s,
    Better.HIGHER,
    lambda x: f"{fmt_rate(x)} output tok/s",
)
P99_TTFT = Objective("p99 TTFT", lambda r: r.ttft_s.p99, Better.LOWER, fmt_seconds)
OBJECTIVES: tuple[Objective, ...] = (HIT_RATE, P99_TTFT, THROUGHPUT)


class Pick(NamedTuple):
    """The best policy on one objective, its value, and the other policies that equal it."""

    policy: str
    value: float
    tied_with: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation:
    """Best policy per objective and the Pareto set, over the policies that served at least
    one request (``excluded`` lists the others), in input order; ``recommended`` is the
    policy the written recommendation (``text``) argues for, against ``baseline``."""

    hit_rate: Pick | None
    p99_ttft: Pick | None
    throughput: Pick | None
    pareto: tuple[str, ...]
    num_policies: int = 0
    recommended: str | None = None
    baseline: str | None = None
    text: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The written recommendation, then the best policy per objective and the Pareto set."""
        if self.num_policies == 0:
            return ["No results to compare."]
        out = list(self.text)
        picks = (self.hit_rate, self.p99_ttft, self.throughput)
        served = self.num_policies - len(self.excluded)
        if served < 2 or any(p is None for p in picks):
            return out
        if all(p is not None and len(p.tied_with) == served - 1 for p in picks):
            return out  # everything ties: the text says so
        best = []
        for obj, pick in zip(OBJECTIVES, picks, strict=True):
            assert pick is not None
            value = obj.fmt(pick.value)
            if len(pick.tied_with) == served - 1:
                best.append(f"{obj.name}: all tie ({value})")
            else:
                best.append(f"{obj.name}: {', '.join((pick.policy, *pick.tied_with))} ({value})")
        out.append("Best " + "; ".join(best) + ".")
        if len(self.pareto) == 1:
            out.append(f"Pareto set: {self.pareto[0]} (not beaten on any of the three)")
        else:
            out.append(f"Pareto set (hit rate, p99 TTFT, throughput): {', '.join(self.pareto)}")
        return out


# Relative difference below which two values count as equal when recommending. Simulated
# runs of one workload differ by noise of this order (throughput is over the makespan, which
# the last request's finish decides), and a 0.05% edge should not decide a recommendation.
TIE_REL_TOL = 1e-3
# A cost of the recommended policy is a metric at least this much worse than the baseline's.
COST_REL_TOL = 0.05


def _tied(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=TIE_REL_TOL, abs_tol=1e-12)


def dominates(a: PolicyResult, b: PolicyResult) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one, where values
    within ``TIE_REL_TOL`` of each other are equal."""
    sa = [o.score(a) for o in OBJECTIVES]
    sb = [o.score(b) for o in OBJECTIVES]
    pairs = list(zip(sa, sb, strict=True))
    return all(x >= y or _tied(x, y) for x, y in pairs) and any(
        x > y and not _tied(x, y) for x, y in pairs
    )


def _pick(
    results: Sequence[PolicyResult], primary: Objective, order: Sequence[Objective] = OBJECTIVES
) -> Pick:
    # The candidates are every policy equal to the best on the primary objective (within
    # TIE_REL_TOL); among them the other objectives decide in ``order``, then input order
    # (max keeps the first maximal element). ``tied_with`` lists the other candidates.
    top = max(primary.score(r) for r in results)
    candidates = [r for r in results if _tied(primary.score(r), top)]
    others = [o for o in order if o is not primary]
    best = max(candidates, key=lambda r: tuple(o.score(r) for o in others))
    tied = tuple(r.policy for r in candidates if r is not best)
    return Pick(best.policy, primary.get(best), tied)


SLO_ATTAINMENT = Objective(
    "SLO attainment",
    lambda r: r.slo.attainment if r.slo is not None else 0.0,
    Better.HIGHER,
    fmt_percent,
)


@dataclass(frozen=True)
class _Metric:
    """A metric the written recommendation compares against the baseline."""

    name: str
    get: Callable[[PolicyResult], float]
    better: Better
    fmt: Callable[[float], str]


def _rel_change(new: float, old: float) -> float:
    return (new - old) / abs(old) if old else (math.inf if new else 0.0)


def _change_text(new: float, old: float) -> str:
    """``+30%``, ``-50%``, ``3.0x``; empty from a zero baseline (no ratio to give)."""
    if not old:
        return ""
    change = _rel_change(new, old)
    if abs(change) >= 1.5:
        return f"{new / old:.1f}x"
    return f"{100 * change:+.0f}%"


def _cost_metrics(results: Sequence[PolicyResult]) -> list[_Metric]:
    out = [
        _Metric("hit rate", lambda r: r.hit_rate, Better.HIGHER, fmt_percent),
        _Metric("p99 TTFT", lambda r: r.ttft_s.p99, Better.LOWER, fmt_seconds),
        _Metric("p50 TTFT", lambda r: r.ttft_s.p50, Better.LOWER, fmt_seconds),
        _Metric("p50 TPOT", lambda r: r.tpot_s.p50, Better.LOWER, fmt_seconds),
        _Metric("p99 E2E latency", lambda r: r.e2e_s.p99, Better.LOWER, fmt_seconds),
        _Metric("longest queue wait", lambda r: r.queue_wait_s.max, Better.LOWER, fmt_seconds),
        _Metric(
            "output throughput",
            lambda r: r.throughput.output_tokens_per_s,
            Better.HIGHER,
            lambda x: f"{fmt_rate(x)} tok/s",
        ),
        _Metric("retractions", lambda r: float(r.retractions), Better.LOWER, fmt_int),
        _Metric("failed requests", lambda r: float(r.num_failed), Better.LOWER, fmt_int),
    ]
    if any(r.tenants for r in results):
        out.append(_Metric("fairness", lambda r: r.fairness_jain, Better.HIGHER, fmt_fraction))
    if any(r.slo is not None for r in results):
        out.insert(0, _Metric("SLO attainment", SLO_ATTAINMENT.get, Better.HIGHER, fmt_percent))
    return out


def _costs_differ(a: float, b: float) -> bool:
    return abs(_rel_change(a, b)) > COST_REL_TOL


def _worse_by_margin(m: _Metric, rec: PolicyResult, base: PolicyResult) -> bool:
    a, b = m.get(rec), m.get(base)
    if m.fmt(a) == m.fmt(b):
        return False
    if m.better is Better.HIGHER:
        return a < b and _rel_change(a, b) < -COST_REL_TOL
    return a > b and _rel_change(a, b) > COST_REL_TOL


def _recommendation_lines(
    served: Sequence[PolicyResult], rec: PolicyResult, base: PolicyResult | None, slo: bool
) -> list[str]:
    """Which policy, why, at what cost, with the numbers (against ``base``)."""
    if base is None:
        return [
            f"Only {rec.policy} served requests: nothing to compare it with "
            "(--policy all compares every policy)."
        ]
    if slo:
        why = (
            f"the most requests within the SLO: {fmt_percent(SLO_ATTAINMENT.get(rec))} "
            f"(goodput {fmt_rate(rec.slo.goodput_requests_per_s if rec.slo else 0.0)} req/s)"
        )
    else:
        why = "the lowest p99 TTFT among the policies no other beats on hit rate, p99 TTFT and "
        why += "throughput at once"
    if all(all(_tied(o.score(r), o.score(rec)) for o in OBJECTIVES) for r in served):
        return [
            f"All {len(served)} policies perform alike here (hit rate {fmt_percent(rec.hit_rate)}, "
            f"p99 TTFT {fmt_seconds(rec.ttft_s.p99)}, "
            f"{fmt_rate(rec.throughput.output_tokens_per_s)} output tok/s): the waiting-queue "
            "policy does not matter for this workload; keep the default, fcfs."
        ]
    lines = [f"Recommended: {rec.policy}, {why}."]
    numbers = []
    headline = {"SLO attainment", "hit rate", "p99 TTFT", "output throughput"}
    for m in _cost_metrics(served):
        a, b = m.get(rec), m.get(base)
        if m.name not in headline and (m.fmt(a) == m.fmt(b) or not _costs_differ(a, b)):
            continue
        change = "" if m.fmt(a) == m.fmt(b) or not _change_text(a, b) else f", {_change_text(a, b)}"
        numbers.append(f"{m.name} {m.fmt(a)} ({base.policy} {m.fmt(b)}{change})")
    lines.append(f"Against {base.policy}: " + "; ".join(numbers) + ".")
    costs = [
        f"{m.name} {m.fmt(m.get(rec))} vs {m.fmt(m.get(base))}"
        for m in _cost_metrics(served)
        if _worse_by_margin(m, rec, base)
    ]
    if costs:
        lines.append(f"Cost against {base.policy}: " + "; ".join(costs) + ".")
    else:
        lines.append(f"Cost: none: at least as good as {base.policy} on every metric compared.")
    equal = [
        r.policy
        for r in served
        if r is not rec and all(_tied(o.score(r), o.score(rec)) for o in OBJECTIVES)
    ]
    if equal:
        lines.append(f"Equivalent on all three objectives: {', '.join(equal)}.")
    return lines


def recommend(results: Sequence[PolicyResult]) -> Recommendation:
    if not results:
        return Recommendation(None, None, None, ())
    served = [r for r in results if not r.served_nothing]
    excluded = tuple(r.policy for r in results if r.served_nothing)
    if not served:
        return Recommendation(
            None,
            None,
            None,
            (),
            num_policies=len(results),
            text=("No policy served any request: nothing to recommend.",),
            excluded=excluded,
        )
    pareto = [
        r
        for i, r in enumerate(served)
        if not any(dominates(q, r) for j, q in enumerate(served) if j != i)
    ]
    slo = any(r.slo is not None for r in served)
    if slo:
        chosen = _pick(served, SLO_ATTAINMENT, (P99_TTFT, THROUGHPUT, HIT_RATE))
    else:
        chosen = _pick(pareto, P99_TTFT, (P99_TTFT, THROUGHPUT, HIT_RATE))
    rec = next(r for r in served if r.policy == chosen.policy)
    others = [r for r in served if r is not rec]
    base = next((r for r in others if r.policy == "fcfs"), others[0] if others else None)
    text = _recommendation_lines(served, rec, base, slo)
    if excluded:
        text.append(f"Not compared (served no request): {', '.join(excluded)}.")
    return Recommendation(
        hit_rate=_pick(served, HIT_RATE),
        p99_ttft=_pick(served, P99_TTFT),
        throughput=_pick(served, THROUGHPUT),
        pareto=tuple(r.policy for r in pareto),
        num_policies=len(results),
        recommended=rec.policy,
        baseline=None if base is None else base.policy,
        text=tuple(text),
        excluded=excluded,
    )


# ---- Warnings ------------------------------------------------------------------------------------


def load_warnings(results: Sequence[PolicyResult]) -> list[str]:
    """Overload warnings: one line saying what arrived, one per overloaded policy, one with
    what to do. Empty when no run was overloaded (``metrics.LoadCheck``)."""
    over = [r for r in results if r.load is not None and r.load.overloaded]
    if not over:
        return []
    load = over[0].load
    assert load is not None
    names = "every policy" if len(over) == len(results) > 1 else ", ".join(r.policy for r in over)
    lines = [
        f"overloaded ({names}): requests arrived at {fmt_rate(load.offered_requests_per_s)} "
        f"req/s for {fmt_seconds(load.arrival_span_s)}, faster than they were served, and the "
        "queue grew:"
    ]
    width = max(len(r.policy) for r in over)
    for r in over:
        lc = r.load
        assert lc is not None
        lines.append(
            f"  {r.policy:<{width}}  served {fmt_rate(lc.served_requests_per_s)} req/s "
            f"(offered {lc.load_ratio:.1f}x that); {lc.backlog:,} of {r.num_requests:,} "
            f"requests not started when the last arrived; peak queue {r.peak_queue_len:,}"
        )
    lines.append(
        "  Latencies mostly measure queueing: lower --request-rate, or add capacity "
        "(--dp, --tp, --gpu). How many GPUs this load needs: radixsched plan (the same "
        "flags, --request-rate as the target, and --slo-ttft-ms/--slo-tpot-ms)."
    )
    return lines


def served_nothing_lines(
    results: Sequence[PolicyResult], reasons: Mapping[str, str] | None = None
) -> list[str]:
    """Policies that completed no request, grouped by reason (the main one, when known)."""
    groups: dict[tuple[int, str], list[str]] = {}
    for r in results:
        if r.served_nothing:
            key = (r.num_requests, (reasons or {}).get(r.policy, ""))
            groups.setdefault(key, []).append(r.policy)
    out = []
    for (n, why), names in groups.items():
        if len(names) == len(results) > 1:
            head = f"no policy ({', '.join(names)}) served any of the {n:,} requests"
        else:
            head = f"{', '.join(names)} served none of the {n:,} requests"
        out.append(head + (f": {why}" if why else ""))
    return out
