"""Prefill delayer (as SGLang's ``PrefillDelayer``): data-parallel ranks agree, once per
scheduling pass, whether anyone prefills now, so prefills line up across ranks and batches grow
larger.

Pieces:
- ``RankInfo``: the six values each rank contributes to the per-pass all-gather.
- ``negotiate``: the pure decision from the gathered values and the previous state. Every rank
  runs it on the same gathered tuple, so every rank reaches the same verdict and state.
- ``PrefillDelayer``: one per rank; owns the state, the clock and the all-gather.
- ``PrefillDelayerPass``: the per-pass executor (the adder's ``PrefillGate``): negotiates at
  most once per pass (the first call; later calls reuse that verdict) and ``finalize``
  negotiates with ``prefillable=False`` when nothing did, so every rank joins every collective
  exactly once per pass. ``PrefillDelayer.gate_for`` builds one from a scheduler.
- ``RecentPrefillBatchSizeTracker``: the recent peak prefill batch size (``B``).
- ``AllGather`` / ``LocalAllGather`` / ``LockstepRunner``: the collective, in-process for N
  replicas stepping in lockstep (one thread per rank, a reusable barrier).

Decision (``negotiate``), with ``R``/``B``/``Q`` the maxima of running batch, recent peak
prefill batch and waiting-queue length over the gathered ranks, ``mrr`` the rank's slot count:
- nobody prefillable ("none"): allow, reason NONE, state reset.
- any rank under the token-usage low watermark: allow, TOKEN_WATERMARK, state reset.
- slot condition ``mrr - R < B``; queue condition (only with ``queue_min_ratio`` and ``R > 0``)
  ``0 < queue_min and Q < queue_min`` with ``queue_min = min(int(R * ratio), capacity)``,
  ``capacity = prefill_max_requests or B``.
- a condition holds: the first-round exemption (if armed) disarms and allows; else the
  wall-clock cap / pass cap may release (WAIT_TIMEOUT); else DELAY (count + 1).
- no condition: allow, WAIT_SUCCESS after a delay streak, else NO_WAIT.

``compat="sglang"`` (SGLang 0.5.23 exactly):
- the wall-clock cap (``max_delay_ms``) only exists with the queue trigger, and only cancels the
  queue condition: a slot-condition delay is bounded by the pass cap alone;
- the exemption fires once per delayer lifetime;
- "mixed" (some ranks prefillable) ignores both conditions and the exemption: delay until the
  pass cap unless a watermark forces;
- ``finalize`` reports zeros for the non-prefillable rank's counts.

``compat="radixsched"`` (mending SGLang's edge cases: a cap that misses the slot condition, a
one-shot exemption, "mixed" ignoring every condition):
- the wall-clock cap releases any delay: once ``max_delay_ms`` has elapsed since the streak's
  first delayed pass on any rank, a pass that would delay is allowed with WAIT_TIMEOUT;
- the exemption re-arms whenever a pass is allowed (status all or mixed) while a delay streak
  was open, i.e. after the prefill that ends each streak; the next pass whose conditions hold
  is exempt again, and only the following ones delay;
- "mixed" delays (bounded by both caps, no exemption) only while a rank that cannot prefill
  has a running batch that the others' prefill would stall; when those ranks are idle, the
  "all" rule applies (watermark, then conditions, exemption and caps), so nobody waits for
  nothing;
- ``finalize`` reports the rank's real running batch and queue length (they feed ``R`` and
  ``Q``, which "mixed" now consults).
"""

from __future__ import annotations

import enum
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

Compat = Literal["radixsched", "sglang"]

DEFAULT_MAX_DELAY_MS = 5000.0


