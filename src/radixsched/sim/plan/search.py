"""Every candidate's capacity over one loaded workload, a few at a time.

The workload is loaded once per process (``load_for``): at a rate, a trace's timestamps are
scaled (the trace's own pattern, faster or slower), a generated workload's Poisson arrivals
drawn again from the same seed over the prompts already built (``DraftMemo``). Local workers are
forked after the load, as ``sim.policy_runs`` does, so they share its prompt pages; Ray workers
load it once each.

Candidates are handed out one at a time as workers free up, most promising first, so that the
best found so far can stop the others early: one whose roofline bound cannot beat it is not
run, and a bisection stops once its capacity is known to fall short of it. With a target rate,
each group (a candidate less its replica count) climbs ``dp`` from the smallest count its
roofline allows and stops at the first that sustains the target."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixsched.sim.plan.capacity import Capacity, Slo, TraceTokens, find_capacity, roofline_rate
from radixsched.sim.plan.result import CandidateResult
from radixsched.sim.plan.space import Candidate
from radixsched.sim.workloads.load import Workload

# Slowest rate a search goes down to, as a share of the roofline bound.
LOWEST_SHARE = 1e-4
# First rate a capacity search tries, as a share of the roofline bound.
START_SHARE = 1 / 8


@dataclass(frozen=True)
class PlanSpec:
    """What every candidate's search shares (picklable: Ray sends it)."""

    workload: str
    num_requests: int | None
    seed: int
    hit_unit: int  # tokens a cache hit is counted in (SchedulerConfig.hit_unit)
    slo: Slo
    tolerance: float
    target_rate: float | None
    prices: dict[str, float] = field(default_factory=dict)


@dataclass
class LoadedWorkload:
    """The workload at its own arrivals, its tokens for the roofline, and ``at(rate)``."""

    spec: PlanSpec
    base: Workload
    memo: Any
    optimal_hit_rate: float
    tokens: TraceTokens
    trace_rate: float | None  # the trace's mean request rate (None: Poisson at a rate)

    def at(self, rate: float) -> Workload:
        from radixsched.sim.deploy.replicas import clone_request
        from radixsched.sim.workloads.load import load_workload

        if self.trace_rate is None:
            return load_workload(
                self.spec.workload,
                request_rate=rate,
                num_requests=self.spec.num_requests,
                seed=self.spec.seed,
                memo=self.memo,
            )
        scale = self.trace_rate / rate
        reqs = [clone_request(r, arrival_time=r.arrival_time * scale) for r in self.base.requests]
        return Workload(
            name=self.base.name,
            params=self.base.params,
            requests=reqs,
            has_timestamps=True,
            tenants=self.base.tenants,
            arrivals=f"trace timestamps x{1 / scale:.3g} ({rate:.3g} req/s)",
            prompts=self.base.prompts,
            prompt_key=self.base.prompt_key,
        )


_LOADED: dict[tuple[Any, ...], LoadedWorkload] = {}


def load_for(spec: PlanSpec) -> LoadedWorkload:
    """The workload ``spec`` names, loaded once per process."""
    from radixsched.sim.workloads.load import DraftMemo, load_workload, workload_optimal_hit_rate
    from radixsched.sim.workloads.spec import parse_workload_spec, trace_version

    version = trace_version(*parse_workload_spec(spec.workload))  # a changed trace is reread
    key = (spec.workload, spec.num_requests, spec.seed, spec.hit_unit, version)
    if key in _LOADED:
        return _LOADED[key]
    _LOADED.clear()
    memo = DraftMemo()
    base = load_workload(spec.workload, num_requests=spec.num_requests, seed=spec.seed, memo=memo)
    trace_rate = None
    if base.has_timestamps:
        span = base.requests[-1].arrival_time - base.requests[0].arrival_time
        trace_rate = len(base.requests) / span if span > 0 else None
    if trace_rate is None:  # Poisson at a rate, drawn over the same prompts
        base = load_workload(
            spec.workload,
            request_rate=1.0,
            num_requests=spec.num_requests,
            seed=spec.seed,
            memo=memo,
        )
    opt = workload_optimal_hit_rate(base, page_size=spec.hit_unit)
    n = max(len(base.requests), 1)
    tokens = TraceTokens(
        len(base.requests), base.num_prompt_tokens / n, base.num_output_tokens / n, opt
    )
    _LOADED[key] = LoadedWorkload(spec, base, memo, opt, tokens, trace_rate)
    return _LOADED[key]


