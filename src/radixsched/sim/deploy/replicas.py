"""Replicas as the simulation drivers see them (the event loop in ``simulate`` and the
lockstep loop in ``lockstep``): a scheduler with its own virtual clock, routing an arrival to
one, and sampling the cluster's time series."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.native.arrive import arrivals
from radixsched.native.build import build_scheduler
from radixsched.request import Req
from radixsched.results.series import TimeSeries
from radixsched.scheduler import Scheduler, StepOutcome
from radixsched.sim.settings.simconfig import SimConfig


class Replica:
    def __init__(
        self, idx: int, sched: Scheduler, clock: VirtualClock, min_step_s: float = 0.0
    ) -> None:
        self.idx = idx
        self.sched = sched
        self.clock = clock
        self.reqs: list[Req] = []
        # No step of this replica takes less (0.0: no floor known): see ``earliest_finish``.
        self.min_step_s = min_step_s
        # ``native.arrive.add_arrivals`` bound to ``sched`` (``deliver_batch``; None until then).
        self.arrive: Callable[[Sequence[Req]], None] | None = None

    @property
    def busy_s(self) -> float:
        """Virtual time spent running batches: the scheduler's per-step sum, the same however
        its steps were grouped (decode jumps, middle chunks run within one step)."""
        return self.sched.stats.busy_s


def replica_load(rep: Replica) -> Any:
    from radixsched.cluster.routers import ReplicaLoad

    s = rep.sched
    waiting_uncached = sum(max(r.fill_len - r.num_matched_prefix_tokens, 0) for r in s.waiting)
    running_decode = sum(s.decode_tokens_to_go())
    if s.chunked_req is not None:
        waiting_uncached += s.chunked_req.fill_len - s.chunked_req.prefix_len
    return ReplicaLoad(
        replica_id=rep.idx,
        waiting_uncached_tokens=waiting_uncached,
        running_decode_tokens=running_decode,
        num_waiting=len(s.waiting),
        num_running=s.num_running(),
        kv_usage=s.kv_usage(),
    )


def earliest_finish(rep: Replica) -> float:
    """No request of ``rep`` can finish before this time (its clock when unknown). A request
    with ``R`` tokens to go needs ``R`` more steps (one when a stop id can end it early), each
    at least ``min_step_s`` long; arrivals come no earlier than the caller's horizon, and the
    door caps every request to fit the pool alone, so none is aborted for memory."""
    floor, now = rep.min_step_s, rep.clock.now()
    if floor <= 0.0:
        return now
    s = rep.sched
    queued = s.waiting if s.chunked_req is None else [*s.waiting, s.chunked_req]
    eos = bool(s.eos_ids)
    for r in itertools.chain(s.running, queued):
        if r.sampling.stop_token_ids or (eos and not r.sampling.ignore_eos):
            return now + floor
    to_go = [*s.decode_tokens_to_go(), *(r.remaining_new_tokens for r in queued)]
    return now + max(min(to_go, default=1), 1) * floor


def sample_series(series: TimeSeries, t: float, replicas: Sequence[Replica]) -> None:
    if len(replicas) == 1:
        s = replicas[0].sched
        series.append(
            t,
            len(s.waiting),
            s.num_running(),
            s.kv_usage(),
            s.stats.cached_prompt_tokens,
            s.stats.prompt_tokens,
        )
        return
    series.append(
        t,
        sum(len(r.sched.waiting) for r in replicas),
        sum(r.sched.num_running() for r in replicas),
        sum(r.sched.kv_usage() for r in replicas) / len(replicas),
        sum(r.sched.stats.cached_prompt_tokens for r in replicas),
        sum(r.sched.stats.prompt_tokens for r in replicas),
    )


def deliver(req: Req, replicas: Sequence[Replica], router: Any, t: float) -> Replica:
    if router is None:
        rep = replicas[0]
    else:
        loads = [replica_load(r) for r in replicas]
        rep = replicas[router.route(req, loads, t)]
    rep.reqs.append(req)
    rep.sched.add_request(req, now=t)
    return rep


def deliver_batch(reqs: Sequence[Req], rep: Replica) -> None:
    """``deliver(r, (rep,), None, r.arrival_time)`` for each of ``reqs`` in order, no step
    between (``native.arrive.add_arrivals``: their matching in one native call)."""
    rep.reqs.extend(reqs)
    arrive = rep.arrive
    if arrive is None:  # bound on first use (the scheduler's setup is fixed for the run)
        arrive = rep.arrive = arrivals(rep.sched)
    arrive(reqs)


def step_earliest(
    replicas: Sequence[Replica],
    before: float,
    check_integrity: bool,
    *,
    reply_s: float | None = None,
) -> tuple[Replica, StepOutcome, float] | None:
    """Step the busy replica whose clock is earliest (lowest index on ties), if that clock is
    before ``before`` (the next arrival, inf for none): (replica, outcome, its clock at the
    step's start); None when no replica is busy that early.

    ``reply_s``: a request finishing on one replica sends the next arrival at least this long
    after (closed-loop clients). The step may then run several passes (``Scheduler.step``'s
    horizon) only until the soonest arrival another busy replica could cause (its
    ``earliest_finish`` plus ``reply_s``): its clock lags, and that arrival could be routed
    here."""
    busy = [r for r in replicas if not r.sched.is_idle]
    rep = min(busy, key=lambda r: (r.clock.now(), r.idx)) if busy else None
    if rep is None or rep.clock.now() >= before:
        return None
    start = rep.clock.now()
    horizon = before
    if reply_s is not None:
        others = [earliest_finish(r) for r in busy if r is not rep]
        horizon = min([before, *(t + reply_s for t in others)])
    out = rep.sched.step(None if horizon == math.inf else horizon)
    if check_integrity:
        rep.sched.check_integrity()
    if out is None:
        raise RuntimeError(
            f"replica {rep.idx} has work but could not schedule it "
            f"(waiting={len(rep.sched.waiting)}, running={len(rep.sched.running)})"
        )
    return rep, out, start


# (cost model, seed, the replica's clock) -> the replica's runner, called once per replica
# before its scheduler is built (calibration's step recorder, ``sim.calibrate.fit``).
RunnerFactory = Callable[[Any, int, VirtualClock], Any]


def clone_request(r: Req, *, arrival_time: float | None = None) -> Req:
    """A fresh, unscheduled copy (prompt arrays are shared, never mutated), arriving at
    ``arrival_time`` when given."""
    return Req(
        rid=r.rid,
        prompt_ids=r.prompt_ids,
        sampling=r.sampling,
        priority=r.priority,
        routing_key=r.routing_key,
        extra_key=r.extra_key,
        cache_salt=r.cache_salt,
        tenant=r.tenant,
        arrival_time=r.arrival_time if arrival_time is None else arrival_time,
        scripted_output=r.scripted_output,
    )


def _build_replica(
    idx: int,
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig,
    cost: Any,
    capacity: int,
    *,
    accelerate: bool = True,
    clock: VirtualClock | None = None,
    gate_factory: Any = None,
    single_step: bool = False,
    runner_factory: RunnerFactory | None = None,
) -> Replica:
    from radixsched.sim.cost.runner import CostModelRunner

    clock = clock if clock is not None else VirtualClock()
    host = None
    if sim_cfg.enable_hierarchical_cache:
        from radixsched.cluster.hicache import HostKVTier, host_capacity_tokens

        if sim_cfg.hicache_page_size < 1:
            raise ValueError(f"--hicache-page-size must be >= 1, got {sim_cfg.hicache_page_size}")
        p = max(sched_cfg.page_size, 1)
        host = HostKVTier(
            host_capacity_tokens(sim_cfg.hicache_size, cost.model.kv_bytes_per_token),
            # Whole device pages, so a host hit never ends inside a device page.
            page_size=-(-sim_cfg.hicache_page_size // p) * p,
        )
    runner: Any
    if runner_factory is None:
        runner = CostModelRunner(cost, seed=sched_cfg.seed)
    else:  # e.g. calibration's step recorder (``sim.calibrate.fit``)
        runner = runner_factory(cost, sched_cfg.seed, clock)
    if single_step:
        runner = SingleStepRunner(runner)
    sched = build_scheduler(
        sched_cfg,
        runner,
        accelerate=accelerate,
        kv_slots=capacity,
        clock=clock,
        context_len=cost.model.max_context_len,
        host_tier=host,
        gate_factory=gate_factory,
    )
    floor = _min_step_s(cost, runner_factory) if host is None else 0.0
    return Replica(idx, sched, clock, floor)


def _min_step_s(cost: Any, runner_factory: RunnerFactory | None) -> float:
    """The replica's floor on step times (``CostModel.min_step_s``), for the cost model's own
    runner on a roofline model; 0.0 (none known) for any other. Without a host tier only:
    its loads hold device KV that ``earliest_finish``'s reasoning does not account for."""
    from radixsched.sim.cost.roofline import CostModel

    return cost.min_step_s() if runner_factory is None and type(cost) is CostModel else 0.0


class SingleStepRunner:
    """A runner as a lockstep rank sees it: one global pass is one step of every rank, so it
    never runs several decode steps at once (everything else is the wrapped runner's)."""

    supports_multi_step = False

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def forward(self, batch: Any) -> Any:
        return self._runner.forward(batch)

    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self._runner.eos_token_ids())
