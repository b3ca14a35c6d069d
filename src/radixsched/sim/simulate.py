"""The simulation driver: replay a workload through the exact scheduler on a virtual clock.

One replica is the ``dp == 1`` case of the cluster loop below. Replicas advance independently
(each has its own virtual clock, radix cache, KV pool and scheduler); the driver is a discrete
event loop that always advances whichever replica is furthest behind, and delivers an arrival
(routing it across replicas) as soon as no replica still has a step starting before it:

* a replica steps while its clock is strictly before the next arrival; arrivals at or before a
  replica's clock are delivered first (the same order a real server's loop sees);
* a step is one forward pass, or several decode steps jumped over at once when nothing but
  lengths can change before the next arrival (``Scheduler.step(horizon)``);
* idle replicas jump to the next arrival.

With ``--enable-dp-attention`` the replicas step in lockstep instead (``sim.lockstep``) and
every prefill round is negotiated through the prefill delayer (``cluster.delayer``).

The simulator path never imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.request import Req
from radixsched.results.metrics import TimeSeries, summarize, ttft_samples
from radixsched.sim.cost.build import build_cost_model
from radixsched.sim.deploy.closed_loop import (
    restore_send_times,
    run_closed_loop,
    shift_to_scheduler,
)
from radixsched.sim.deploy.disagg import deployment_label, gpu_count
from radixsched.sim.deploy.replicas import (
    Replica,
    ReplicaSummary,
    RunnerFactory,
    SimRun,
    _build_replica,
    _ratio,
    clone_request,
    deliver,
    sample_series,
    step_earliest,
)
from radixsched.sim.settings.simconfig import SimConfig

if TYPE_CHECKING:
    from radixsched.sim.deploy.lockstep import LockstepStats


def simulate(
    workload: Any,
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    check_integrity: bool = False,
    optimal_hit_rate: float | None = None,
    accelerate: bool = True,
    runner_factory: RunnerFactory | None = None,
) -> SimRun:
    """Replay ``workload`` (a ``sim.workloads.Workload``) under one scheduler configuration.

    ``accelerate``: run the scheduler with its accelerators (``radixsched.fast``); they change
    no result, only speed. Off, every round runs the reference core's full work.
    ``runner_factory`` replaces each replica's ``CostModelRunner`` (a lockstep rank still
    wraps it in ``SingleStepRunner``). ``sim_cfg.max_concurrency`` runs closed-loop clients and
    the cost model's request latency delays arrivals (``sim.arrivals``); reported times are
    the client's."""
    from radixsched.sim.workloads.load import optimal_hit_rate as compute_optimal

    sim_cfg = sim_cfg or SimConfig()
    if sim_cfg.disaggregation:
        from radixsched.sim.deploy.disagg import simulate_disaggregated

        run: SimRun = simulate_disaggregated(
            workload,
            sched_cfg,
            sim_cfg,
            on_progress=on_progress,
            check_integrity=check_integrity,
            optimal_hit_rate=optimal_hit_rate,
            accelerate=accelerate,
            runner_factory=runner_factory,
        )
        return run
    if sim_cfg.dp < 1:
        raise ValueError(f"--dp must be >= 1, got {sim_cfg.dp}")
    cost = build_cost_model(sim_cfg)
    capacity = int(cost.kv_capacity_tokens())
    reqs = sorted((clone_request(r) for r in workload.requests), key=lambda r: r.arrival_time)
    latency = float(cost.describe().get("request_latency_s", 0.0))
    serial = float(cost.describe().get("request_serial_s", 0.0))
    closed = sim_cfg.max_concurrency is not None
    if closed and sim_cfg.enable_dp_attention and sim_cfg.dp > 1:
        raise ValueError("--max-concurrency is not supported with --enable-dp-attention")
    sends = [] if closed else shift_to_scheduler(reqs, latency, serial)
    opt = (
        optimal_hit_rate
        if optimal_hit_rate is not None
        else compute_optimal(workload.requests, page_size=sched_cfg.page_size)
    )
    lockstep = sim_cfg.enable_dp_attention and sim_cfg.dp > 1
    clocks = [VirtualClock() for _ in range(sim_cfg.dp)]
    gates = None
    if lockstep:
        from radixsched.config import resolve_max_running_requests
        from radixsched.sim.deploy.lockstep import lockstep_gates

        slots = resolve_max_running_requests(sched_cfg, capacity, cost.model.max_context_len)
        gates = lockstep_gates(sim_cfg, sched_cfg, clocks, slots)
    replicas = [
        _build_replica(
            i,
            sched_cfg,
            sim_cfg,
            cost,
            capacity,
            accelerate=accelerate,
            clock=clocks[i],
            gate_factory=None if gates is None else gates.recorders[i],
            single_step=lockstep,
            runner_factory=runner_factory,
        )
        for i in range(sim_cfg.dp)
    ]
    router = None
    if sim_cfg.dp > 1:
        from radixsched.cluster.routers import create_router, default_router_name

        router = create_router(
            sim_cfg.router or default_router_name(sim_cfg.dp), seed=sched_cfg.seed
        )
    series = TimeSeries()
    t0 = time.perf_counter()
    lockstep_stats: LockstepStats | None = None
    if gates is not None:
        from radixsched.sim.deploy.lockstep import run_lockstep

        lockstep_stats = run_lockstep(
            replicas, gates, reqs, router, sim_cfg, series, on_progress, check_integrity
        )
    elif closed:
        sends = run_closed_loop(
            replicas,
            reqs,
            router,
            series,
            on_progress,
            check_integrity,
            max_concurrency=int(sim_cfg.max_concurrency or 1),
            latency_s=latency,
            serial_s=serial,
        )
    else:
        _run_event_loop(replicas, reqs, router, series, on_progress, check_integrity)
    for rep in replicas:
        rep.sched.sync_running()  # requests a run left unfinished are read below
    restore_send_times(reqs, sends)  # client-side times: TTFT and E2E include the latency
    wall = time.perf_counter() - t0

    stats = [rep.sched.stats for rep in replicas]
    extra: dict[str, Any] = {
        "kv_capacity_tokens": capacity,
        "dp": sim_cfg.dp,
        "rejected": sum(s.rejected for s in stats),
        "gpus": gpu_count(sim_cfg),
        "deployment": deployment_label(sim_cfg),
    }
    summaries = [
        ReplicaSummary(
            replica=rep.idx,
            num_requests=len(rep.reqs),
            hit_rate=_ratio(rep.sched.stats.cached_prompt_tokens, rep.sched.stats.prompt_tokens),
            prefill_tokens_computed=rep.sched.stats.prefill_tokens_computed,
            retractions=rep.sched.stats.retractions,
            prompt_tokens=rep.sched.stats.prompt_tokens,
            host_hit_rate=_ratio(
                rep.sched.stats.host_cached_prompt_tokens, rep.sched.stats.prompt_tokens
            ),
            busy_s=rep.busy_s,
        )
        for rep in replicas
    ]
    if sim_cfg.dp > 1:
        extra["replicas"] = [s.to_json() for s in summaries]
    if lockstep_stats is not None:
        extra["lockstep"] = lockstep_stats.to_json()
    result = summarize(
        sched_cfg.schedule_policy,
        reqs,
        series,
        optimal_hit_rate=opt,
        wall_s=wall,
        retractions=sum(s.retractions for s in stats),
        preemptions=sum(s.preemptions for s in stats),
        extra=extra,
    )
    if len(replicas) == 1:
        # Exact per-step statistics from the scheduler rather than the sampled series (the
        # driver samples once per step() call, and a decode jump is one call).
        st = replicas[0].sched.stats
        result = dataclasses.replace(
            result,
            peak_queue_len=st.peak_waiting,
            mean_running=st.running_x_s / st.busy_s if st.busy_s > 0 else 0.0,
            peak_kv_usage=st.peak_kv_usage,
        )
    replica_of = {r.rid: rep.idx for rep in replicas for r in rep.reqs}
    return SimRun(
        result,
        series,
        ttft_samples(reqs),
        reqs,
        summaries,
        capacity,
        lockstep_stats,
        replica_of,
        cost.describe(),
    )