def evaluate(spec: PlanSpec, cand: Candidate, give_up_below: float | None) -> Capacity:
    """``cand``'s capacity search, given up below ``give_up_below`` (the target rate, or the
    rate that would beat the best so far), which it tries first."""
    from radixsched.sim.plan.capacity import Probe
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import WorkloadError

    loaded = load_for(spec)
    sched = cand.settings.scheduler_config()
    sim = cand.settings.sim_config()
    bound = roofline_rate(loaded.tokens, sim, sched)

    def probe(rate: float) -> Probe:
        try:
            workload = loaded.at(rate)
        except WorkloadError:  # arrivals too sparse for the clock: not met
            return Probe.missed(rate)
        run = simulate(workload, sched, sim, optimal_hit_rate=loaded.optimal_hit_rate)
        return Probe.of(rate, run, spec.slo)

    # With a rate to beat (the target, or what would beat the best so far), the first probe is
    # there: a candidate that misses it costs one simulation.
    start = give_up_below if give_up_below is not None else bound * START_SHARE
    return find_capacity(
        probe,
        start=start,
        lowest=min(bound * LOWEST_SHARE, start),
        highest=max(bound, start),
        tolerance=spec.tolerance,
        give_up_below=give_up_below,
    )


# ---- running candidates ------------------------------------------------------------------


@dataclass
class Job:
    """A candidate handed to a worker, with what its result needs."""

    result: CandidateResult  # the result's frame (status and capacity filled in on return)
    give_up_below: float | None


class LocalPool:
    """``jobs`` forked workers (1: this process). Fork after ``load_for`` so that workers
    inherit the workload."""

    def __init__(self, spec: PlanSpec, jobs: int) -> None:
        from radixsched.sim.policy_runs import can_fork

        self.spec = spec
        self.jobs = jobs if can_fork() else 1
        self.pool: Any = None

    def __enter__(self) -> LocalPool:
        if self.jobs > 1:
            import gc
            from concurrent.futures import ProcessPoolExecutor

            from radixsched.sim.policy_runs import _die_with

            gc.freeze()  # inherited objects stay out of the workers' collections
            self.pool = ProcessPoolExecutor(
                self.jobs,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_die_with,
                initargs=(os.getpid(),),
            )
            self.pool.submit(int).result()  # forks every worker now, before any display thread
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=exc[0] is None, cancel_futures=True)
            import gc

            gc.unfreeze()

    @property
    def width(self) -> int:
        return self.jobs

    def submit(self, job: Job) -> Any:
        args = (self.spec, job.result.candidate, job.give_up_below)
        if self.pool is None:
            return evaluate(*args)  # run now: the "future" is the result
        return self.pool.submit(evaluate, *args)

    def wait_one(self, handles: Sequence[Any]) -> tuple[int, Capacity]:
        if self.pool is None:
            return 0, handles[0]
        from concurrent.futures import FIRST_COMPLETED, wait

        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        i = next(i for i, h in enumerate(handles) if h in done)
        return i, handles[i].result()


class RayPool:
    """One Ray task per candidate (``sim.sweep.executors.RayExecutor`` connects)."""

    def __init__(self, spec: PlanSpec, address: str, width: int) -> None:
        from radixsched.sim.sweep.executors import RayExecutor

        self.spec = spec
        self.executor = RayExecutor(address)
        self.width = width
        self.task: Any = None

    def __enter__(self) -> RayPool:
        import ray

        self.executor.connect()
        self.task = ray.remote(num_cpus=1)(evaluate)
        if not self.width:
            self.width = max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.executor._started:
            import ray

            ray.shutdown()

    def submit(self, job: Job) -> Any:
        return self.task.remote(self.spec, job.result.candidate, job.give_up_below)

    def wait_one(self, handles: Sequence[Any]) -> tuple[int, Capacity]:
        import ray

        done, _ = ray.wait(list(handles), num_returns=1)
        i = next(i for i, h in enumerate(handles) if h == done[0])
        return i, ray.get(done[0])


def drain(
    pool: LocalPool | RayPool,
    next_job: Callable[[], Job | None],
    finish: Callable[[Job, Capacity], None],
) -> None:
    """Keep ``pool.width`` jobs running until ``next_job`` has none left; ``finish`` each."""
    running: list[tuple[Job, Any]] = []
    while True:
        while len(running) < pool.width:
            job = next_job()
            if job is None:
                break
            running.append((job, pool.submit(job)))
        if not running:
            return
        i, capacity = pool.wait_one([h for _, h in running])
        job, _ = running.pop(i)
        finish(job, capacity)
