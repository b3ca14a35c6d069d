"""Lockstep data-parallel attention (``--enable-dp-attention``): replicas step together.

With attention data parallelism the ranks share the MLP/MoE layers, so every forward pass is
a collective: all ranks run their own batch (an idle rank runs an empty one) and the pass
ends when the slowest rank's batch ends. A rank that prefills therefore stretches its peers'
decode steps to its own prefill time; the prefill delayer (``cluster.delayer``) negotiates,
once per pass, whether anyone prefills, so prefills line up.

The loop (``run_lockstep``), one iteration per global pass:

1. arrivals at or before the pass start are routed (the router sees every rank's load);
2. every rank runs exactly one ``Scheduler.step()`` from the same start time. With the delayer
   each rank's scheduler gets a gate from its ``PrefillDelayer``; all delayers share one
   ``LocalAllGather`` and the ranks' steps run on one thread each (``LockstepRunner``),
   because the collective happens deep inside the prefill adder. Idle ranks step too: their
   pass builds and finalizes a gate, so every rank joins every negotiation exactly once;
3. the pass lasts as long as the slowest rank's step: every clock moves to that end, and the
   tokens of the pass are stamped with it (they leave the collective forward together).

Each rank is built for lockstep (``lockstep_gates``, ``SingleStepRunner``): its scheduler gets
its gate at construction and its runner never runs several decode steps at once, so one global
pass is one step of every rank. A pass in which no rank runs a batch (every rank with
work was delayed) takes no virtual time; the delayer's pass cap bounds how many such passes
can follow each other.

Utilisation (``LockstepStats.utilisation``): the ranks' own batch time divided by
``dp * sum(pass durations)``, i.e. the mean fraction of each pass a rank spends on its own
work rather than waiting for the slowest rank. ``stalled_rank_s`` is the rank-time lost in
passes where some rank prefilled while this one only decoded (or idled with running work)."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from radixsched.cluster.delayer import (
    DelayerConfig,
    LocalAllGather,
    LockstepRunner,
    PrefillDelayer,
    PrefillDelayerPass,
    Verdict,
)
from radixsched.config import SchedulerConfig
from radixsched.request import Req
from radixsched.results.series import TimeSeries
from radixsched.scheduler import Scheduler, StepOutcome

if TYPE_CHECKING:
    from radixsched.sim.deploy.replicas import Replica
    from radixsched.sim.settings.simconfig import SimConfig


def delayer_config(sim_cfg: SimConfig, sched_cfg: SchedulerConfig) -> DelayerConfig:
    """The delayer's settings: the ``prefill_delayer_*`` simulator fields, the scheduler's
    ``prefill_max_requests`` (queue-condition capacity) and its ``compat`` switch."""
    return DelayerConfig(
        max_delay_passes=sim_cfg.prefill_delayer_max_delay_passes,
        token_usage_low_watermark=sim_cfg.prefill_delayer_token_usage_low_watermark,
        queue_min_ratio=sim_cfg.prefill_delayer_queue_min_ratio,
        max_delay_ms=sim_cfg.prefill_delayer_max_delay_ms,
        prefill_max_requests=sched_cfg.prefill_max_requests,
        compat=sched_cfg.compat,
    )


class PassLog(NamedTuple):
    """One entry per global pass (columns of equal length)."""

    start: array[float]
    end: array[float]
    delayed: array[int]  # 1 when the delayer vetoed prefill in this pass


@dataclass
class LockstepStats:
    dp: int
    passes: int = 0  # global passes, empty ones included
    empty_passes: int = 0  # passes in which some rank had work but no rank ran a batch
    pass_s: float = 0.0  # sum of pass durations (virtual seconds)
    busy_rank_s: float = 0.0  # sum over ranks of their own batch time
    stalled_rank_s: float = 0.0  # decode-side rank time lost to a peer's prefill
    prefill_passes: int = 0  # passes in which at least one rank prefilled
    prefill_rank_passes: int = 0  # (rank, pass) pairs with a prefill
    decode_rank_passes: int = 0  # (rank, pass) pairs with a decode-only batch
    delayed_passes: int = 0  # passes whose negotiated verdict was a veto
    verdicts: Counter[str] = field(default_factory=Counter)
    # Released delay streaks: vetoed passes and virtual seconds from the first veto to release.
    delay_streaks: list[int] = field(default_factory=list)
    delay_streak_s: list[float] = field(default_factory=list)
    log: PassLog = field(default_factory=lambda: PassLog(array("d"), array("d"), array("b")))

    @property
    def utilisation(self) -> float:
        """Mean fraction of a pass that a rank spends on its own batch (0 with no passes)."""
        den = self.dp * self.pass_s
        return self.busy_rank_s / den if den > 0 else 0.0

    @property
    def mean_prefill_ranks(self) -> float:
        """Ranks prefilling together, averaged over passes with a prefill."""
        return self.prefill_rank_passes / self.prefill_passes if self.prefill_passes else 0.0

    @property
    def max_delay_streak(self) -> int:
        return max(self.delay_streaks, default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "empty_passes": self.empty_passes,
            "pass_s": self.pass_s,
            "busy_rank_s": self.busy_rank_s,
            "stalled_rank_s": self.stalled_rank_s,
            "utilisation": self.utilisation,
            "prefill_passes": self.prefill_passes,
            "prefill_rank_passes": self.prefill_rank_passes,
            "mean_prefill_ranks": self.mean_prefill_ranks,
            "decode_rank_passes": self.decode_rank_passes,
            "delayed_passes": self.delayed_passes,
            "max_delay_streak": self.max_delay_streak,
            "max_delay_streak_s": max(self.delay_streak_s, default=0.0),
            "verdicts": dict(sorted(self.verdicts.items())),
        }


class _GateRecorder:
    """A rank's ``gate_factory``: builds the delayer's per-pass executor and keeps the last
    one, so the driver can read the pass's verdict."""

    def __init__(self, delayer: PrefillDelayer) -> None:
        self.delayer = delayer
        self.last: PrefillDelayerPass | None = None

    def __call__(self, sched: Scheduler) -> PrefillDelayerPass:
        gate = self.delayer.gate_for(sched)
        self.last = gate
        return gate

    def take_verdict(self) -> Verdict:
        gate, self.last = self.last, None
        if gate is None or gate.verdict is None or not gate.finalized:
            raise RuntimeError(f"rank {self.delayer.rank} finished a pass without negotiating")
        return gate.verdict


