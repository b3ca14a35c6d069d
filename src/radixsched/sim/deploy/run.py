"""What every deployment's run shares: the requests as the clients send them, and one assembly of
a finished run into a ``SimRun`` (the policy's result, its series, each replica's share)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from radixsched.request import Req
from radixsched.results.metrics import PolicyResult, summarize
from radixsched.results.reqarrays import RequestArrays
from radixsched.results.series import TimeSeries
from radixsched.sim.deploy.closed_loop import restore_send_times
from radixsched.sim.deploy.replicas import Replica, clone_request
from radixsched.sim.settings.deployment import deployment_label, gpu_count
from radixsched.sim.settings.simconfig import SimConfig

if TYPE_CHECKING:
    from radixsched.sim.deploy.lockstep import LockstepStats


@dataclass
class ReplicaSummary:
    """One replica's share of a run. Hit rates are token-weighted over the prompts the
    replica scheduled (``hit_rate = device + host``)."""

    replica: int
    num_requests: int
    hit_rate: float
    prefill_tokens_computed: int
    retractions: int
    prompt_tokens: int = 0
    host_hit_rate: float = 0.0
    busy_s: float = 0.0  # virtual time spent running batches (its own, not the pass's)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SimRun:
    """A simulated run: its summary, time series, TTFTs, requests and replicas."""

    result: PolicyResult
    series: TimeSeries
    ttft_s: np.ndarray
    requests: list[Req]
    replicas: list[ReplicaSummary]
    kv_capacity_tokens: int
    # Pass accounting of a lockstep (--enable-dp-attention) run; None otherwise.
    lockstep: LockstepStats | None = None
    # Request id -> the replica the router sent it to (every admitted or rejected request).
    replica_of: Mapping[str, int] = field(default_factory=dict)
    # ``describe()`` of the cost model: every constant the run used.
    cost_model: dict[str, Any] = field(default_factory=dict)


class Lazily(Mapping[str, int]):
    """The mapping ``make`` returns, made when first read (a run's ``replica_of``: read only
    where per-request rows are kept; a dict of 1M requests costs 0.1-0.3 s)."""

    def __init__(self, make: Callable[[], dict[str, int]]) -> None:
        self.made = functools.cache(make)

    def __getitem__(self, key: str) -> int:
        return self.made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.made())

    def __len__(self) -> int:
        return len(self.made())


def client_requests(workload: Any, *, reuse: bool = False) -> list[Req]:
    """Fresh, unscheduled copies of the workload's requests in arrival order; with deferred
    prompts (``workload.drafts``), a sequence that builds each prompt as the run reaches it
    (``sim.workloads.deferred``). ``reuse``: the workload's own requests, not copies (the
    caller's promise: they were never scheduled, and nothing reads them after this run; a
    copy of a fresh request equals it field for field, so the run is the same)."""
    own: list[Req] = workload.requests
    drafts = getattr(workload, "drafts", None)
    if drafts is None:
        return sorted(own if reuse else map(clone_request, own), key=lambda r: r.arrival_time)
    from radixsched.sim.workloads.deferred import ArrivingRequests

    order = sorted(range(len(own)), key=lambda i: own[i].arrival_time)
    reqs = [own[i] for i in order] if reuse else [clone_request(own[i]) for i in order]
    return cast(list[Req], ArrivingRequests(reqs, [drafts[i] for i in order]))


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
    replica_of: Mapping[str, int],
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
    arrays = RequestArrays.of(reqs)  # read once: the summary's and the TTFT CDF's samples
    result = summarize(
        policy,
        reqs,
        series,
        arrays=arrays,
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
        arrays.ttft(),
        reqs,
        summaries,
        capacity,
        lockstep,
        replica_of,
        cost_model,
    )
