"""What every deployment's run shares: the requests as the clients send them, and one assembly of
a finished run into a ``SimRun`` (the policy's result, its series, each replica's share)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from radixsched.request import Req
from radixsched.results.metrics import summarize
from radixsched.results.requests import ttft_samples
from radixsched.results.series import TimeSeries
from radixsched.sim.deploy.closed_loop import restore_send_times
from radixsched.sim.deploy.replicas import Replica, ReplicaSummary, SimRun, clone_request
from radixsched.sim.settings.deployment import deployment_label, gpu_count
from radixsched.sim.settings.simconfig import SimConfig


def client_requests(workload: Any) -> list[Req]:
    """Fresh, unscheduled copies of the workload's requests in arrival order."""
    return sorted((clone_request(r) for r in workload.requests), key=lambda r: r.arrival_time)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def replica_summary(rep: Replica) -> ReplicaSummary:
    """One replica's (or instance's) share of a run, from its scheduler's counters."""
    st = rep.sched.stats
    return ReplicaSummary(
        replica=rep.idx,
        num_requests=len(rep.reqs),
        hit_rate=_ratio(st.cached_prompt_tokens, st.prompt_tokens),
        prefill_tokens_computed=st.prefill_tokens_computed,
        retractions=st.retractions,
        prompt_tokens=st.prompt_tokens,
        host_hit_rate=_ratio(st.host_cached_prompt_tokens, st.prompt_tokens),
        busy_s=rep.busy_s,
    )


def end_run(replicas: Sequence[Replica], reqs: Sequence[Req], sends: list[float]) -> None:
    """Close a run: running requests' deferred fields are read back, and times become the
    client's (a request's TTFT and E2E include its latency to the scheduler)."""
    for rep in replicas:
        rep.sched.sync_running()
    restore_send_times(reqs, sends)


def assemble(
    policy: str,
    reqs: list[Req],
    replicas: Sequence[Replica],
    series: TimeSeries,
    sim_cfg: SimConfig,
    *,
    optimal_hit_rate: float,
    started: float,
    capacity: int,
    extra: dict[str, Any],
    replica_of: dict[str, int],
    cost_model: dict[str, Any],
    lockstep: Any = None,
) -> SimRun:
    """The ``SimRun`` of a finished run (``end_run`` done). ``extra``: what this deployment adds
    to the result's common entries (capacity, dp, rejections, GPUs, the deployment's label)."""
    wall = time.perf_counter() - started
    stats = [rep.sched.stats for rep in replicas]
    common: dict[str, Any] = {
        "kv_capacity_tokens": capacity,
        "dp": sim_cfg.dp,
        "rejected": sum(s.rejected for s in stats),
        "gpus": gpu_count(sim_cfg),
        "deployment": deployment_label(sim_cfg),
    }
    result = summarize(
        policy,
        reqs,
        series,
        optimal_hit_rate=optimal_hit_rate,
        wall_s=wall,
        retractions=sum(s.retractions for s in stats),
        preemptions=sum(s.preemptions for s in stats),
        extra=common | extra,
    )
    summaries = [replica_summary(rep) for rep in replicas]
    return SimRun(
        result,
        series,
        ttft_samples(reqs),
        reqs,
        summaries,
        capacity,
        lockstep,
        replica_of,
        cost_model,
    )