def _run_event_loop(
    replicas: Sequence[Replica],
    reqs: Sequence[Req],
    router: Any,
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
) -> None:
    if len(replicas) == 1 and router is None:
        _run_one_replica(replicas[0], reqs, series, on_progress, check_integrity)
        return
    n = len(reqs)
    i = 0
    done = 0
    last_t = 0.0
    while True:
        ta = reqs[i].arrival_time if i < n else math.inf
        stepped = step_earliest(replicas, ta, check_integrity)
        if stepped is not None:
            rep, out, start = stepped
            finished = len(out.finished)
            if router is not None:
                for r in out.finished:
                    router.on_finish(r, rep.idx)
            last_t = max(last_t, start)
            sample_series(series, last_t, replicas)
            if finished and on_progress is not None:
                done += finished
                on_progress(done, n)
            continue
        if i >= n:
            break
        for idle in replicas:
            if idle.sched.is_idle:
                idle.clock.jump_to(ta)
        deliver(reqs[i], replicas, router, ta)
        i += 1
    if on_progress is not None:
        on_progress(n, n)


def _run_one_replica(
    rep: Replica,
    reqs: Sequence[Req],
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
) -> None:
    """``_run_event_loop`` for one replica without a router (the common case, kept lean: it
    runs once per scheduler step). Steps until the next arrival, then delivers it."""
    sched, clock = rep.sched, rep.clock
    n = len(reqs)
    done = 0
    for i in range(n + 1):
        ta = reqs[i].arrival_time if i < n else math.inf
        horizon = None if i == n else ta
        while not sched.is_idle and clock.now() < ta:
            start = clock.now()
            out = sched.step(horizon)
            if check_integrity:
                sched.check_integrity()
            if out is None:
                raise RuntimeError(
                    f"replica {rep.idx} has work but could not schedule it "
                    f"(waiting={len(sched.waiting)}, running={len(sched.running)})"
                )
            sample_series(series, start, (rep,))
            if out.finished and on_progress is not None:
                done += len(out.finished)
                on_progress(done, n)
        if i < n:
            if sched.is_idle:
                clock.jump_to(ta)
            deliver(reqs[i], (rep,), None, ta)
    if on_progress is not None:
        on_progress(n, n)