def _restamp(out: StepOutcome, rank_end: float, pass_end: float) -> None:
    """Move the times the rank stamped at its own step end to the pass end."""
    if rank_end == pass_end:
        return
    for r, toks in out.new_tokens:
        times = r.times
        tt = times.token_times
        for j in range(len(tt) - len(toks), len(tt)):
            if tt[j] == rank_end:
                tt[j] = pass_end
        if times.first_token == rank_end:
            times.first_token = pass_end
        if times.finish == rank_end:
            times.finish = pass_end


def _is_prefill(out: StepOutcome | None) -> bool:
    return out is not None and out.prefill_tokens > 0


class LockstepGates(NamedTuple):
    """Each rank's prefill-delayer gate factory (None without the delayer) and the pool
    the ranks step on (the delayer's collective happens deep inside the prefill adder)."""

    recorders: list[_GateRecorder | None]
    pool: LockstepRunner | None


def lockstep_gates(
    sim_cfg: SimConfig, sched_cfg: SchedulerConfig, clocks: Sequence[Any], max_running: int
) -> LockstepGates:
    """The gates the ranks' schedulers are built with (before they exist)."""
    dp = len(clocks)
    if not sim_cfg.enable_prefill_delayer:
        return LockstepGates([None] * dp, None)
    gather = LocalAllGather(dp)
    cfg = delayer_config(sim_cfg, sched_cfg)
    recorders: list[_GateRecorder | None] = [
        _GateRecorder(
            PrefillDelayer(
                cfg,
                max_running_requests=max_running,
                clock=clocks[rank].now,
                all_gather=gather,
                rank=rank,
            )
        )
        for rank in range(dp)
    ]
    return LockstepGates(recorders, LockstepRunner(gather))


def run_lockstep(
    replicas: Sequence[Replica],
    gates: LockstepGates,
    reqs: Sequence[Req],
    router: Any,
    sim_cfg: SimConfig,
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
) -> LockstepStats:
    """Replay ``reqs`` (sorted by arrival) through ``replicas`` (built with ``gates`` and
    single-step runners) in lockstep passes."""
    loop = _Lockstep(replicas, gates, router, sim_cfg, check_integrity)
    try:
        loop.run(reqs, series, on_progress)
    finally:
        loop.close()
    return loop.stats