class DelayReason(enum.Enum):
    NONE = "none"  # nobody is prefillable: the verdict is moot
    NO_WAIT = "no_wait"  # allowed, no delay streak was open
    WAIT_SUCCESS = "wait_success"  # allowed: conditions cleared after a delay streak
    WAIT_TIMEOUT = "wait_timeout"  # allowed: pass cap or wall-clock cap reached
    TOKEN_WATERMARK = "token_watermark"  # allowed: a rank's KV usage is under the watermark
    DELAY = "delay"  # vetoed this pass


class PrefillStatus(enum.Enum):
    ALL = "all"
    NONE = "none"
    MIXED = "mixed"


class RankInfo(NamedTuple):
    """One rank's contribution to a negotiation."""

    prefillable: bool
    watermark_force: bool
    running_batch: int
    max_prefill_bs: int
    waiting_queue_len: int
    timeout_expired: bool


class DelayState(NamedTuple):
    delayed_count: int  # consecutive delayed passes of the open streak
    start_time: float  # clock value at the streak's first delayed pass


class Verdict(NamedTuple):
    allow: bool
    reason: DelayReason
    status: PrefillStatus
    # On a release (allowed with a streak open): the streak's delayed passes and duration.
    waited_passes: int = 0
    waited_s: float = 0.0


class Decision(NamedTuple):
    verdict: Verdict
    state: DelayState | None
    skip_first: bool


@dataclass(frozen=True)
class DelayerConfig:
    max_delay_passes: int = 30
    token_usage_low_watermark: float | None = None
    queue_min_ratio: float | None = None
    max_delay_ms: float | None = None  # None -> DEFAULT_MAX_DELAY_MS
    prefill_max_requests: int | None = None
    tracker_window: int = 16
    compat: Compat = "radixsched"

    def __post_init__(self) -> None:
        if self.max_delay_passes < 1:
            raise ValueError(f"max_delay_passes must be >= 1, got {self.max_delay_passes}")
        if self.max_delay_ms is not None and self.max_delay_ms < 0:
            raise ValueError("max_delay_ms must be >= 0")
        if self.queue_min_ratio is not None and self.queue_min_ratio < 0:
            raise ValueError("queue_min_ratio must be >= 0")
        if self.tracker_window < 1:
            raise ValueError("tracker_window must be >= 1")

    @property
    def delay_ms_cap(self) -> float:
        return DEFAULT_MAX_DELAY_MS if self.max_delay_ms is None else self.max_delay_ms

    @property
    def queue_trigger_enabled(self) -> bool:
        return self.queue_min_ratio is not None

    @property
    def sglang_compat(self) -> bool:
        return self.compat == "sglang"


