"""The simulation driver: replay a workload through the exact scheduler on a virtual clock.

``simulate`` resolves once (the settings, the requests as the clients send them, the optimal hit
rate) and hands the run to its deployment: co-located replicas (``deploy.colocated``: open-loop
arrivals, closed-loop clients or lockstep ranks) or a split prefill/decode deployment
(``deploy.disagg``). Each deployment builds its replicas from one cost model, drives them, and
assembles its ``SimRun`` through ``deploy.run``.

The simulator path never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixsched.config import SchedulerConfig
from radixsched.sim.deploy.colocated import run_colocated
from radixsched.sim.deploy.replicas import RunnerFactory
from radixsched.sim.deploy.run import SimRun, client_requests
from radixsched.sim.heap import frozen_heap, paused_gc
from radixsched.sim.settings.simconfig import SimConfig


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
    reuse_requests: bool = False,
) -> SimRun:
    """Replay ``workload`` (a ``sim.workloads.load.Workload``) under one scheduler configuration.

    ``accelerate``: run the scheduler with its accelerators (``radixsched.native``); they change
    no result, only speed. Off, every round runs the reference core's full work.
    ``runner_factory`` replaces each replica's ``CostModelRunner`` (a lockstep rank still
    wraps it in ``SingleStepRunner``). ``sim_cfg.max_concurrency`` runs closed-loop clients and
    the cost model's request latency delays arrivals (``deploy.closed_loop``); reported times
    are the client's. ``reuse_requests``: run the workload's own requests, not copies (when
    they were never run and nothing reads them after: ``deploy.run.client_requests``)."""
    sim_cfg = sim_cfg or SimConfig()
    if optimal_hit_rate is None:
        from radixsched.sim.workloads.load import optimal_hit_rate as compute_optimal

        optimal_hit_rate = compute_optimal(workload.requests, page_size=sched_cfg.page_size)
    if sim_cfg.disaggregation:
        from radixsched.sim.deploy.disagg import run_disaggregated as run
    else:
        run = run_colocated
    # The workload's objects are left out of the collector's passes for the run, and the
    # clients' copies made without any (sim.heap: a million requests are millions of objects).
    with frozen_heap(len(workload.requests)):
        with paused_gc():
            reqs = client_requests(workload, reuse=reuse_requests)
        return run(
            reqs,
            sched_cfg,
            sim_cfg,
            optimal_hit_rate=optimal_hit_rate,
            on_progress=on_progress,
            check_integrity=check_integrity,
            accelerate=accelerate,
            runner_factory=runner_factory,
        )
