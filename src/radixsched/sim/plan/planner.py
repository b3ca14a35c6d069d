"""The plan's order of work: prune, then hand candidates out most promising first, and stop
those that cannot beat the best found so far (``search`` runs them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from radixsched.sim.plan.capacity import Capacity, roofline_rate
from radixsched.sim.plan.pricing import deployment_gpus, hourly_cost
from radixsched.sim.plan.result import CandidateResult
from radixsched.sim.plan.search import Job, LoadedWorkload, LocalPool, PlanSpec, RayPool, drain
from radixsched.sim.plan.space import Candidate

OnResult = Callable[[CandidateResult], None]


def frame(cand: Candidate, loaded: LoadedWorkload, spec: PlanSpec) -> CandidateResult:
    """A candidate's result before it runs: its GPUs, cost and roofline bound, or ``pruned``
    with the reason when it cannot run."""
    from radixsched.sim.cost.roofline import CostModelError

    sim = cand.settings.sim_config()
    gpus = sum(n for _, n in deployment_gpus(sim))
    cost = hourly_cost(sim, spec.prices)
    out_tokens = loaded.tokens.output_tokens
    base = CandidateResult(cand, gpus, cost, None, "pruned", mean_output_tokens=out_tokens)
    try:
        reason = kv_problem(sim, loaded)
        bound = roofline_rate(loaded.tokens, sim, cand.settings.scheduler_config())
    except CostModelError as e:
        return replace(base, reason=f"does not fit: {e}")
    if reason:
        return replace(base, reason=reason)
    return replace(base, roofline_rate=bound, status="queued")


def fit_error(sim: Any) -> str:
    """Why the model does not fit this deployment's GPUs at its TP ("" when it does, or
    when the problem is another one, which the preflight reports)."""
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.roofline import CostModelError

    try:
        if sim.disaggregation:
            from radixsched.sim.settings.deployment import role_specs

            for spec in role_specs(sim):
                build_cost_model(spec.sim_config(sim, host_tier=False)).kv_capacity_tokens()
        else:
            build_cost_model(sim).kv_capacity_tokens()
    except CostModelError as e:
        return str(e)
    except (ValueError, OSError):
        return ""
    return ""


def min_step_s(sim: Any) -> float:
    """A floor under any step's time on this deployment (0.0: none known)."""
    from radixsched.sim.cost.build import build_cost_model

    cost = build_cost_model(sim)
    return float(getattr(cost, "min_step_s", lambda: 0.0)())


def kv_problem(sim: Any, loaded: LoadedWorkload) -> str:
    """Why the longest request cannot run on this deployment's KV pool ("" when it can)."""
    from radixsched.sim.cost.build import build_cost_model

    longest = max(
        (r.prompt_len + r.sampling.max_new_tokens for r in loaded.base.requests), default=0
    )
    pools = [("the KV pool", sim)]
    if sim.disaggregation:
        from radixsched.sim.settings.deployment import role_specs

        pre, dec = role_specs(sim)
        pools = [
            ("the prefill KV pool", pre.sim_config(sim, host_tier=False)),
            ("the decode KV pool", dec.sim_config(sim, host_tier=False)),
        ]
    for name, cfg in pools:
        tokens = int(build_cost_model(cfg).kv_capacity_tokens())
        if longest > tokens:
            return (
                f"context longer than {name}: the longest request needs {longest:,} tokens, "
                f"{name} holds {tokens:,}"
            )
    return ""