def negotiate(
    infos: Sequence[RankInfo],
    prev: DelayState | None,
    skip_first: bool,
    *,
    config: DelayerConfig,
    max_running_requests: int,
    now: float,
) -> Decision:
    """The pure negotiation: same inputs on every rank -> same verdict and next state."""
    if not infos:
        raise ValueError("negotiate needs at least one rank's info")
    n_prefillable = sum(1 for i in infos if i.prefillable)
    if n_prefillable == 0:
        return Decision(Verdict(True, DelayReason.NONE, PrefillStatus.NONE), None, skip_first)
    status = PrefillStatus.ALL if n_prefillable == len(infos) else PrefillStatus.MIXED
    sglang = config.sglang_compat

    def allow(reason: DelayReason, skip: bool) -> Decision:
        if prev is None:
            return Decision(Verdict(True, reason, status), None, skip)
        # A streak ends in this prefill; radixsched re-arms the exemption for the next one.
        verdict = Verdict(True, reason, status, prev.delayed_count, now - prev.start_time)
        return Decision(verdict, None, skip or not sglang)

    def delay_or_cap(skip: bool) -> Decision:
        prev_count = 0 if prev is None else prev.delayed_count
        if prev_count < config.max_delay_passes - 1:
            state = DelayState(prev_count + 1, now if prev is None else prev.start_time)
            return Decision(Verdict(False, DelayReason.DELAY, status), state, skip)
        return allow(DelayReason.WAIT_TIMEOUT, skip)

    if any(i.watermark_force for i in infos):
        return allow(DelayReason.TOKEN_WATERMARK, skip_first)
    if sglang and status is PrefillStatus.MIXED:
        return delay_or_cap(skip_first)

    any_expired = any(i.timeout_expired for i in infos)
    if status is PrefillStatus.MIXED and any(
        not i.prefillable and i.running_batch > 0 for i in infos
    ):
        # A rank with nothing to prefill would stall its decode batch while the others
        # prefill: wait for them to line up (bounded by both caps, no exemption). When the
        # non-prefilling ranks are idle, nobody gains from waiting: the "all" rule applies.
        if any_expired:
            return allow(DelayReason.WAIT_TIMEOUT, skip_first)
        return delay_or_cap(skip_first)

    r = max(i.running_batch for i in infos)
    b = max(i.max_prefill_bs for i in infos)
    q = max(i.waiting_queue_len for i in infos)
    queue_cond = False
    if config.queue_min_ratio is not None and r > 0:
        capacity = config.prefill_max_requests if config.prefill_max_requests is not None else b
        queue_min = min(int(r * config.queue_min_ratio), capacity)
        queue_cond = queue_min > 0 and q < queue_min and not (sglang and any_expired)
    slot_cond = max_running_requests - r < b

    cleared = DelayReason.WAIT_SUCCESS if prev is not None else DelayReason.NO_WAIT
    if not (slot_cond or queue_cond):
        return allow(cleared, skip_first)
    if skip_first:
        return allow(cleared, False)
    if any_expired and not sglang:
        return allow(DelayReason.WAIT_TIMEOUT, skip_first)
    return delay_or_cap(skip_first)


class RecentPrefillBatchSizeTracker:
    """Peak of the last ``window`` non-empty prefill attempts (0 before any)."""

    def __init__(self, window: int = 16) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._recent: deque[int] = deque(maxlen=window)

    def observe_attempt(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"a prefill attempt has a positive batch size, got {n}")
        self._recent.append(n)
        return max(self._recent)

    @property
    def max_bs(self) -> int:
        return max(self._recent, default=0)


class AllGather(Protocol):
    """Every rank calls ``all_gather`` once per negotiation with its own info and receives all
    ranks' infos ordered by rank."""

    @property
    def world_size(self) -> int: ...

    def all_gather(self, rank: int, info: RankInfo) -> tuple[RankInfo, ...]: ...


class LocalAllGather:
    """In-process all-gather for ranks that run their passes on separate threads (see
    ``LockstepRunner``). Reusable: each round completes when all ranks have contributed."""

    def __init__(self, world_size: int, timeout_s: float = 60.0) -> None:
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        self._world_size = world_size
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._slots: list[RankInfo | None] = [None] * world_size
        self._arrived = 0
        self._generation = 0
        self._result: tuple[RankInfo, ...] = ()
        self._error: BaseException | None = None

    @property
    def world_size(self) -> int:
        return self._world_size

    def all_gather(self, rank: int, info: RankInfo) -> tuple[RankInfo, ...]:
        if not 0 <= rank < self._world_size:
            raise ValueError(f"rank {rank} outside world of {self._world_size}")
        if self._world_size == 1:
            return (info,)
        with self._cond:
            if self._error is not None:
                raise RuntimeError("all-gather aborted") from self._error
            if self._slots[rank] is not None:
                raise RuntimeError(f"rank {rank} joined the same all-gather round twice")
            self._slots[rank] = info
            self._arrived += 1
            gen = self._generation
            if self._arrived == self._world_size:
                self._result = tuple(s for s in self._slots if s is not None)
                self._slots = [None] * self._world_size
                self._arrived = 0
                self._generation += 1
                self._cond.notify_all()
                return self._result
            done = self._cond.wait_for(
                lambda: self._generation != gen or self._error is not None, self.timeout_s
            )
            if self._error is not None:
                raise RuntimeError("all-gather aborted") from self._error
            if not done:
                missing = [i for i, s in enumerate(self._slots) if s is None]
                raise RuntimeError(f"all-gather timed out waiting for ranks {missing}")
            # Safe: the next round cannot complete before this rank joins it.
            return self._result

    def abort(self, error: BaseException) -> None:
        """Wake every waiting rank with an error (a peer failed before joining)."""
        with self._cond:
            self._error = error
            self._cond.notify_all()


