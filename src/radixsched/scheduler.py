"""The one scheduler loop that the simulator, the offline engine and the HTTP server all run.

Each ``step()`` is one forward pass:

1. checkpoint the in-flight chunked request's KV into the cache (spec 4.5);
2. try to build a prefill batch (policy order -> ``PrefillAdder``) — prefill first;
3. otherwise decode every running request (retracting requests when KV memory runs out);
4. run the batch on the ``ModelRunner`` and process its tokens (finish, cache, release).

KV slot ownership (checked by ``check_integrity`` after every step in tests):

* every slot is exactly one of: free in the allocator, held by the radix cache, or owned by a
  request (``kv_row[cache_protected_len:]`` of a running or chunked request);
* a request holds exactly one lock (on ``lock_node``) from admission until it finishes, is
  retracted, preempted or aborted; when the loop is idle no lock is held;
* with deferred decode state (``defer_decode_state``, the simulator) a decode jump reserves the
  running requests' new slots without choosing them: the allocator keeps them on its free list,
  set aside, and the reservation equals what the running batch's columns say it is owed until
  each request is settled (it finishes, is retracted or aborted, or ``sync_running``).

Scheduling decides order and timing only: the same requests produce the same tokens under every
policy, with the cache on or off.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from radixsched.adder import (
    AddReqResult,
    Admission,
    PrefillAdder,
    PrefillGate,
    ceil_page,
    floor_page,
    running_decode_tokens,
)
from radixsched.cache import CacheKey, TokenAllocator, make_cache
from radixsched.cache.base import BasePrefixCache, IntegrityError
from radixsched.cache.radix import longest_common_prefix
from radixsched.clock import Clock, VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.policy import PriorityResult, SchedulePolicy, validate_priority
from radixsched.ratio import NewTokenRatioTracker
from radixsched.request import (
    EMPTY_SLOTS,
    FinishReason,
    FinishState,
    Req,
    SamplingParams,
)
from radixsched.runner import Batch, DecodeEntry, ExtendEntry, ModelRunner

logger = logging.getLogger(__name__)


class AdmitResult(NamedTuple):
    """Outcome of ``add_request``: rejected requests are never enqueued."""

    accepted: bool
    status_code: int | None = None  # HTTP status a server maps a rejection to
    message: str = ""


@dataclass(slots=True)
class StepOutcome:
    mode: str  # "extend", "decode", "mixed"
    duration_s: float
    batch_size: int
    num_steps: int = 1  # > 1 when decode steps were jumped over at once
    prefill_tokens: int = 0
    finished: list[Req] = field(default_factory=list)
    retracted: list[Req] = field(default_factory=list)
    _tokens: list[tuple[Req, list[int]]] = field(default_factory=list, repr=False)
    # A decode step's tokens as (requests, token lists), built and paired up only when read.
    _batch_tokens: Callable[[], tuple[list[Req], list[list[int]]]] | None = field(
        default=None, repr=False
    )

    @property
    def new_tokens(self) -> list[tuple[Req, list[int]]]:
        """Tokens produced this step, per request (several per request after a decode
        jump), in batch order."""
        if self._batch_tokens is not None:
            reqs, toks = self._batch_tokens()
            self._batch_tokens = None
            self._tokens.extend(zip(reqs, toks, strict=True))
        return self._tokens


class ChunkPlan(NamedTuple):
    """A round opened by continuing the chunked request (``Scheduler._plan_continuation``)."""

    adder: PrefillAdder
    still_chunked: Req | None  # add_chunked_req's answer: None when this is the last chunk
    req: Req

    @property
    def is_middle(self) -> bool:
        """A middle chunk that fills the round's budget: the round then orders no queue,
        admits nothing and runs no decode, so the step is fixed by state alone."""
        adder = self.adder
        return (
            self.still_chunked is not None
            and bool(adder.can_run_list)
            and adder.budget_state() is AddReqResult.OTHER
        )


@dataclass
class SchedulerStats:
    retractions: int = 0
    preemptions: int = 0
    aborted: int = 0
    rejected: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    cached_prompt_tokens: int = 0
    host_cached_prompt_tokens: int = 0
    prompt_tokens: int = 0
    prefill_tokens_computed: int = 0
    # Statistics independent of how often a driver samples (identical whether decode steps
    # are jumped over or stepped): peaks over every step, a time-weighted running batch.
    peak_waiting: int = 0
    peak_kv_usage: float = 0.0
    busy_s: float = 0.0
    running_x_s: float = 0.0  # integral of the batch size over busy time

    @property
    def mean_running(self) -> float:
        return self.running_x_s / self.busy_s if self.busy_s > 0 else 0.0


_NO_PRIORITY = PriorityResult("skipped", frozenset(), frozenset(), False)


def resolve_max_running_requests(config: SchedulerConfig, capacity: int, context_len: int) -> int:
    """Spec 4.10: per-replica request slots."""
    if config.max_running_requests is not None:
        return max(1, min(config.max_running_requests, max(capacity // 2, 1)))
    estimated = min(max(int(capacity / max(context_len, 1) * 512), 2048), 4096)
    return max(1, min(estimated, capacity // 2))


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        runner: ModelRunner,
        *,
        kv_slots: int,
        clock: Clock | None = None,
        context_len: int = 131072,
        host_tier: Any = None,
        gate_factory: Callable[[Scheduler], PrefillGate | None] | None = None,
        defer_decode_state: bool = False,
    ) -> None:
        self.config = config
        self.runner = runner
        self.clock: Clock = clock if clock is not None else VirtualClock()
        self.page_size = config.page_size
        self.allocator = TokenAllocator(kv_slots, config.page_size)
        self.host_tier = host_tier
        on_evict = host_tier.on_evict if host_tier is not None else None
        self.cache: BasePrefixCache = make_cache(config, self.allocator, on_evict=on_evict)
        self.policy = SchedulePolicy(config, self.cache)
        self.capacity = self.allocator.total_size
        self.context_len = context_len
        self.max_running_requests = resolve_max_running_requests(config, self.capacity, context_len)
        self.ratio = NewTokenRatioTracker(config)
        self.eos_ids = frozenset(runner.eos_token_ids())
        self.gate_factory = gate_factory
        # A middle chunk takes the simulator's fast path (ChunkPlan.is_middle), and the next run
        # back to back within the same step up to the horizon (_run_middle_chunks), where no
        # round in between can do anything else: no prefill delayer, no mixed chunks, no
        # priority preemption; not SGLang's order of operations, nor spf (both order the queue
        # while a chunk continues).
        self._fuses_chunks = (
            runner.supports_multi_step
            and gate_factory is None
            and config.chunk_size is not None
            and not config.enable_mixed_chunk
            and not config.enable_priority_preemption
            and not config.sglang_compat
            and config.schedule_policy != "shortest-prefill-first"
        )

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.batch_is_full = False
        self.processed_tokens = 0  # HRRN clock: prefill tokens only (spec 8.8)
        self.stats = SchedulerStats()
        self._by_rid: dict[str, Req] = {}
        # Whether ``waiting`` is in (queue entry, arrival) order: true while every arrival
        # enters no earlier than the one before it (re-queued requests go back to their
        # place). Only radixsched fcfs relies on it: every other policy reorders the list.
        self._entry_ordered = True
        self._last_entry: tuple[float, float] = (float("-inf"), float("-inf"))
        self._fcfs_keeps_order = (
            config.schedule_policy == "fcfs"
            and not config.enable_priority_scheduling
            and not config.sglang_compat
        )
        self._arrival_seq = 0
        self._seq_of: dict[int, int] = {}
        self._decode_tokens_memo: tuple[int, int] | None = None
        self._cols: _DecodeCols | None = None
        self._shares_prefixes = self.cache.supports_prefix_sharing()
        # Deferred decode state (simulator): a decode jump advances only the running batch's
        # columns (``_cols``) and reserves KV; each request's tokens, token times, KV slots and
        # kv_len are written when it leaves the batch or someone reads it (``sync_running``).
        # Invariant: ``_unsettled`` implies ``_cols`` describes the running batch, and a running
        # request is behind its columns by exactly ``cols.fill - fill_len`` decode steps, the
        # last entries of ``_decode_log`` (every running request takes part in every decode
        # step). Off where something reads running requests mid-flight: priority preemption
        # and the ignore-eos admission of a disabled cache (the adder), mixed chunks.
        self._defer = (
            defer_decode_state
            and not config.enable_priority_preemption
            and not config.enable_mixed_chunk
            and not self.cache.disabled
        )
        self._decode_log: list[float] = []  # end time of every deferred decode step
        self._unsettled = False

    # ==== queue entry ========================================================================
    def add_request(self, req: Req, now: float | None = None) -> AdmitResult:
        """Validate and enqueue. Rejections happen here, at the door, never after enqueueing."""
        cfg = self.config
        t = self.clock.now() if now is None else now
        if req.rid in self._by_rid:
            return self._reject(req, 400, f"duplicate request id {req.rid!r}")
        if req.sampling.max_new_tokens < 1:
            return self._reject(req, 400, "max_new_tokens must be >= 1")
        err = validate_priority(req, cfg)
        if err is not None:
            return self._reject(req, 503, err)
        if (
            cfg.enable_priority_scheduling
            and req.priority is None
            and cfg.default_priority_value is not None
        ):
            req.priority = cfg.default_priority_value
        # The prompt plus one decode token must fit in KV memory and in the context window.
        p = self.page_size
        max_req_len = min(self.context_len - 1, self.capacity - 1)
        if req.fill_len >= max_req_len or ceil_page(req.fill_len, p) + p + 1 > self.capacity:
            return self._reject(
                req,
                400,
                f"prompt of {req.fill_len} tokens does not fit (context {self.context_len}, "
                f"KV capacity {self.capacity} tokens)",
            )
        cap = min(
            max_req_len - req.fill_len - 1,
            self.capacity - ceil_page(req.fill_len, p) - p - 1,
        )
        if cap < 1:
            return self._reject(
                req,
                400,
                f"prompt of {req.fill_len} tokens leaves no room to generate a token "
                f"(context {self.context_len}, KV capacity {self.capacity} tokens)",
            )
        if req.sampling.max_new_tokens > cap:
            req.sampling = _replace_sampling(req.sampling, max_new_tokens=cap)
        if cfg.max_queued_requests is not None and len(self.waiting) + 1 > cfg.max_queued_requests:
            victim = self._queue_limit_victim(req)
            if victim is None:
                return self._reject(req, 503, "The request queue is full.")
            self.waiting.remove(victim)
            self.policy.on_dequeue(victim)
            self._finish_aborted(
                victim, 503, "The request is aborted by a higher priority request."
            )
        req.queue_entry_time = t
        req.queue_entry_processed_tokens = self.processed_tokens
        if self.cache.supports_prefix_sharing():
            # The load snapshot a data-parallel router reads, recorded once at the door
            # (cache-agnostic policies never re-match; cache-aware ones refresh it per round).
            match_at_door(self.cache, req)
        req.arrival_time = t
        req.times.arrival = t
        self._by_rid[req.rid] = req
        self._seq_of[id(req)] = self._arrival_seq
        self._arrival_seq += 1
        entry = (req.queue_entry_time, req.arrival_time)
        if not self.waiting:
            self._entry_ordered = True
        elif entry < self._last_entry:
            self._entry_ordered = False
        self._last_entry = entry
        self.waiting.append(req)
        self.policy.on_enqueue(req)
        return AdmitResult(True)

    def _reject(self, req: Req, code: int, message: str) -> AdmitResult:
        self.stats.rejected += 1
        req.finish = FinishState(FinishReason.ABORT, message, code)
        return AdmitResult(False, code, message)

    def _queue_limit_victim(self, incoming: Req) -> Req | None:
        """With priority scheduling, a strictly more important arrival displaces the least
        important (then most recently queued) waiting request (spec 4.8)."""
        cfg = self.config
        if not cfg.enable_priority_scheduling or not self.waiting:
            return None
        direction = cfg.priority_sign

        def key(r: Req) -> tuple[int, float]:
            return (direction * _prio_value(r, direction), r.queue_entry_time)

        cand = max(self.waiting, key=key)
        if direction * _prio_value(incoming, direction) < direction * _prio_value(cand, direction):
            return cand
        return None

    def _requeue_all(self, reqs: list[Req]) -> None:
        """Re-entry after retraction or preemption. radixsched keeps each request's seniority
        (queue-entry time, HRRN snapshot, place in arrival order) and never applies the queue
        limit to work that was already running (spec 8.9-8.10); compat sglang appends them,
        in order, with fresh stamps."""
        if not reqs:
            return
        for req in reqs:
            self.policy.forget(req)  # its output changed: the policy must re-match it
        if self.config.sglang_compat:
            for req in reqs:
                req.queue_entry_time = self.clock.now()
                req.queue_entry_processed_tokens = self.processed_tokens
                self.waiting.append(req)
                self.policy.on_enqueue(req)
            return
        seq_of = self._seq_of
        if self.policy.uses_list_order and self._in_arrival_order():
            arrival_seq = self._arrival_seq_of
            for req in reqs:  # each goes back to its place in arrival order
                pos = bisect.bisect_left(self.waiting, seq_of[id(req)], key=arrival_seq)
                self.waiting.insert(pos, req)
        else:
            self.waiting.extend(reqs)
            self._entry_ordered = False
        for req in reqs:
            self.policy.on_enqueue(req)

    def _arrival_seq_of(self, req: Req) -> int:
        return self._seq_of[id(req)]

    def _in_arrival_order(self) -> bool:
        """Whether ``waiting`` is in arrival order. Stops at the first inversion: a list a
        policy reordered shows one within its first few requests."""
        seq_of = self._seq_of
        prev = -1
        for r in self.waiting:
            seq = seq_of[id(r)]
            if seq < prev:
                return False
            prev = seq
        return True

    # ==== abort ==============================================================================
    def abort(self, rid: str, message: str = "aborted by client", status_code: int = 499) -> bool:
        """Abort a waiting, chunked or running request; its slots and lock are released."""
        req = self._by_rid.get(rid)
        if req is None or req.finished:
            return False
        if req in self.waiting:
            self.waiting.remove(req)
            self.policy.on_dequeue(req)
        elif req is self.chunked_req:
            self.chunked_req = None
            self._release(req, cache_kv=not self.config.sglang_compat)
        elif req in self.running:
            self.running.remove(req)
            self._running_changed()
            self.batch_is_full = False
            self._release(req, cache_kv=not self.config.sglang_compat)
        self._finish_aborted(req, status_code, message)
        return True

    def discard(self, req: Req, status_code: int, message: str) -> None:
        """Abort ``req`` wherever it is — including a request taken off the queue for a batch
        whose forward failed — dropping (never caching) its KV, whose last positions may never
        have been written. Releases its slots and its lock."""
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
            self._running_changed()
        if self.chunked_req is req:
            self.chunked_req = None
        if req in self.waiting:
            self.waiting.remove(req)
            self.policy.on_dequeue(req)
        self.batch_is_full = False
        self._release(req, cache_kv=False)
        self._finish_aborted(req, status_code, message)

    def _finish_aborted(self, req: Req, code: int, message: str) -> None:
        req.finish = FinishState(FinishReason.ABORT, message, code)
        req.times.finish = self.clock.now()
        self.stats.aborted += 1
        self._forget(req)

    def _forget(self, req: Req) -> None:
        self._by_rid.pop(req.rid, None)
        self._seq_of.pop(id(req), None)

    # ==== state ==============================================================================
    @property
    def is_idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked_req is None

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked_req is not None else 0)

    def _running_decode_tokens(self) -> tuple[int, int]:
        """``running_decode_tokens`` of the running batch, memoised until the batch or a
        running request's output changes (``_running_changed``)."""
        memo = self._decode_tokens_memo
        if memo is None:
            clip = self.config.clip_max_new_tokens
            cols = self._cols
            memo = (
                cols.decode_tokens(clip)
                if cols is not None
                else running_decode_tokens(self.running, clip)
            )
            self._decode_tokens_memo = memo
        return memo

    def _running_cols(self) -> _DecodeCols:
        """The running batch as columns (kept across decode steps while nothing else changes
        the batch or its requests' lengths)."""
        cols = self._cols
        if cols is None:
            cols = _DecodeCols.of(self.running, bool(self.eos_ids))
            self._cols = cols
        return cols

    def _running_changed(self) -> None:
        """Call after the running batch or any running request's output or KV row changed
        (deferred decode state is written into the requests first: the columns hold it)."""
        if self._unsettled:
            self._settle_all()
        self._decode_tokens_memo = None
        self._cols = None

    # ---- deferred decode state ----------------------------------------------------------------
    def sync_running(self) -> None:
        """Bring every running request's ``Req`` fields (output tokens, token times, KV row,
        kv_len) up to date; a no-op unless ``defer_decode_state`` left some behind."""
        if self._unsettled:
            self._settle_all()

    def remaining_decode_tokens(self) -> int:
        """Tokens the running batch may still generate (sum of ``remaining_new_tokens``),
        without syncing deferred state."""
        cols = self._cols
        if cols is not None:
            return int(np.maximum(cols.max_new - cols.out_len, 0).sum())
        return sum(r.remaining_new_tokens for r in self.running)

    def _settle_all(self) -> None:
        cols = self._cols
        assert cols is not None, "deferred decode state without running-batch columns"
        for i in range(len(cols.reqs)):
            self._settle(cols, i)
        self._unsettled = False

    def _settle(self, cols: _DecodeCols, i: int) -> None:
        """Write request ``i``'s deferred decode steps into its ``Req``: tokens (asked of the
        runner again), token times (the last entries of the decode log), its reserved KV
        slots and ``kv_len``."""
        r = cols.reqs[i]
        fill = int(cols.fill[i])
        done = len(r.prompt_ids) + len(r.output_ids)
        k = fill - done
        if k > 0:
            positions = np.arange(done, fill, dtype=np.int64)[None, :]
            r.output_ids.extend(self.runner.tokens_at([r], positions)[0].tolist())
            log = self._decode_log
            r.times.token_times.extend(log[len(log) - k :])
            r.kv_len = fill - 1
        owed = int(cols.have[i]) - len(r.kv_row)
        if owed > 0:
            self._append_slots(r, self.allocator.claim(owed))

    def kv_usage(self) -> float:
        used = self.capacity - self.allocator.available_size() - self.cache.evictable_size()
        return used / self.capacity

    # ==== the step ===========================================================================
    def step(self, horizon: float | None = None) -> StepOutcome | None:
        """Run one forward pass (or several decode steps at once in the simulator, never past
        ``horizon``, the time of the next external event). None when there is nothing to run."""
        if len(self.waiting) > self.stats.peak_waiting:
            self.stats.peak_waiting = len(self.waiting)
        if self._fuses_chunks and self.chunked_req is not None:
            plan = self._plan_continuation()
            if plan.is_middle:
                # The simulator's fast path: the step is this chunk alone (see ChunkPlan).
                out = StepOutcome("extend", 0.0, 1, num_steps=0)
                self._run_chunk(plan, out)
                if horizon is not None:
                    self._run_middle_chunks(out, horizon)
                return out
            batch, mixed_decode = self._get_new_batch_prefill_raw(None, plan)
        else:
            chunked = self.chunked_req
            if chunked is not None and chunked.extend_end > chunked.prefix_len:
                self._checkpoint(chunked, chunked.extend_end)
            batch, mixed_decode = self._get_new_batch_prefill()
        if batch is not None:
            return self._run(batch, mixed_decode)
        if not self.running:
            if self.is_idle:
                self.ratio.reset()
            return None
        cols = self._running_cols()
        retracted: list[Req] = []
        if not self._cols_fit(cols, 1):
            retracted = self._make_room_for_decode(cols)
            if not self.running:
                return StepOutcome("decode", 0.0, 0, num_steps=0, retracted=retracted)
            cols = self._running_cols()
        k = self._decode_jump_steps(horizon, cols) if not retracted else 1
        if self.runner.supports_multi_step:
            # The simulator's vectorised path, also for a single step (same times, tokens).
            out = self._run_decode_multi(k, cols)
        else:
            out = self._run(Batch([], self._decode_entries(self.running)), [])
        out.retracted = retracted
        return out

    def _plan_continuation(self) -> ChunkPlan:
        """The opening of a step that continues the chunked request, as ``step`` and
        ``_get_new_batch_prefill_raw`` do it: the previous chunk's checkpoint, then the
        round's budget with the continuation planned in it."""
        req = self.chunked_req
        assert req is not None
        if req.extend_end > req.prefix_len:
            self._checkpoint(req, req.extend_end)
        if self.config.enable_priority_preemption or not self.running:
            self.batch_is_full = False
        adder = self._new_adder()
        still_chunked = adder.add_chunked_req(req)
        return ChunkPlan(adder, still_chunked, req)

    def _run_middle_chunks(self, out: StepOutcome, horizon: float) -> None:
        """Run the chunked request's next middle chunks inside this step while each starts
        before ``horizon`` (simulator): nothing but the clock changes in between (see
        ``ChunkPlan``). ``out`` sums them (``num_steps``). A chunk that would not be a middle
        one is left to the next step, its plan undone."""
        clock = self.clock
        while clock.now() < horizon and self.chunked_req is not None:
            plan = self._plan_continuation()
            if not plan.is_middle:
                plan.req.extend_end = plan.req.prefix_len  # the next step plans it again
                return
            self._run_chunk(plan, out)

    def _run_chunk(self, plan: ChunkPlan, out: StepOutcome) -> None:
        """Run a middle chunk exactly as a step whose batch is that chunk alone; add it to
        ``out``."""
        req = plan.req
        entry = self._extend_entry(req, req.prefix_len, req.extend_end)
        result = self.runner.forward(Batch([entry], []))
        d = result.duration_s
        self._account(1, [d])
        self.clock.advance(d)
        n = len(entry.new_token_ids)
        computed = n - entry.host_load_len
        self.stats.prefill_steps += 1
        self.processed_tokens += n
        self.stats.prefill_tokens_computed += computed
        req.computed_prefill_tokens += computed
        if self.policy.tracks_service:
            self.policy.on_service(req, computed, 0)
        out.duration_s += d
        out.num_steps += 1
        out.prefill_tokens += n

    def _new_adder(
        self, mixed_decode_tokens: int = 0, gate: PrefillGate | None = None
    ) -> PrefillAdder:
        """This round's prefill budget over the running batch as it stands."""
        return PrefillAdder(
            config=self.config,
            cache=self.cache,
            allocator=self.allocator,
            running=self.running,
            new_token_ratio=self.ratio.current,
            num_mixed_decode_tokens=mixed_decode_tokens,
            gate=gate,
            preempt_fn=self._preempt,
            running_tokens=self._running_decode_tokens(),
        )

    # ---- prefill ------------------------------------------------------------------------------
    def _get_new_batch_prefill(self) -> tuple[Batch | None, list[Req]]:
        """One prefill attempt. With a prefill delayer, its per-pass executor is built first
        and finalized last on every pass (the cross-rank collective must stay balanced)."""
        gate = self.gate_factory(self) if self.gate_factory is not None else None
        batch, mixed = self._get_new_batch_prefill_raw(gate)
        if gate is not None:
            gate.finalize(len(batch.extend) if batch is not None else 0)
        return batch, mixed

    def _get_new_batch_prefill_raw(
        self, gate: PrefillGate | None, plan: ChunkPlan | None = None
    ) -> tuple[Batch | None, list[Req]]:
        """One prefill round. ``plan``: the round's opening (checkpoint, budget, continuation)
        already made by ``_plan_continuation`` (simulator; no gate, no mixed chunk)."""
        cfg = self.config
        if cfg.enable_priority_preemption or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None, []
        allocatable = self.max_running_requests - len(self.running)
        if allocatable <= 0 and self.chunked_req is None and not cfg.enable_priority_preemption:
            self.batch_is_full = True
            return None, []

        mixed = cfg.enable_mixed_chunk and cfg.chunk_size is not None and bool(self.running)
        chunked = self.chunked_req
        prio: PriorityResult | None = None
        if plan is not None:
            adder = plan.adder
            self.chunked_req = plan.still_chunked
        else:
            adder = self._new_adder(len(self.running) if mixed else 0, gate)
        if chunked is not None and plan is None:
            if cfg.sglang_compat or cfg.schedule_policy == "shortest-prefill-first":
                # SPF caps the continuation from the sorted queue (spec 1.9); compat keeps
                # SGLang's order of operations exactly.
                prio = self._calc_priority()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                chunked, self.waiting, adder.rem_chunk_tokens or 0, self.page_size
            )
            self.chunked_req = adder.add_chunked_req(chunked)
        if prio is None:
            if chunked is not None and adder.budget_state() is AddReqResult.OTHER:
                # The continuation spent the round's budget: no waiting request can be
                # admitted, so ordering the queue would be wasted work. Every radixsched order
                # is a function of the requests' current keys (ties by arrival), so skipping a
                # sort never changes a later round's order.
                prio = _NO_PRIORITY
            elif (
                self.batch_is_full
                and not cfg.enable_priority_preemption
                and self.policy.skip_round(self.waiting, self.running)
            ):
                prio = _NO_PRIORITY  # full: the loop below ends at once (see skip_round)
            else:
                prio = self._calc_priority()

        deferred = prio.deferred
        lazy = prio.lazy
        guard_in_flight = not cfg.sglang_compat and self.cache.supports_prefix_sharing()
        admitted_pos: list[int] = []
        # The loop never edits self.waiting (admitted requests leave it after the loop, and
        # preemption victims are re-queued after it too), so it walks the list itself, or the
        # round's lazy order over it (which reads the next request only when asked: the checks
        # that end the loop come first).
        preemption = cfg.enable_priority_preemption
        waiting = self.waiting
        for i, req in enumerate(waiting):
            if adder.budget_state() is AddReqResult.OTHER:
                break
            if self.batch_is_full and not preemption:
                # Full already: the first request not skipped below would end the loop, and
                # the skip checks change nothing, so end it now.
                break
            pos = i
            if lazy is not None:
                at = lazy.position(i)
                if at is None:
                    break
                pos = at
                req = waiting[pos]
            if req.rid in deferred:
                continue
            if (
                guard_in_flight
                and adder.can_run_list
                and self._recomputes_in_flight(req, adder.can_run_list)
            ):
                continue
            if len(adder.can_run_list) >= allocatable + (1 if chunked is not None else 0):
                self.batch_is_full = True
            if self.batch_is_full and (
                not preemption or not adder.preempt_to_schedule(req, self.running)
            ):
                break
            self._match_for_admission(req)
            n_before = len(adder.can_run_list)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
            if len(adder.can_run_list) == n_before:
                # Not admitted: the match was only borrowed for the checks.
                req.kv_len, req.cache_protected_len = 0, 0
            else:
                self._take_prefix_slots(req)
                admitted_pos.append(pos)
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    self.batch_is_full = bool(adder.can_run_list) or bool(self.running)
                break

        preempted = adder.preempt_list
        if not adder.can_run_list or all(a.extend_len == 0 for a in adder.can_run_list):
            self._requeue_all(preempted)
            return None, []
        if lazy is not None:
            admitted_pos.sort()
        for pos in reversed(admitted_pos):  # the loop did not reorder self.waiting
            self.policy.on_dequeue(self.waiting[pos])
            del self.waiting[pos]
        self._requeue_all(preempted)
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None, "only one chunked request at a time"
            self.chunked_req = adder.new_chunked_req

        now = self.clock.now()
        entries: list[ExtendEntry] = []
        for a in adder.can_run_list:
            if a.extend_len == 0:
                continue
            r = a.req
            if r.times.first_scheduled is None:
                r.times.first_scheduled = now
                r.cached_tokens = r.prefix_len + r.host_hit_len
                r.host_cached_tokens = r.host_hit_len
                self.stats.cached_prompt_tokens += min(r.cached_tokens, r.prompt_len)
                self.stats.host_cached_prompt_tokens += min(r.host_hit_len, r.prompt_len)
                self.stats.prompt_tokens += r.prompt_len
            entries.append(self._extend_entry(r, a.prefix_len, r.extend_end))

        mixed_decode: list[Req] = []
        if mixed and self.running and self._decode_fits(self.running):
            mixed_decode = list(self.running)
        decode_entries = self._decode_entries(mixed_decode) if mixed_decode else []
        return Batch(entries, decode_entries), mixed_decode

    def _recomputes_in_flight(self, req: Req, batch: list[Admission]) -> bool:
        """Would admitting ``req`` now recompute prompt tokens that a request of this very
        batch is computing (a chunked prefix being filled in, or an uncached prefix shared with
        a request admitted a moment ago)? Then it waits one round and reuses them from the
        cache instead. SGLang admits it and computes the shared tokens twice: its in-batch
        dedup only looks at requests with almost no cached match, and a chunked request's
        partially checkpointed prefix makes lpm favour exactly those duplicates."""
        fill = req.fill_ids()
        cap = req.max_prefix_len(len(fill))
        ns = req.namespace
        cached = -1  # the request's cached prefix, matched only when a member needs it
        threshold = max(self.config.in_batch_prefix_deprioritize_threshold, 1)
        for a in batch:
            other = a.req
            if other.namespace != ns:
                continue
            # The tokens ``a`` computes that ``req`` would recompute: [start, end) with
            # start = max(cached, a.prefix_len). Both tests below hold for start =
            # a.prefix_len whenever they hold at all, so the match waits until they do.
            end = min(cap, a.prefix_len + a.extend_len)
            if end - a.prefix_len < threshold:
                continue
            shared = longest_common_prefix(fill[:end], other.fill_ids()[:end])
            if shared - a.prefix_len < threshold:
                continue
            if cached < 0:
                cached = self.cache.match_len(CacheKey(fill[:cap], ns))
            start = max(cached, a.prefix_len)
            if end - start >= threshold and shared - start >= threshold:
                return True
        return False

    def _calc_priority(self) -> PriorityResult:
        return self.policy.calc_priority(
            self.waiting,
            self.running,
            self.processed_tokens,
            self.clock.now(),
            entry_ordered=self._entry_ordered and self._fcfs_keeps_order,
            lazy=True,
        )

    def _match_for_admission(self, req: Req) -> None:
        """Re-match the request with the ``len - 1`` cap (spec 2.6: init_next_round_input)."""
        fill = req.fill_ids()
        cap = req.max_prefix_len(len(fill))
        key = CacheKey(fill[:cap], req.namespace)
        # The slots of the match are gathered only if the request is admitted (a refused try
        # needs the length and the node): ``_take_prefix_slots``.
        m = self.cache.match_node(key)
        req.prefix_len = m.device_len
        req.last_node = m.last_node
        req.kv_row = req.kv_buf = EMPTY_SLOTS
        req.kv_len = m.device_len
        req.cache_protected_len = m.device_len
        req.host_hit_len = 0
        if self.host_tier is not None:
            host = self.host_tier.host_len(key, m.device_len)
            req.host_hit_len = max(
                0, floor_page(min(m.device_len + host, cap), self.page_size) - m.device_len
            )
        req.num_matched_prefix_tokens = min(m.device_len + req.host_hit_len, cap)

    def _take_prefix_slots(self, req: Req) -> None:
        """An admitted request's row: the slots of its matched prefix (a new array the row
        owns), read from the locked path its admission match ended on."""
        n = req.prefix_len
        if n and not len(req.kv_row):
            # Written straight into the row's buffer, sized for the whole request.
            buf = np.empty(max(_row_capacity(req), n), dtype=np.int64)
            req.kv_row = self.cache.prefix_slots(req.last_node, n, out=buf[:n])
            req.kv_buf = buf

    def _extend_entry(self, req: Req, prefix_len: int, end: int) -> ExtendEntry:
        """Allocate slots for positions [prefix_len, end) and describe the extend."""
        self._ensure_row(req, end)
        fill = req.fill_ids()
        host_load = 0
        if (
            req.host_hit_len
            and prefix_len == req.cache_protected_len
            and prefix_len == req.prefix_len
        ):
            host_load = min(req.host_hit_len, end - prefix_len)
            req.host_hit_len = 0
            if self.host_tier is not None:
                # Loaded back: refresh the host pages' recency.
                self.host_tier.touch(
                    CacheKey(fill[: prefix_len + host_load], req.namespace), prefix_len + host_load
                )
        req.kv_len = end
        entry = ExtendEntry(
            req=req,
            prefix_len=prefix_len,
            new_token_ids=fill[prefix_len:end],
            prefix_slots=req.kv_row[:prefix_len],
            new_slots=req.kv_row[prefix_len:end],
            produces_token=end == req.fill_len,
            host_load_len=host_load,
        )
        return entry

    def _ensure_row(self, req: Req, end: int) -> None:
        """Grow the request's KV row to cover positions [0, end) (whole pages), allocating
        straight into its buffer."""
        p = self.page_size
        have = len(req.kv_row)
        new_len = end if p == 1 else -(-end // p) * p
        if new_len > have:
            buf = self._row_buffer(req, new_len)
            self._alloc_into(buf[have:new_len])
            req.kv_row = buf[:new_len]

    def _grow_rows(self, reqs: list[Req], ends: list[int]) -> None:
        """Grow several rows with one eviction and one allocation (decode hot path)."""
        p = self.page_size
        if p == 1:
            needs = [max(e - len(r.kv_row), 0) for r, e in zip(reqs, ends, strict=True)]
        else:
            needs = [
                max(-(-e // p) * p - len(r.kv_row), 0) for r, e in zip(reqs, ends, strict=True)
            ]
        total = sum(needs)
        if total == 0:
            return
        slots = self._alloc(total)
        off = 0
        for r, n in zip(reqs, needs, strict=True):
            if n:
                self._append_slots(r, slots[off : off + n])
                off += n

    @staticmethod
    def _row_buffer(r: Req, new_len: int) -> np.ndarray:
        """The request's row buffer, with room for ``new_len`` positions and the current row
        at its head (``kv_row`` is left as it is)."""
        row = r.kv_row
        have = len(row)
        buf = r.kv_buf
        # kv_row must be the head of kv_buf (a view, or the buffer itself) to grow in place;
        # otherwise (a fresh row from a cache match) it is copied once.
        if new_len > len(buf) or (have and row.base is not buf and row is not buf):
            most = _row_capacity(r)
            buf = np.empty(most if new_len <= most else 2 * new_len, dtype=np.int64)
            buf[:have] = row
            r.kv_buf = buf
        return buf

    @classmethod
    def _append_slots(cls, r: Req, slots: np.ndarray) -> None:
        have = len(r.kv_row)
        new_len = have + len(slots)
        buf = cls._row_buffer(r, new_len)
        buf[have:new_len] = slots
        r.kv_row = buf[:new_len]

    def _alloc(self, n: int) -> np.ndarray:
        """``n`` new slots, evicting what is missing."""
        out = np.empty(n, dtype=np.int64)
        self._alloc_into(out)
        return out

    def _alloc_into(self, out: np.ndarray) -> None:
        """Fill ``out`` with ``len(out)`` newly allocated slots, evicting what is missing."""
        n = len(out)
        short = n - self.allocator.available_size()
        if short > 0:
            # Evicted slots go straight into this allocation (same slots, same free list
            # afterwards as freeing them and allocating).
            ok = self.allocator.recycle_into(self.cache.evict_reclaim(short), out)
        else:
            ok = self.allocator.alloc_into(out)
        if not ok:
            raise self._alloc_failed(n)

    def _reserve(self, n: int) -> None:
        short = n - self.allocator.available_size()
        if short > 0:
            self.cache.evict(short)
        if not self.allocator.reserve(n):
            raise self._alloc_failed(n)

    def _alloc_failed(self, n: int) -> IntegrityError:
        return IntegrityError(
            f"KV allocation of {n} slots failed: available {self.allocator.available_size()}, "
            f"evictable {self.cache.evictable_size()} (the admission budget was violated)"
        )

    # ---- decode -----------------------------------------------------------------------------
    def _cols_need(self, cols: _DecodeCols, steps: int) -> int:
        """Slots to allocate so every request of ``cols`` can decode ``steps`` more tokens:
        after ``k`` steps a request has KV for positions ``[0, fill_len - 1 + k)``."""
        p = self.page_size
        ends = cols.fill + (steps - 1)
        if p > 1:
            ends = -(-ends // p) * p
        return int(np.maximum(ends - cols.have, 0).sum())

    def _max_steps_that_fit(self, cols: _DecodeCols, limit: int, room: int) -> int:
        """The largest ``k <= limit`` with ``_cols_need(cols, k) <= room`` (1 when none does:
        callers have checked one step fits). On page-1 pools whose rows end where their next
        token goes (the usual case) the need is ``sum(fill - 1 - have) + n * k``, solved
        directly; otherwise a binary search over the need."""
        if self.page_size == 1:
            short = cols.fill - 1 - cols.have
            if len(short) and int(short.min()) >= 0:
                fit = (room - int(short.sum())) // len(short)
                return max(1, min(limit, fit))
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._cols_need(cols, mid) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _cols_fit(self, cols: _DecodeCols, steps: int) -> bool:
        need = self._cols_need(cols, steps)
        return need <= self.allocator.available_size() + self.cache.evictable_size()

    def _decode_fits(self, reqs: list[Req]) -> bool:
        return self._cols_fit(_DecodeCols.of(reqs, bool(self.eos_ids)), 1)

    def _make_room_for_decode(self, cols: _DecodeCols) -> list[Req]:
        """Retract running requests until the next decode step fits (spec 4.6). ``cols``
        describes the running batch; only the victims' deferred decode state is settled."""
        p = self.page_size
        ends = cols.fill if p == 1 else -(-cols.fill // p) * p
        need_of = np.maximum(ends - cols.have, 0).tolist()
        need = sum(need_of)

        def fits() -> bool:
            return need <= self.allocator.available_size() + self.cache.evictable_size()

        if fits():
            return []
        retracted: list[Req] = []
        first = True
        if self.chunked_req is not None:
            # A request half-way through a chunked prefill holds KV the running batch needs
            # and has no output yet: it is the first victim (as it would be in SGLang's order
            # had it been in the running batch; SGLang never considers it and aborts a running
            # request instead).
            victim = self.chunked_req
            self.chunked_req = None
            self._retract(victim)
            retracted.append(victim)
            first = False
        order: list[int] | None = None  # sorted when a running request must go
        keep = np.ones(len(cols.reqs), dtype=np.bool_)
        left = len(cols.reqs)
        while left > 1 and ((first and self.config.sglang_compat) or not fits()):
            first = False
            if order is None:
                order = self._retraction_order(cols)
            i = order.pop()
            keep[i] = False
            left -= 1
            need -= need_of[i]
            victim = cols.reqs[i]
            if self._unsettled:
                self._settle(cols, i)
            self._retract(victim)
            retracted.append(victim)
        if left < len(cols.reqs):
            survivors = [r for r, kept in zip(cols.reqs, keep.tolist(), strict=True) if kept]
            self.running = survivors
            self._decode_tokens_memo = None
            self._cols = cols.take(keep, list(survivors))
        if not fits():
            self._running_changed()
            last = self.running.pop()
            self._release(last, cache_kv=False)
            self._finish_aborted(
                last, 500, "Out of memory even after retracting every other request"
            )
        if retracted:
            self.stats.retractions += len(retracted)
            rest = self._running_cols()
            n = len(rest.reqs)
            est = (int(rest.out_len.sum()) + self.config.retract_decode_steps * n) / (
                int(rest.max_new.sum()) + 1
            )
            self.ratio.after_retraction(min(1.0, est))
            keep_free = n * self.config.retract_decode_steps
            short = keep_free - self.allocator.available_size()
            if short > 0:
                self.cache.evict(short)
            self.batch_is_full = False
            self._requeue_all(retracted)
            logger.debug(
                "retracted %d requests; new_token_ratio=%.3f", len(retracted), self.ratio.current
            )
        return retracted

    def _retraction_order(self, cols: _DecodeCols) -> list[int]:
        """Positions in the running batch, sorted so that ``pop()`` yields the next victim
        (spec 4.6). Lengths come from the columns (deferred decode state included)."""
        sign = self.config.priority_sign
        reqs = cols.reqs
        out = cols.out_len.tolist()
        if self.config.retraction_policy == "priority":

            def key(i: int) -> tuple[Any, ...]:
                r = reqs[i]
                return (_prio_value(r, sign) * -sign, out[i], -len(r.prompt_ids))
        else:

            def key(i: int) -> tuple[Any, ...]:
                return (out[i], -len(reqs[i].prompt_ids))

        return sorted(range(len(reqs)), key=key, reverse=True)

    def _decode_entries(self, reqs: list[Req]) -> list[DecodeEntry]:
        self._running_changed()  # rows grow now, tokens arrive in _run
        entries = []
        self._grow_rows(reqs, [r.fill_len for r in reqs])
        for r in reqs:
            pos = r.fill_len - 1
            r.kv_len = pos + 1
            last = r.output_ids[-1] if r.output_ids else int(r.prompt_ids[-1])
            entries.append(DecodeEntry(r, last, pos, r.kv_row[: pos + 1]))
        return entries

    def _decode_jump_steps(self, horizon: float | None, cols: _DecodeCols) -> int:
        """How many decode steps can run at once with nothing but lengths changing (simulator).

        Jumping is exact only while no scheduling decision can change: no chunked request, no
        prefill attempt possible (empty queue, or the batch is full and preemption is off), no
        stop token that could end a request early, enough memory for every step."""
        cfg = self.config
        if not self.runner.supports_multi_step or self.chunked_req is not None:
            return 1
        if self.waiting and not (self.batch_is_full and not cfg.enable_priority_preemption):
            return 1
        if cols.can_stop:
            return 1
        k = int((cols.max_new - cols.out_len).min())
        if k <= 1:
            return 1
        room = self.allocator.available_size() + self.cache.evictable_size()
        k = self._max_steps_that_fit(cols, k, room)
        if horizon is not None and self.waiting == [] and k > 1:
            durs = self.runner.decode_durations(cols.reqs, cols.fill, k)
            ends = _step_ends(self.clock.now(), durs)
            hit = int(np.searchsorted(ends, horizon, side="left"))
            k = min(k, hit + 1)
        return max(k, 1)

    def _run_decode_multi(self, k: int, cols: _DecodeCols) -> StepOutcome:
        reqs = cols.reqs
        self._decode_tokens_memo = None
        # Deferral needs tokens that cannot end a request early (checked every step).
        defer = self._defer and not cols.can_stop
        if not defer:
            self.sync_running()
        fill0 = cols.fill
        tok_lists: list[list[int]] = []
        if defer:
            durations = self.runner.decode_durations(reqs, fill0, k)
        else:
            res = self.runner.decode_multi(reqs, fill0, k)
            durations = res.step_durations_s
            tok_lists = res.tokens.tolist()
        # After k steps a request holds KV for positions [0, fill_len - 1 + k).
        p = self.page_size
        ends = fill0 + (k - 1)
        paged = ends if p == 1 else -(-ends // p) * p
        needs = np.maximum(paged - cols.have, 0)
        total = int(needs.sum())
        slots: list[int] = []
        if defer:
            if total:
                self._reserve(total)
        elif total:
            slots = self._alloc(total).tolist()
        t0 = self.clock.now()
        step_ends = _step_ends(t0, durations)
        total_s = float(step_ends[-1] - t0)
        if isinstance(self.clock, VirtualClock):
            self.clock.jump_to(float(step_ends[-1]))  # exactly where k single steps would end
        else:
            self.clock.advance(total_s)
        self.ratio.decay_steps(k)
        self.stats.decode_steps += k
        self._account(len(reqs), durations.tolist())
        out = StepOutcome("decode", total_s, len(reqs), num_steps=k)
        times = step_ends.tolist()
        if defer:
            self._decode_log.extend(times)
            self._unsettled = True
            runner = self.runner

            def tokens() -> tuple[list[Req], list[list[int]]]:
                positions = fill0[:, None] + np.arange(k, dtype=np.int64)[None, :]
                return reqs, runner.tokens_at(reqs, positions).tolist()

            out._batch_tokens = tokens
        else:
            out._batch_tokens = lambda: (reqs, tok_lists)
            off = 0
            # One pass over the batch: KV rows grow (kv_row is always the head of kv_buf, see
            # _append_slots), tokens and their times are recorded.
            for r, toks, n, have, end in zip(
                reqs, tok_lists, needs.tolist(), cols.have.tolist(), ends.tolist(), strict=True
            ):
                if n:
                    new_len = have + n
                    buf = r.kv_buf
                    if new_len > len(buf):
                        buf = np.empty(max(2 * new_len, 64), dtype=np.int64)
                        buf[:have] = r.kv_row
                        r.kv_buf = buf
                    if n == 1:
                        buf[have] = slots[off]
                    else:
                        buf[have:new_len] = slots[off : off + n]
                    off += n
                    r.kv_row = buf[:new_len]
                r.kv_len = end
                r.output_ids.extend(toks)
                r.times.token_times.extend(times)
        if self.policy.tracks_service:
            self.policy.on_decode_service(reqs, k)
        # The columns after the step stay right for the next one (finished rows dropped).
        out_len = cols.out_len + k
        after = cols._replace(fill=fill0 + k, have=np.maximum(paged, cols.have), out_len=out_len)
        self._cols = after
        # Only a request that can have finished is checked (a jump never spans a stop token).
        if cols.can_stop:
            maybe: list[int] = list(range(len(reqs)))
        else:
            maybe = np.flatnonzero(out_len >= cols.max_new).tolist()
        finished = out.finished
        gone: list[int] = []  # positions in reqs (== self.running) of finished requests
        for i in maybe:
            r = reqs[i]
            if defer:
                self._settle(after, i)
            self._check_finish(r)
            if r.finished:
                finished.append(r)
                gone.append(i)
        if gone:
            survivors = list(reqs)
            for i in reversed(gone):
                del survivors[i]
            keep = np.ones(len(reqs), dtype=np.bool_)
            keep[gone] = False
            # The finished requests are settled: the survivors' columns carry the rest.
            self._retire(finished, survivors, after.take(keep, list(survivors)))
        return out

    # ---- running a batch ----------------------------------------------------------------------
    def _account(self, batch_size: int, durations: list[float]) -> None:
        """Per-step statistics (after the forward, before finished requests leave)."""
        st = self.stats
        for d in durations:  # one step at a time, so a jump rounds like single steps
            st.busy_s += d
            st.running_x_s += batch_size * d
        usage = self.kv_usage()
        if usage > st.peak_kv_usage:
            st.peak_kv_usage = usage

    def _run(self, batch: Batch, mixed_decode: list[Req]) -> StepOutcome:
        result = self.runner.forward(batch)
        self._account(batch.batch_size, [result.duration_s])
        self.clock.advance(result.duration_s)
        now = self.clock.now()
        out = StepOutcome(batch.mode.value, result.duration_s, batch.batch_size)
        tracks_service = self.policy.tracks_service
        if batch.extend:
            self.stats.prefill_steps += 1
            n = computed = 0
            for e in batch.extend:
                new = len(e.new_token_ids)
                n += new
                computed += new - e.host_load_len
            self.processed_tokens += n
            out.prefill_tokens = n
            self.stats.prefill_tokens_computed += computed
        if batch.decode:
            self.stats.decode_steps += 1
            if not batch.extend:
                self.ratio.decay_steps(1)
        joined: list[Req] = []
        for e in batch.extend:
            r = e.req
            computed = len(e.new_token_ids) - e.host_load_len
            r.computed_prefill_tokens += computed
            if tracks_service:
                self.policy.on_service(r, computed, 0)
            if not e.produces_token:
                continue  # a middle chunk: checkpointed at the start of the next step
            if r is self.chunked_req:
                self.chunked_req = None
            tok = result.next_tokens[r.rid]
            self._append_token(r, tok, now)
            out.new_tokens.append((r, [tok]))
            if r.finished:
                out.finished.append(r)
                self._release(r, cache_kv=True)
                self._forget(r)
            else:
                self._checkpoint(r, r.kv_len)
                self.running.append(r)
                joined.append(r)
        for d in batch.decode:
            r = d.req
            tok = result.next_tokens[r.rid]
            self._append_token(r, tok, now)
            out.new_tokens.append((r, [tok]))
            if tracks_service:
                self.policy.on_service(r, 0, 1)
            if r.finished:
                out.finished.append(r)
        self._retire_finished([r for r in out.finished if r in self.running])
        if out.new_tokens:  # a middle chunk alone leaves the running batch as it was
            cols = self._cols
            if cols is not None and not batch.decode:
                # Only appends: extend the columns rather than rebuild them (they may hold
                # deferred decode state of the requests already running).
                self._decode_tokens_memo = None
                self._cols = cols.extended(joined, bool(self.eos_ids))
            else:
                self._running_changed()
        return out

    def _append_token(self, r: Req, tok: int, now: float) -> None:
        r.output_ids.append(tok)
        r.times.token_times.append(now)
        if r.times.first_token is None:
            r.times.first_token = now
        self._check_finish(r)

    def _check_finish(self, r: Req) -> None:
        s = r.sampling
        last = r.output_ids[-1] if r.output_ids else None
        if (last is not None and last in s.stop_token_ids) or (
            last is not None and not s.ignore_eos and last in self.eos_ids
        ):
            r.finish = FinishState(FinishReason.STOP, matched_token=last)
        elif r.output_len >= s.max_new_tokens:
            r.finish = FinishState(FinishReason.LENGTH)
            if r.output_len > s.max_new_tokens:  # a decode jump never overshoots
                raise IntegrityError(f"{r.rid} produced {r.output_len} > {s.max_new_tokens} tokens")
        if r.finished:
            r.times.finish = (
                self.clock.now() if not r.times.token_times else r.times.token_times[-1]
            )

    def _retire_finished(self, finished: list[Req]) -> None:
        if not finished:
            return
        gone = {id(r) for r in finished}
        self._retire(finished, [r for r in self.running if id(r) not in gone])

    def _retire(
        self, finished: list[Req], survivors: list[Req], cols: _DecodeCols | None = None
    ) -> None:
        """``finished`` leave the running batch, which becomes ``survivors`` (in order);
        ``cols``, when given, are the survivors' columns (the finished must be settled)."""
        if cols is None:
            self._running_changed()
        else:
            self._decode_tokens_memo = None
            self._cols = cols
        self.running = survivors
        self.batch_is_full = False
        for r in finished:
            self._release(r, cache_kv=True)
            self._forget(r)

    # ---- KV bookkeeping ---------------------------------------------------------------------
    def _insert_priority(self, req: Req) -> int:
        """Node priority for the ``priority`` eviction policy: higher is kept longer. Our
        scheduling sign is applied so that 'more important' is always kept longer, and a
        request without a priority inserts as 0 (spec 8.20; compat: raw value or 0)."""
        if req.priority is None:
            return 0
        if self.config.sglang_compat:
            return req.priority
        return req.priority if self.config.priority_sign < 0 else -req.priority

    def _checkpoint(self, req: Req, up_to: int) -> None:
        """Insert the request's computed KV [0, up_to) into the cache and re-point its row at the
        cached copy; the lock moves to the new deepest node (spec 3.10)."""
        p = self.page_size
        aligned = floor_page(min(up_to, req.kv_len), p)
        if self.cache.disabled or aligned <= req.cache_protected_len:
            req.prefix_len = up_to
            return
        lock = req.lock_node
        lo = req.cache_protected_len
        if lock is not None and lock is not self.cache.root:
            # The locked prefix is the path to the lock node: the insert compares, and is
            # given, only what follows it.
            res = self.cache.insert(
                CacheKey(req.fill_slice(lo, aligned), req.namespace),
                req.kv_row[lo:aligned],
                self._insert_priority(req),
                inserted_len=req.cache_inserted_len,
                start=(lock, lo),
                from_start=True,
                adopt=True,
            )
        else:
            res = self.cache.insert(
                CacheKey(req.fill_slice(0, aligned), req.namespace),
                req.kv_row[:aligned],
                self._insert_priority(req),
                inserted_len=req.cache_inserted_len,
                adopt=True,
            )
        if res.prefix_len == req.cache_protected_len and self._shares_prefixes:
            # Nothing past the request's locked prefix was cached before: the new nodes hold
            # copies of the request's own slots and ``last_node`` ends at ``aligned``, so the
            # row is already right (a re-match would only repeat the insert's walk).
            node = res.last_node
        else:
            key = CacheKey(req.fill_slice(0, aligned), req.namespace)
            m = self.cache.match_prefix(key)
            if m.device_len < aligned:
                # The cache did not keep it (a no-reuse baseline): the request keeps its slots.
                req.prefix_len = up_to
                return
            dup_end = min(res.prefix_len, aligned)
            lo = req.cache_protected_len
            if dup_end > lo:
                self.allocator.free(req.kv_row[lo:dup_end])
                # Re-point the duplicates at the cached copy. Past dup_end the new nodes
                # hold the row's own slots (adopted: that part of the row is never written).
                req.kv_row[lo:dup_end] = m.indices[lo:dup_end]
            node = m.last_node
        req.cache_protected_len = aligned
        req.cache_inserted_len = aligned
        self.cache.move_lock(req.lock_node, node)
        req.lock_node = node
        req.last_node = node
        req.prefix_len = up_to

    def _release(self, req: Req, *, cache_kv: bool) -> None:
        """Give back everything the request holds: KV (optionally cached first) and its lock."""
        if cache_kv and req.kv_len > req.cache_protected_len:
            self._checkpoint(req, req.kv_len)
        if len(req.kv_row) > req.cache_protected_len:
            self.allocator.free(req.kv_row[req.cache_protected_len :])
        if req.lock_node is not None:
            self.cache.dec_lock_ref(req.lock_node)
        req.lock_node = None
        req.last_node = None
        req.kv_row = EMPTY_SLOTS
        req.kv_buf = EMPTY_SLOTS
        req._fill_memo = None  # a finished request's copy of its tokens need not live on
        req.kv_len = 0
        req.cache_protected_len = 0
        req.cache_inserted_len = 0
        req.prefix_len = 0
        req.extend_end = 0
        req.host_hit_len = 0

    def _retract(self, req: Req) -> None:
        # radixsched caches the computed KV before releasing it (spec 8.11); SGLang discards it.
        self._release(req, cache_kv=not self.config.sglang_compat)
        req.retraction_count += 1

    def _preempt(self, victims: list[Req]) -> None:
        for v in victims:
            self.running.remove(v)
            self._running_changed()
            self._release(v, cache_kv=not self.config.sglang_compat)
            v.preemption_count += 1
            self.stats.preemptions += 1
        keep = len(self.running) * self.config.retract_decode_steps
        short = keep - self.allocator.available_size()
        if short > 0:
            self.cache.evict(short)

    # ==== invariants ===========================================================================
    def owned_slots(self) -> np.ndarray:
        """Slots held by requests (deferred decode slots are still reserved, unchosen: the
        allocator counts them among its free slots until they are claimed)."""
        holders = [*self.running]
        if self.chunked_req is not None:
            holders.append(self.chunked_req)
        parts = [r.kv_row[r.cache_protected_len :] for r in holders if len(r.kv_row)]
        return np.concatenate(parts) if parts else EMPTY_SLOTS

    def check_integrity(self) -> None:
        """Every KV slot is free, cached or owned by exactly one request; every lock is held by
        a live request; raises ``IntegrityError`` with numbers."""
        self.cache.check_integrity()
        self.allocator.check_integrity(
            cache_slots=self.cache.all_values(), request_slots=self.owned_slots()
        )
        holders = [*self.running] + ([self.chunked_req] if self.chunked_req is not None else [])
        for r in self.waiting:
            if r.lock_node is not None or len(r.kv_row):
                raise IntegrityError(f"waiting request {r.rid} holds a lock or KV slots")
        if not holders and self.cache.protected_size() != 0:
            raise IntegrityError(
                f"idle scheduler but {self.cache.protected_size()} tokens remain locked"
            )
        for r in holders:
            r.check_invariants()
        cols = self._cols
        fresh_cols = _DecodeCols.of(self.running, bool(self.eos_ids))
        if self._unsettled:
            if cols is None:
                raise IntegrityError("deferred decode state without running-batch columns")
            self._check_deferred(cols, fresh_cols)
        elif self.allocator.reserved_size():
            raise IntegrityError(f"{self.allocator.reserved_size()} KV slots reserved, none owed")
        memo = self._decode_tokens_memo
        clip = self.config.clip_max_new_tokens
        fresh = (cols if self._unsettled and cols is not None else fresh_cols).decode_tokens(clip)
        if memo is not None and memo != fresh:
            raise IntegrityError(f"stale running decode-token memo {memo}, actual {fresh}")
        if cols is not None and not self._unsettled and not cols.same_as(fresh_cols):
            raise IntegrityError("stale running-batch columns")

    def _check_deferred(self, cols: _DecodeCols, settled: _DecodeCols) -> None:
        """The columns are ahead of the requests by whole decode steps of the log, and the
        slots they are owed are exactly the allocator's reservation."""
        if len(cols.reqs) != len(settled.reqs) or any(
            a is not b for a, b in zip(cols.reqs, settled.reqs, strict=True)
        ):
            raise IntegrityError("deferred columns do not list the running batch")
        behind = cols.fill - settled.fill
        owed = cols.have - settled.have
        if (
            (behind < 0).any()
            or int(behind.max(initial=0)) > len(self._decode_log)
            or not np.array_equal(cols.out_len - settled.out_len, behind)
            or (owed < 0).any()
            or int(owed.sum()) != self.allocator.reserved_size()
            or any(
                not np.array_equal(getattr(cols, f), getattr(settled, f))
                for f in ("max_new", "ignore_eos", "stops")
            )
        ):
            raise IntegrityError(
                f"deferred decode state inconsistent: {int(behind.sum())} tokens and "
                f"{int(owed.sum())} slots owed, {self.allocator.reserved_size()} reserved"
            )


class _DecodeCols(NamedTuple):
    """The running batch's lengths as columns, gathered in one pass per decode step."""

    reqs: list[Req]
    fill: np.ndarray  # prompt + output length (the next token's KV goes at fill - 1)
    have: np.ndarray  # len(kv_row): slots already allocated
    out_len: np.ndarray
    max_new: np.ndarray
    ignore_eos: np.ndarray  # bool
    stops: np.ndarray  # bool: the request may stop before max_new_tokens (stop ids or EOS)

    @property
    def can_stop(self) -> bool:
        return bool(self.stops.any())

    @staticmethod
    def of(reqs: list[Req], has_eos: bool) -> _DecodeCols:
        rows = [
            (
                len(r.prompt_ids) + len(r.output_ids),
                len(r.kv_row),
                len(r.output_ids),
                r.sampling.max_new_tokens,
                r.sampling.ignore_eos,
                bool(r.sampling.stop_token_ids) or (has_eos and not r.sampling.ignore_eos),
            )
            for r in reqs
        ]
        a = np.array(rows, dtype=np.int64).reshape(len(rows), 6)
        return _DecodeCols(
            list(reqs), a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4] != 0, a[:, 5] != 0
        )

    def take(self, mask: np.ndarray, reqs: list[Req]) -> _DecodeCols:
        """The rows where ``mask`` is true, in order; ``reqs`` are those rows' requests."""
        return _DecodeCols(
            reqs,
            self.fill[mask],
            self.have[mask],
            self.out_len[mask],
            self.max_new[mask],
            self.ignore_eos[mask],
            self.stops[mask],
        )

    def extended(self, reqs: list[Req], has_eos: bool) -> _DecodeCols:
        """These rows followed by ``reqs``'s."""
        more = _DecodeCols.of(reqs, has_eos)
        return _DecodeCols(
            self.reqs + more.reqs,
            np.concatenate([self.fill, more.fill]),
            np.concatenate([self.have, more.have]),
            np.concatenate([self.out_len, more.out_len]),
            np.concatenate([self.max_new, more.max_new]),
            np.concatenate([self.ignore_eos, more.ignore_eos]),
            np.concatenate([self.stops, more.stops]),
        )

    def decode_tokens(self, clip: int) -> tuple[int, int]:
        """``adder.running_decode_tokens`` of these requests, vectorised."""
        rem = np.minimum(np.maximum(self.max_new - self.out_len, 0), clip)
        full = int(rem[self.ignore_eos].sum())
        return full, int(rem.sum()) - full

    def same_as(self, other: _DecodeCols) -> bool:
        return (
            len(self.reqs) == len(other.reqs)
            and all(a is b for a, b in zip(self.reqs, other.reqs, strict=True))
            and all(
                np.array_equal(getattr(self, f), getattr(other, f))
                for f in ("fill", "have", "out_len", "max_new", "ignore_eos", "stops")
            )
        )


def _row_capacity(r: Req) -> int:
    """Positions a request's KV row buffer is sized for: every position it can reach (prompt
    + all output, a page's worth to spare), so all its chunks and decode steps fit in one
    allocation."""
    return len(r.prompt_ids) + r.sampling.max_new_tokens + 64


def _step_ends(t0: float, durations: np.ndarray) -> np.ndarray:
    """End time of each of several consecutive steps, accumulated left to right exactly as a
    clock advanced step by step would (``t0 + (d1 + d2)`` can differ from ``(t0 + d1) + d2``)."""
    return np.cumsum(np.concatenate([[t0], durations]))[1:]


def _prio_value(r: Req, sign: int) -> int:
    if r.priority is not None:
        return r.priority
    return (2**63 - 1) if sign > 0 else -(2**63)


def match_at_door(cache: BasePrefixCache, req: Req) -> None:
    """``num_matched_prefix_tokens`` as the capped match (``max_prefix_len``) of the fill,
    the load snapshot a router reads. The walk is the uncapped one (the capped match is
    ``min(n, floor_page(cap))``: the walk of a truncated key stops where the full walk does,
    or at the truncation), so it is also a valid ``match_memo`` for the policy's first round
    while the request's cache subtree is unchanged (``subtree_epoch``)."""
    fill = req.fill_ids()
    ns = req.namespace
    page = cache.page_size
    cap = req.max_prefix_len(len(fill))
    n = cache.match_len(CacheKey(fill, ns))
    req.num_matched_prefix_tokens = min(n, floor_page(cap, page))
    if cache.supports_match_memo:
        if req.subtree_key is None and len(req.prompt_ids) >= page:
            req.subtree_key = cache.subtree_key(CacheKey(req.prompt_ids, ns))
        if req.subtree_key is not None:
            req.match_memo = (cache.subtree_epoch(req.subtree_key), len(req.output_ids), n)


def _replace_sampling(s: SamplingParams, **kw: Any) -> SamplingParams:
    return dataclasses.replace(s, **kw)


__all__ = [
    "AdmitResult",
    "Scheduler",
    "SchedulerStats",
    "StepOutcome",
]
