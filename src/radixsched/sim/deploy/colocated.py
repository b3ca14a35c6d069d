"""Co-located replicas (``--dp N``, each replica prefills and decodes): the replicas built from
one cost model, a router when there are several, and one of three drivers: open-loop arrivals
(``open_loop``), closed-loop clients (``closed_loop``, ``--max-concurrency``), or lockstep ranks
(``lockstep``, ``--enable-dp-attention``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig, resolve_max_running_requests
from radixsched.request import Req
from radixsched.results.series import TimeSeries
from radixsched.sim.cost.build import build_cost_model
from radixsched.sim.deploy.closed_loop import run_closed_loop, shift_to_scheduler
from radixsched.sim.deploy.open_loop import run_open_loop
from radixsched.sim.deploy.replicas import Replica, RunnerFactory, _build_replica
from radixsched.sim.deploy.run import Lazily, SimRun, assemble, end_run, replica_summary
from radixsched.sim.heap import frozen_heap
from radixsched.sim.settings.simconfig import SimConfig

Progress = Callable[[int, int], None]


def _router(sched_cfg: SchedulerConfig, sim_cfg: SimConfig) -> Any:
    if sim_cfg.dp == 1:
        return None
    from radixsched.cluster.routers import create_router, default_router_name

    return create_router(sim_cfg.router or default_router_name(sim_cfg.dp), seed=sched_cfg.seed)


def _replicas(
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig,
    cost: Any,
    clocks: list[VirtualClock],
    gates: Any,
    accelerate: bool,
    runner_factory: RunnerFactory | None,
) -> list[Replica]:
    capacity = int(cost.kv_capacity_tokens())
    return [
        _build_replica(
            i,
            sched_cfg,
            sim_cfg,
            cost,
            capacity,
            accelerate=accelerate,
            clock=clocks[i],
            gate_factory=None if gates is None else gates.recorders[i],
            single_step=gates is not None,
            runner_factory=runner_factory,
        )
        for i in range(sim_cfg.dp)
    ]


def _lockstep_gates(
    sched_cfg: SchedulerConfig, sim_cfg: SimConfig, cost: Any, clocks: list[VirtualClock]
) -> Any:
    """The prefill delayer's gates of ``--enable-dp-attention`` ranks, or None."""
    if not (sim_cfg.enable_dp_attention and sim_cfg.dp > 1):
        return None
    from radixsched.sim.deploy.lockstep import lockstep_gates

    capacity = int(cost.kv_capacity_tokens())
    slots = resolve_max_running_requests(sched_cfg, capacity, cost.model.max_context_len)
    return lockstep_gates(sim_cfg, sched_cfg, clocks, slots)


def run_colocated(
    reqs: list[Req],
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig,
    *,
    optimal_hit_rate: float,
    on_progress: Progress | None = None,
    check_integrity: bool = False,
    accelerate: bool = True,
    runner_factory: RunnerFactory | None = None,
) -> SimRun:
    """Run ``reqs`` (fresh copies, in arrival order) on ``sim_cfg.dp`` co-located replicas."""
    if sim_cfg.dp < 1:
        raise ValueError(f"--dp must be >= 1, got {sim_cfg.dp}")
    cost = build_cost_model(sim_cfg)
    described = cost.describe()
    latency = float(described.get("request_latency_s", 0.0))
    serial = float(described.get("request_serial_s", 0.0))
    closed = sim_cfg.max_concurrency is not None
    if closed and sim_cfg.enable_dp_attention and sim_cfg.dp > 1:
        raise ValueError("--max-concurrency is not supported with --enable-dp-attention")
    sends = [] if closed else shift_to_scheduler(reqs, latency, serial)
    clocks = [VirtualClock() for _ in range(sim_cfg.dp)]
    gates = _lockstep_gates(sched_cfg, sim_cfg, cost, clocks)
    replicas = _replicas(sched_cfg, sim_cfg, cost, clocks, gates, accelerate, runner_factory)
    router, series = _router(sched_cfg, sim_cfg), TimeSeries()
    started = time.perf_counter()
    lockstep = None
    with frozen_heap(len(reqs)):
        if gates is not None:
            from radixsched.sim.deploy.lockstep import run_lockstep

            args = (replicas, gates, reqs, router, sim_cfg, series, on_progress, check_integrity)
            lockstep = run_lockstep(*args)
        elif closed:
            clients = int(sim_cfg.max_concurrency or 1)
            sends = run_closed_loop(
                replicas, reqs, router, series, on_progress, check_integrity,
                max_concurrency=clients, latency_s=latency, serial_s=serial,
            )  # fmt: skip
        else:
            run_open_loop(replicas, reqs, router, series, on_progress, check_integrity)
    end_run(replicas, reqs, sends)
    routed = [(rep.idx, rep.reqs) for rep in replicas]  # (not the replicas: kept with the run)
    extra: dict[str, Any] = {}
    if sim_cfg.dp > 1:
        extra["replicas"] = [replica_summary(rep).to_json() for rep in replicas]
    if lockstep is not None:
        extra["lockstep"] = lockstep.to_json()
    run = assemble(
        sched_cfg.schedule_policy, reqs, replicas, series, sim_cfg,
        optimal_hit_rate=optimal_hit_rate, started=started,
        capacity=int(cost.kv_capacity_tokens()), extra=extra,
        replica_of=Lazily(lambda: {r.rid: i for i, reqs in routed for r in reqs}),
        cost_model=described, lockstep=lockstep,
    )  # fmt: skip
    if len(replicas) == 1:
        _exact_single_replica_stats(run, replicas[0])
    return run


def _exact_single_replica_stats(run: SimRun, rep: Replica) -> None:
    """One replica's exact per-step statistics from its scheduler, in place of the sampled
    series' (the driver samples once per ``step()`` call, and a decode jump is one call)."""
    st = rep.sched.stats
    run.result = dataclasses.replace(
        run.result,
        peak_queue_len=st.peak_waiting,
        mean_running=st.running_x_s / st.busy_s if st.busy_s > 0 else 0.0,
        peak_kv_usage=st.peak_kv_usage,
    )