T = TypeVar("T")


class LockstepRunner:
    """Runs one callable per rank concurrently (one thread each) and returns their results in
    rank order; a failing rank aborts the all-gather so its peers fail fast too."""

    def __init__(self, all_gather: LocalAllGather) -> None:
        self.all_gather = all_gather
        self._pool = ThreadPoolExecutor(max_workers=all_gather.world_size)

    def run(self, fns: Sequence[Callable[[], T]]) -> list[T]:
        if len(fns) != self.all_gather.world_size:
            raise ValueError(f"{len(fns)} callables for {self.all_gather.world_size} ranks")
        if len(fns) == 1:
            return [fns[0]()]
        futures = [self._pool.submit(fn) for fn in fns]
        wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            error = fut.exception() if fut.done() else None
            if error is not None:
                # Peers blocked in the all-gather would otherwise wait for the timeout.
                self.all_gather.abort(error)
                wait(futures)
                raise error
        return [fut.result() for fut in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> LockstepRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SchedulerView(Protocol):
    """What ``PrefillDelayer.gate_for`` reads from a scheduler."""

    @property
    def waiting(self) -> Sequence[Any]: ...

    def kv_usage(self) -> float: ...

    def num_running(self) -> int: ...


@dataclass
class DelayerStats:
    verdicts: Counter[DelayReason] = field(default_factory=Counter)
    # One entry per released streak.
    wait_passes: list[int] = field(default_factory=list)
    wait_seconds: list[float] = field(default_factory=list)


class PrefillDelayer:
    """One rank's delayer. ``clock`` is the scheduler's clock in seconds (the simulator's
    virtual clock); ``max_running_requests`` is this rank's slot count (SGLang's local mrr:
    ``ceil(mrr / dp)`` without attention DP, ``mrr`` with it)."""

    def __init__(
        self,
        config: DelayerConfig,
        *,
        max_running_requests: int,
        clock: Callable[[], float],
        all_gather: AllGather | None = None,
        rank: int = 0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        self.config = config
        self.max_running_requests = max_running_requests
        self.clock = clock
        self.all_gather: AllGather = all_gather if all_gather is not None else LocalAllGather(1)
        self.rank = rank
        self.state: DelayState | None = None
        self.skip_first = True
        self.tracker = RecentPrefillBatchSizeTracker(config.tracker_window)
        self.stats = DelayerStats()

    def local_info(
        self,
        prefillable: bool,
        running_batch: int,
        max_prefill_bs: int,
        waiting_queue_len: int,
        token_usage: float,
    ) -> RankInfo:
        cfg = self.config
        wm = cfg.token_usage_low_watermark
        watermark_force = prefillable and wm is not None and token_usage < wm
        expired = False
        if self.state is not None and (cfg.queue_trigger_enabled or not cfg.sglang_compat):
            expired = (self.clock() - self.state.start_time) * 1000.0 >= cfg.delay_ms_cap
        return RankInfo(
            prefillable, watermark_force, running_batch, max_prefill_bs, waiting_queue_len, expired
        )

    def decide(self, infos: Sequence[RankInfo]) -> Verdict:
        """Apply the negotiation to gathered infos (all ranks' values, rank order)."""
        d = negotiate(
            infos,
            self.state,
            self.skip_first,
            config=self.config,
            max_running_requests=self.max_running_requests,
            now=self.clock(),
        )
        self.state, self.skip_first = d.state, d.skip_first
        v = d.verdict
        self.stats.verdicts[v.reason] += 1
        if v.allow and v.waited_passes:
            self.stats.wait_passes.append(v.waited_passes)
            self.stats.wait_seconds.append(v.waited_s)
        return v

    def negotiate(
        self,
        prefillable: bool,
        running_batch: int,
        max_prefill_bs: int,
        waiting_queue_len: int,
        token_usage: float,
    ) -> Verdict:
        """One collective negotiation (every rank must call this once per pass)."""
        info = self.local_info(
            prefillable, running_batch, max_prefill_bs, waiting_queue_len, token_usage
        )
        return self.decide(self.all_gather.all_gather(self.rank, info))

    def gate_for(self, sched: SchedulerView) -> PrefillDelayerPass:
        """A pass executor from the scheduler's state at the pass start (usable as
        ``Scheduler(gate_factory=delayer.gate_for)``)."""
        return self.begin_pass(
            token_usage=sched.kv_usage(),
            running_batch=sched.num_running(),
            waiting_queue_len=len(sched.waiting),
        )

    def begin_pass(
        self, *, token_usage: float, running_batch: int, waiting_queue_len: int
    ) -> PrefillDelayerPass:
        return PrefillDelayerPass(
            self,
            token_usage=token_usage,
            running_batch=running_batch,
            waiting_queue_len=waiting_queue_len,
        )


class PrefillDelayerPass:
    """The per-pass executor (``adder.PrefillGate``). Built at the pass start with the rank's
    token usage, running batch and queue length; the tracker's peak prefill batch size is
    read then too. The scheduler must call ``finalize`` at the end of every pass, negotiated
    or not (it feeds the batch-size tracker)."""

    def __init__(
        self,
        delayer: PrefillDelayer,
        *,
        token_usage: float,
        running_batch: int,
        waiting_queue_len: int,
    ) -> None:
        self.delayer = delayer
        self.token_usage = token_usage
        self.running_batch = running_batch
        self.waiting_queue_len = waiting_queue_len
        self.max_prefill_bs = delayer.tracker.max_bs
        self.attempted_bs = 0
        self.verdict: Verdict | None = None
        self.finalized = False

    def negotiate(
        self, local_prefillable: bool, running_bs: int | None = None, waiting_len: int | None = None
    ) -> bool:
        """May this rank prefill? The first call of the pass runs the collective; later calls
        return the same answer whatever their arguments. ``running_bs``/``waiting_len``
        default to the pass-start values."""
        if self.finalized:
            raise RuntimeError("negotiation after finalize")
        running = self.running_batch if running_bs is None else running_bs
        waiting = self.waiting_queue_len if waiting_len is None else waiting_len
        if local_prefillable:
            free_slots = self.delayer.max_running_requests - running
            estimate = min(max(waiting, 1), max(free_slots, 1))
            self.attempted_bs = max(self.attempted_bs, estimate)
        if self.verdict is None:
            self.verdict = self.delayer.negotiate(
                local_prefillable, running, self.max_prefill_bs, waiting, self.token_usage
            )
        return self.verdict.allow

    def finalize(self, actual_prefill_bs: int) -> int:
        """End the pass: join the collective if nothing did, feed the batch-size tracker
        with the actual batch size (or the estimate of a vetoed attempt) and return it."""
        if self.finalized:
            raise RuntimeError("finalize called twice")
        if self.verdict is None:
            if self.delayer.config.sglang_compat:
                self.verdict = self.delayer.negotiate(False, 0, 0, 0, self.token_usage)
            else:
                self.verdict = self.delayer.negotiate(
                    False,
                    self.running_batch,
                    self.max_prefill_bs,
                    self.waiting_queue_len,
                    self.token_usage,
                )
        self.finalized = True
        observed = actual_prefill_bs or self.attempted_bs
        if observed > 0:
            self.delayer.tracker.observe_attempt(observed)
        return observed