class _Lockstep:
    def __init__(
        self,
        replicas: Sequence[Replica],
        gates: LockstepGates,
        router: Any,
        sim_cfg: SimConfig,
        check_integrity: bool,
    ) -> None:
        dp = len(replicas)
        if [rep.idx for rep in replicas] != list(range(dp)):
            raise ValueError("replica ids must be 0..dp-1 in order (they are the ranks)")
        if any(rep.sched.runner.supports_multi_step for rep in replicas):
            raise ValueError("lockstep ranks step one pass at a time (SingleStepRunner)")
        self.replicas = replicas
        self.router = router
        self.check_integrity = check_integrity
        self.recorders = [rec for rec in gates.recorders if rec is not None]
        self.pool = gates.pool
        # Consecutive passes without any batch: one (a decode pass that only retracted) plus
        # the delayer's pass cap; more means a rank holds work it can never schedule.
        self.max_empty_run = 1 + (sim_cfg.prefill_delayer_max_delay_passes if self.recorders else 0)
        self.stats = LockstepStats(dp=dp)
        self._streak = 0
        self._streak_start = 0.0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def run(
        self,
        reqs: Sequence[Req],
        series: TimeSeries,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        from radixsched.sim.deploy.replicas import deliver, sample_series

        replicas = self.replicas
        n = len(reqs)
        i = 0
        done = 0
        now = 0.0
        empty_run = 0
        while True:
            while i < n and reqs[i].arrival_time <= now:
                deliver(reqs[i], replicas, self.router, reqs[i].arrival_time)
                i += 1
            if all(rep.sched.is_idle for rep in replicas):
                if i >= n:
                    break
                now = reqs[i].arrival_time
                for rep in replicas:
                    rep.clock.jump_to(now)
                continue
            outs, end = self._step_pass(now)
            empty_run = (
                0 if any(o is not None and o.batch_size > 0 for o in outs) else empty_run + 1
            )
            if empty_run > self.max_empty_run:
                raise RuntimeError(f"{empty_run} consecutive passes without a batch")
            finished = 0
            for rep, out in zip(replicas, outs, strict=True):
                if out is None:
                    continue
                finished += len(out.finished)
                if self.router is not None:
                    for r in out.finished:
                        self.router.on_finish(r, rep.idx)
            now = end
            sample_series(series, now, replicas)
            if finished and on_progress is not None:
                done += finished
                on_progress(done, n)
        if self._streak:
            self.stats.delay_streaks.append(self._streak)
            self.stats.delay_streak_s.append(now - self._streak_start)
        if on_progress is not None:
            on_progress(n, n)

    def _step_pass(self, now: float) -> tuple[list[StepOutcome | None], float]:
        """One global pass from ``now``: every rank steps (idle ranks too when the delayer
        negotiates); returns the outcomes and the pass end."""
        replicas = self.replicas
        had_work = [not rep.sched.is_idle for rep in replicas]
        outs: list[StepOutcome | None]
        if self.pool is not None:
            outs = self.pool.run([partial(rep.sched.step, now) for rep in replicas])
        else:
            outs = [
                rep.sched.step(now) if w else None
                for rep, w in zip(replicas, had_work, strict=True)
            ]
        verdict = self._verdict()
        ends = [rep.clock.now() for rep in replicas]
        end = max(ends)
        for rep, out, w, r_end in zip(replicas, outs, had_work, ends, strict=True):
            vetoed = verdict is not None and not verdict.allow
            if out is None and w and not rep.sched.is_idle and not vetoed:
                raise RuntimeError(
                    f"replica {rep.idx} has work but could not schedule it "
                    f"(waiting={len(rep.sched.waiting)}, running={len(rep.sched.running)})"
                )
            if out is not None:
                _restamp(out, r_end, end)
            rep.clock.jump_to(end)
            if self.check_integrity:
                rep.sched.check_integrity()
        _account(self.stats, outs, had_work, now, end, verdict)
        if verdict is not None:
            if not verdict.allow:
                if self._streak == 0:
                    self._streak_start = now
                self._streak += 1
            elif self._streak:
                self.stats.delay_streaks.append(self._streak)
                self.stats.delay_streak_s.append(now - self._streak_start)
                self._streak = 0
        return outs, end

    def _verdict(self) -> Verdict | None:
        """The pass's negotiated verdict (every rank must have reached the same one)."""
        if not self.recorders:
            return None
        verdicts = [rec.take_verdict() for rec in self.recorders]
        first = verdicts[0]
        if self.check_integrity and any(
            (v.allow, v.reason, v.status) != (first.allow, first.reason, first.status)
            for v in verdicts
        ):
            raise RuntimeError(f"ranks disagree on the prefill verdict: {verdicts}")
        return first


def _account(
    stats: LockstepStats,
    outs: Sequence[StepOutcome | None],
    had_work: Sequence[bool],
    start: float,
    end: float,
    verdict: Verdict | None,
) -> None:
    pass_s = end - start
    stats.passes += 1
    stats.pass_s += pass_s
    log = stats.log
    log.start.append(start)
    log.end.append(end)
    log.delayed.append(0 if verdict is None or verdict.allow else 1)
    if verdict is not None:
        stats.verdicts[verdict.reason.value] += 1
        if not verdict.allow:
            stats.delayed_passes += 1
    if any(had_work) and not any(o is not None and o.batch_size > 0 for o in outs):
        stats.empty_passes += 1
    prefilling = [_is_prefill(o) for o in outs]
    any_prefill = any(prefilling)
    if any_prefill:
        stats.prefill_passes += 1
    for out, w, pre in zip(outs, had_work, prefilling, strict=True):
        own = out.duration_s if out is not None else 0.0
        stats.busy_rank_s += own
        if pre:
            stats.prefill_rank_passes += 1
        elif out is not None and out.batch_size > 0:
            stats.decode_rank_passes += 1
        if any_prefill and not pre and w:
            stats.stalled_rank_s += max(pass_s - own, 0.0)