@dataclass
class Planner:
    """The queue of candidates and the best so far (capacity per dollar, or the cheapest
    per hour meeting the target)."""

    spec: PlanSpec
    frames: list[CandidateResult]
    on_result: OnResult
    results: dict[int, CandidateResult] = field(default_factory=dict)
    best: float | None = None
    queue: list[CandidateResult] = field(default_factory=list)
    groups: dict[Any, list[CandidateResult]] = field(default_factory=dict)
    busy: set[Any] = field(default_factory=set)

    def __post_init__(self) -> None:
        runnable = []
        for f in self.frames:
            if f.status == "pruned":
                self._record(f)
            else:
                runnable.append(f)
        if self.spec.target_rate is None:
            self.queue = sorted(runnable, key=lambda f: -(f.roofline_rate or 0) / f.cost_per_hour)
            return
        for f in sorted(runnable, key=lambda f: (f.cost_per_hour, f.candidate.index)):
            self.groups.setdefault(f.candidate.group_key(), []).append(f)
        for rungs in self.groups.values():
            rungs.sort(key=lambda f: f.candidate.dp)

    def _record(self, result: CandidateResult) -> None:
        self.results[result.candidate.index] = result
        self.on_result(result)

    def next_job(self) -> Job | None:
        return self._next_capacity() if self.spec.target_rate is None else self._next_target()

    def _next_capacity(self) -> Job | None:
        while self.queue:
            f = self.queue.pop(0)
            bound = f.roofline_rate or math.inf
            if self.best is not None and bound / f.cost_per_hour <= self.best:
                self._record(
                    replace(
                        f,
                        status="stopped early",
                        reason=f"its roofline bound, {bound:.3g} req/s for "
                        f"${f.cost_per_hour:,.2f}/h, cannot beat the best's "
                        f"{self.best:.3g} req/s per $/h",
                    )
                )
                continue
            give_up = None if self.best is None else self.best * f.cost_per_hour
            return Job(f, give_up)
        return None

    def _next_target(self) -> Job | None:
        target = self.spec.target_rate
        assert target is not None
        for key, rungs in self.groups.items():
            if key in self.busy:
                continue
            while rungs:
                f = rungs.pop(0)
                if (f.roofline_rate or math.inf) < target:
                    reason = f"its roofline bound, {f.roofline_rate:.3g} req/s, is below the target"
                    self._record(replace(f, status="below target", reason=reason))
                    continue
                if self.best is not None and f.cost_per_hour > self.best:
                    self._stop_group(
                        f, rungs, f"costs more than the best so far (${self.best:,.2f}/h)"
                    )
                    break
                self.busy.add(key)
                return Job(f, target)
        return None

    def _stop_group(self, first: CandidateResult, rest: list[CandidateResult], why: str) -> None:
        for f in [first, *rest]:
            self._record(replace(f, status="stopped early", reason=why))
        rest.clear()

    def finish(self, job: Job, capacity: Capacity) -> None:
        f = job.result
        status, reason = capacity.status, ""
        target = self.spec.target_rate
        if status == "above range":
            reason = (
                f"meets the SLOs even at its roofline bound, {capacity.rate:.3g} req/s: the "
                "trace is too short to load it (more requests would)"
            )
        elif status == "below range":
            reason = f"misses the SLOs even at {capacity.upper or 0:.3g} req/s"
        if status == "stopped early":
            if target is not None:
                status, reason = "below target", f"misses the SLOs at {target:g} req/s"
            else:
                reason = f"capacity below {capacity.upper:.3g} req/s: cannot beat the best"
        self._record(replace(f, status=status, reason=reason, capacity=capacity))
        if status not in ("ok", "above range"):
            if target is not None:
                self.busy.discard(f.candidate.group_key())
            return
        if target is None:
            value = capacity.rate / f.cost_per_hour
            self.best = value if self.best is None else max(self.best, value)
            return
        key = f.candidate.group_key()
        self.busy.discard(key)
        if rest := self.groups.get(key, []):
            self._stop_group(rest[0], rest[1:], f"dp {f.candidate.dp} already sustains the target")
        self.best = f.cost_per_hour if self.best is None else min(self.best, f.cost_per_hour)


def run_plan(
    spec: PlanSpec,
    candidates: Sequence[Candidate],
    loaded: LoadedWorkload,
    *,
    jobs: int,
    ray_address: str | None,
    on_result: OnResult,
    display: AbstractContextManager[Any] | None = None,
) -> list[CandidateResult]:
    """Every candidate's result, in the candidates' order. ``display`` (a progress display)
    is entered once the workers exist: a process must not fork while a display's thread
    runs."""
    frames = [frame(c, loaded, spec) for c in candidates]
    pool: LocalPool | RayPool
    pool = RayPool(spec, ray_address, jobs) if ray_address else LocalPool(spec, jobs)
    with pool, display if display is not None else nullcontext():
        planner = Planner(spec, frames, on_result)  # reports the pruned: the display is on
        drain(pool, planner.next_job, planner.finish)
    return [planner.results[c.index] for c in candidates]
