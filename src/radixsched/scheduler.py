"""The one scheduler loop that the simulator, the offline engine and the HTTP server all run.

Each ``step()`` is one forward pass, a prefill whenever one can be built, else a decode:

1. ``prefill_round``: checkpoint the KV the chunked request computed last step into the cache,
   continue it ahead of every waiting request, order the waiting queue and admit requests
   through the ``PrefillAdder``;
2. if that built no batch, ``decode_round``: one decode step of every running request,
   retracting requests first when the step's new KV does not fit in free + evictable memory;
3. ``run``: the batch on the ``ModelRunner``; tokens are appended, finished requests cache
   their KV and release it, prefilled ones join the running batch.

Ownership (``check_integrity``, after every step in tests): every KV slot is free, cached, or
owned by exactly one running or chunked request (``kv.py``); a request holds one cache lock from
admission until it finishes, is retracted, preempted or aborted; an idle scheduler holds none.
Scheduling decides order and timing only: the same requests produce the same tokens under
every policy, with the cache on or off.

The loop calls its role's hooks (``roles.py``: co-located by default, or one side of a split
prefill/decode deployment, ``radixsched.cluster.disagg``) and never asks which role it plays.

This is the reference: every round does all its work. ``radixsched.native.NativeScheduler`` gives
the same schedule, bit for bit, doing only the work that changed (tests/test_equivalence.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixsched.adder import AddReqResult, Admission, PrefillAdder, PrefillGate
from radixsched.cache import CacheKey, TokenAllocator, make_cache
from radixsched.cache.base import BasePrefixCache, IntegrityError, ceil_page
from radixsched.cache.radix import longest_common_prefix
from radixsched.clock import Clock, VirtualClock
from radixsched.config import SchedulerConfig, resolve_max_running_requests
from radixsched.kv import KVManager
from radixsched.policies import prio_value, validate_priority
from radixsched.queue import RoundOrder, WaitingQueue
from radixsched.ratio import NewTokenRatioTracker
from radixsched.request import FINISHED_BY_LENGTH, FinishReason, FinishState, Req
from radixsched.roles import CoLocated, Role
from radixsched.runner import Batch, ExtendEntry, ModelRunner, StepOutcome
from radixsched.running import RunningBatch

logger = logging.getLogger(__name__)


class AdmitResult(NamedTuple):
    """Outcome of ``add_request``: rejected requests are never enqueued."""

    accepted: bool
    status_code: int | None = None  # HTTP status a server maps a rejection to
    message: str = ""


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
    peak_waiting: int = 0
    peak_kv_usage: float = 0.0
    busy_s: float = 0.0
    running_x_s: float = 0.0  # integral of the batch size over busy time (mean: / busy_s)


class Scheduler:
    # The parts an accelerated scheduler replaces (``radixsched.native.NativeScheduler``).
    kv_class: type[KVManager] = KVManager
    queue_class: type[WaitingQueue] = WaitingQueue
    cache_factory = staticmethod(make_cache)  # the accelerated core's: the native tree
    pool_factory: Callable[[int, int], TokenAllocator] = TokenAllocator  # (size, page size)

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
        role: type[Role] = CoLocated,
    ) -> None:
        self.config = config = role.configure(config)
        self.runner = runner
        self.clock: Clock = clock if clock is not None else VirtualClock()
        self.page_size = config.page_size
        self.allocator = self.pool_factory(kv_slots, config.page_size)
        self.host_tier = host_tier
        on_evict = host_tier.on_evict if host_tier is not None else None
        self.cache: BasePrefixCache = self.cache_factory(config, self.allocator, on_evict=on_evict)
        self.kv = self.kv_class(self.cache, self.allocator, config, host_tier=host_tier)
        self.queue = self.queue_class(config, self.cache)
        self.policy = self.queue.policy
        self.eos_ids = frozenset(runner.eos_token_ids())
        self.batch = self._make_running()
        self.capacity = self.allocator.total_size
        self.context_len = context_len
        self.max_running_requests = resolve_max_running_requests(config, self.capacity, context_len)
        self.ratio = NewTokenRatioTracker(config)
        self.gate_factory = gate_factory
        self.chunked_req: Req | None = None
        self.batch_is_full = False
        self.processed_tokens = 0  # HRRN's clock: extend tokens run (decode steps never count)
        self.stats = SchedulerStats()
        self._by_rid: dict[str, Req] = {}
        self.role = role(self)

    def _make_running(self) -> RunningBatch:
        return RunningBatch()

    @property
    def waiting(self) -> list[Req]:
        return self.queue.reqs

    @property
    def running(self) -> list[Req]:
        return self.batch.reqs

    # ==== queue entry ========================================================================
    def add_request(self, req: Req, now: float | None = None) -> AdmitResult:
        """Validate and enqueue. Rejections happen here, at the door, never after enqueueing."""
        cfg = self.config
        t = self.clock.now() if now is None else now
        if (err := self._door_check(req)) is not None:
            return self._reject(req, *err)
        if cfg.enable_priority_scheduling and req.priority is None:
            req.priority = cfg.default_priority_value
        limit = self.role.queue_limit
        if limit is not None and len(self.waiting) + 1 > limit:
            victim = self._queue_limit_victim(req)
            if victim is None:
                return self._reject(req, 503, "The request queue is full.")
            self.queue.remove(victim)
            self._finish_aborted(
                victim, 503, "The request is aborted by a higher priority request."
            )
        req.queue_entry_time = req.arrival_time = req.times.arrival = t
        req.queue_entry_processed_tokens = self.processed_tokens
        self._by_rid[req.rid] = req
        self.role.enqueue(req)
        return AdmitResult(True)

    def _door_check(self, req: Req) -> tuple[int, str] | None:
        """(status, message) when ``req`` must be rejected; caps its max_new_tokens to fit."""
        if req.rid in self._by_rid:
            return 400, f"duplicate request id {req.rid!r}"
        if req.sampling.max_new_tokens < 1:
            return 400, "max_new_tokens must be >= 1"
        if (err := validate_priority(req.priority, self.config)) is not None:
            return 503, err
        # The prompt plus one decode token must fit in KV memory and in the context window.
        p, n = self.page_size, req.fill_len
        max_req_len = min(self.context_len - 1, self.capacity - 1)
        where = f"(context {self.context_len}, KV capacity {self.capacity} tokens)"
        if n >= max_req_len or ceil_page(n, p) + p + 1 > self.capacity:
            return 400, f"prompt of {n} tokens does not fit {where}"
        cap = min(max_req_len - n - 1, self.capacity - ceil_page(n, p) - p - 1)
        if cap < 1:
            return 400, f"prompt of {n} tokens leaves no room to generate a token {where}"
        if req.sampling.max_new_tokens > cap:
            req.sampling = dataclasses.replace(req.sampling, max_new_tokens=cap)
        return None

    def _reject(self, req: Req, code: int, message: str) -> AdmitResult:
        self.stats.rejected += 1
        req.finish = FinishState(FinishReason.ABORT, message, code)
        return AdmitResult(False, code, message)

    def _queue_limit_victim(self, incoming: Req) -> Req | None:
        """With priority scheduling, a strictly more important arrival displaces the least
        important (then most recently queued) waiting request."""
        if not self.config.enable_priority_scheduling or not self.waiting:
            return None
        sign = self.config.priority_sign
        cand = max(self.waiting, key=lambda r: (sign * prio_value(r, sign), r.queue_entry_time))
        return cand if sign * prio_value(incoming, sign) < sign * prio_value(cand, sign) else None

    def _requeue(self, reqs: list[Req]) -> None:
        if reqs:  # retracted or preempted requests go where the role puts them
            self.role.requeue(reqs)

    # ==== abort ==============================================================================
    def abort(self, rid: str, message: str = "aborted by client", status_code: int = 499) -> bool:
        """Abort a waiting, chunked or running request (or one a role holds: a prefilled
        request whose transfer is abandoned included); its slots and lock are released."""
        req = self._by_rid.get(rid)
        if req is None or (req.finished and req not in self.role.holders()):
            return False
        self._detach(req, cache_kv=not self.config.sglang_compat)  # radixsched caches its KV
        self._finish_aborted(req, status_code, message)
        return True

    def discard(self, req: Req, status_code: int, message: str) -> None:
        """Abort ``req`` wherever it is (a batch whose forward failed included), dropping its
        KV, whose last positions may never have been written."""
        if not req.finished:
            self._detach(req, cache_kv=False)
            self.batch_is_full = False
            self.kv.release(req, cache_kv=False)  # a failed batch's member is in no list
            self._finish_aborted(req, status_code, message)

    def _detach(self, req: Req, *, cache_kv: bool) -> None:
        """Take ``req`` out of the queue, the chunked slot, the batch or a role's; release it."""
        if req in self.waiting:
            self.queue.remove(req)
            return
        if req is self.chunked_req:
            self.chunked_req = None
        elif req in self.running:
            self.batch.remove([req])
            self.batch_is_full = False
        else:  # in a role's queue (it releases what it holds)
            self.role.drop(req, cache_kv=cache_kv)
            return
        self.kv.release(req, cache_kv=cache_kv)

    def _finish_aborted(self, req: Req, code: int, message: str) -> None:
        req.finish = FinishState(FinishReason.ABORT, message, code)
        req.times.finish = self.clock.now()
        self.stats.aborted += 1
        self._forget(req)

    def _forget(self, req: Req) -> None:
        self._by_rid.pop(req.rid, None)
        self.queue.forget(req)

    # ==== state ==============================================================================
    @property
    def is_idle(self) -> bool:
        """Nothing to run: a role's requests waiting on the peer do not count."""
        return not self.waiting and not self.running and self.chunked_req is None and self.role.idle

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked_req is not None else 0)

    def sync_running(self) -> None:
        """Bring every running request's fields up to date (the reference is always)."""

    def decode_tokens_to_go(self) -> list[int]:
        """Tokens each running request may still generate (in no particular order)."""
        return [r.remaining_new_tokens for r in self.running]

    def kv_usage(self) -> float:
        return (self.capacity - self._room()) / self.capacity

    # ==== the step ===========================================================================
    def step(self, horizon: float | None = None) -> StepOutcome | None:
        """Run one forward pass; None when there is nothing to run. ``horizon`` (the time of
        the next external event) lets accelerators run several passes at once before it."""
        self.stats.peak_waiting = max(self.stats.peak_waiting, len(self.waiting))
        return self.role.step(horizon)

    # ---- prefill -------------------------------------------------------------------------------
    def prefill_round(self) -> Batch | None:
        """One prefill round. With a prefill delayer its per-pass executor is built
        first and finalized last, on every pass (the cross-rank collective must balance)."""
        chunked = self.chunked_req
        if chunked is not None and chunked.extend_end > chunked.prefix_len:
            self.kv.checkpoint(chunked, chunked.extend_end)
        gate = self.gate_factory(self) if self.gate_factory is not None else None
        batch = self._build_prefill(gate)
        if gate is not None:
            gate.finalize(len(batch.extend) if batch is not None else 0)
        return batch

    def _build_prefill(self, gate: PrefillGate | None) -> Batch | None:
        cfg = self.config
        preemption = cfg.enable_priority_preemption
        if preemption or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        allocatable = self.max_running_requests - len(self.running)
        if allocatable <= 0 and self.chunked_req is None and not preemption:
            self.batch_is_full = True
            return None
        mixed = cfg.enable_mixed_chunk and cfg.chunk_size is not None and bool(self.running)
        adder = self.new_adder(len(self.running) if mixed else 0, gate)
        had_chunked = self.chunked_req is not None
        return self.fill_round(adder, self._plan_round(adder), mixed, had_chunked)

    def fill_round(
        self, adder: PrefillAdder, order: RoundOrder | None, mixed: bool, had_chunked: bool
    ) -> Batch | None:
        """Admit from the round's order (None: no request can be admitted) into the batch."""
        slots = self.max_running_requests - len(self.running) + had_chunked
        admitted = [] if order is None else self._admit(adder, order, slots)
        return self._prefill_batch(adder, admitted, mixed)

    def new_adder(
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
            running_tokens=self.batch.decode_tokens(self.config.clip_max_new_tokens),
            exclusive_chunking=self.policy.chunk_limit is not None,
        )

    def _plan_round(self, adder: PrefillAdder) -> RoundOrder | None:
        """Continue the chunked request, and order the queue unless the continuation spent
        the round's budget (nothing could be admitted). A policy that caps the continuation
        (spf), and SGLang's order of operations, order the queue first."""
        chunked, limit = self.chunked_req, self.policy.chunk_limit
        order = None
        if chunked is not None:
            if self.config.sglang_compat or limit is not None:
                order = self.order_round()
            if limit is not None:
                adder.chunked_req_limit = limit(
                    chunked,
                    self.waiting,
                    adder.rem_chunk_tokens or 0,
                    self.page_size,
                    self.queue.deferred,
                )
            self.chunked_req = adder.add_chunked_req(chunked)
            if order is None and adder.budget_state() is AddReqResult.OTHER:
                return None
        return order if order is not None else self.order_round()

    def order_round(self) -> RoundOrder | None:
        """The round's order (None: no request can be admitted, nothing to order)."""
        return self.queue.begin_round(self.running, self.processed_tokens, self.clock.now())

    def _admit(self, adder: PrefillAdder, order: RoundOrder, slots: int) -> list[int]:
        """The admission loop: requests in the round's order until a budget, the
        request slots (``slots``) or memory ends it. Returns the admitted queue positions; the
        loop edits neither the queue nor its order."""
        preemption = self.config.enable_priority_preemption
        guard = not self.config.sglang_compat and self.cache.supports_prefix_sharing()
        deferred, admitted = self.queue.deferred, []
        i = -1
        while adder.budget_state() is not AddReqResult.OTHER:
            if self.batch_is_full and not preemption:
                break
            i += 1
            pos = order.position(i)
            if pos is None:
                break
            req = self.waiting[pos]
            if req.rid in deferred or (guard and self._recomputes_in_flight(req, adder)):
                continue
            if len(adder.can_run_list) >= slots:
                self.batch_is_full = True
            if self.batch_is_full and (
                not preemption or not adder.preempt_to_schedule(req, self.running)
            ):
                break
            ok, res = self._try_admit(adder, req)
            if ok:
                admitted.append(pos)
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    self.batch_is_full = bool(adder.can_run_list) or bool(self.running)
                break
        return admitted

    def _try_admit(self, adder: PrefillAdder, req: Req) -> tuple[bool, AddReqResult]:
        """(whether ``req`` was admitted, the adder's verdict on the round)."""
        self.match_for_admission(req)
        n = len(adder.can_run_list)
        res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
        if len(adder.can_run_list) == n:
            self.kv.drop_match(req)  # the match was only borrowed for the checks
            return False, res
        self.kv.take_prefix(req)
        return True, res

    def match_for_admission(self, req: Req) -> None:
        self.kv.match_for_admission(req)

    def _recomputes_in_flight(self, req: Req, adder: PrefillAdder) -> bool:
        """Would admitting ``req`` now recompute prompt tokens that a request of this batch
        is computing (a chunked prefix being filled in, or an uncached prefix shared with a
        request admitted a moment ago)? Then it waits one round and reuses them from the
        cache. SGLang admits it and computes the shared tokens twice."""
        batch: list[Admission] = adder.can_run_list
        if not batch:
            return False
        fill = req.fill_ids()
        cap, ns = req.max_prefix_len(len(fill)), req.namespace
        threshold = max(self.config.in_batch_prefix_deprioritize_threshold, 1)
        cached = -1  # the request's cached prefix, matched only when a member needs it
        for a in batch:
            if a.req.namespace != ns:
                continue
            # Tokens ``a`` computes that ``req`` would recompute: [max(cached, prefix), end).
            end = min(cap, a.prefix_len + a.extend_len)
            if end - a.prefix_len < threshold:
                continue
            shared = longest_common_prefix(fill[:end], a.req.fill_ids()[:end])
            if shared - a.prefix_len < threshold:
                continue
            if cached < 0:
                cached = self.cache.match_len(CacheKey(fill[:cap], ns))
            start = max(cached, a.prefix_len)
            if end - start >= threshold and shared - start >= threshold:
                return True
        return False

    def _prefill_batch(self, adder: PrefillAdder, admitted: list[int], mixed: bool) -> Batch | None:
        """The round's batch: admitted requests leave the queue, preempted ones re-enter it."""
        if all(a.extend_len == 0 for a in adder.can_run_list):  # nothing to run (or empty)
            self._requeue(adder.preempt_list)
            return None
        self.queue.take(admitted)
        self._requeue(adder.preempt_list)
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None, "only one chunked request at a time"
            self.chunked_req = adder.new_chunked_req
        entries = self._extend_entries(adder.can_run_list)
        decode = []
        if mixed and self.running and self._decode_fits():
            decode = self.kv.decode_entries(self.running)
        return Batch(entries, decode)

    def _extend_entries(self, run: list[Admission]) -> list[ExtendEntry]:
        return [self._extend(a) for a in run if a.extend_len]

    def _extend(self, a: Admission) -> ExtendEntry:
        r, st = a.req, self.stats
        if r.times.first_scheduled is None:
            r.times.first_scheduled = self.clock.now()
            r.cached_tokens = r.prefix_len + r.host_hit_len
            r.host_cached_tokens = r.host_hit_len
            st.cached_prompt_tokens += min(r.cached_tokens, r.prompt_len)
            st.host_cached_prompt_tokens += min(r.host_hit_len, r.prompt_len)
            st.prompt_tokens += r.prompt_len
        return self.kv.extend_entry(r, a.prefix_len, r.extend_end)

    # ---- decode --------------------------------------------------------------------------------
    def decode_round(self, horizon: float | None = None) -> StepOutcome | None:
        """One decode step of the running batch, retracting requests first if its KV does not
        fit. None when nothing runs."""
        if not self.running:
            if self.is_idle:
                self.ratio.reset()
            return None
        retracted = self._make_room_for_decode()
        if not self.running:
            return StepOutcome("decode", 0.0, 0, num_steps=0, retracted=retracted)
        out = self.run(Batch([], self.kv.decode_entries(self.running)))
        out.retracted = retracted
        return out

    def _room(self) -> int:
        return self.allocator.available_size() + self.cache.evictable_size()

    def _decode_fits(self) -> bool:
        return sum(self.batch.step_need(self.page_size)) <= self._room()

    def _make_room_for_decode(self) -> list[Req]:
        """Retract running requests until the next decode step fits in free + evictable
        memory. A request half-way through a chunked prefill goes first: it holds KV the batch
        needs and has no output (SGLang never considers it and aborts a running request)."""
        if self._decode_fits():
            return []
        retracted = []
        if self.chunked_req is not None:
            retracted.append(self.chunked_req)
            self.chunked_req = None
            self._retract(retracted[-1])
        order = self.batch.retraction_order(
            self.config.retraction_policy, self.config.priority_sign
        )
        first = not retracted and self.config.sglang_compat  # SGLang retracts at least one
        while len(self.running) > 1 and (first or not self._decode_fits()):
            first = False
            victim = order.pop()
            self.batch.remove([victim])
            self._retract(victim)
            retracted.append(victim)
        if not self._decode_fits():
            last = self.running[-1]
            self.batch.remove([last])
            self.kv.release(last, cache_kv=False)
            self._finish_aborted(
                last, 500, "Out of memory even after retracting every other request"
            )
        if retracted:
            self._after_retraction(retracted)
        return retracted

    def _after_retraction(self, retracted: list[Req]) -> None:
        cfg = self.config
        self.stats.retractions += len(retracted)
        n = len(self.running)
        out, most = self.batch.progress()
        est = (out + cfg.retract_decode_steps * n) / (most + 1)
        self.ratio.after_retraction(min(1.0, est))
        self.kv.keep_free(n * cfg.retract_decode_steps)
        self.batch_is_full = False
        self._requeue(retracted)
        logger.debug("retracted %d; new_token_ratio=%.3f", len(retracted), self.ratio.current)

    def _retract(self, req: Req) -> None:
        # radixsched caches the computed KV before releasing it; SGLang drops it.
        self.role.retracting(req)
        self.kv.release(req, cache_kv=not self.config.sglang_compat)
        req.retraction_count += 1

    def _preempt(self, victims: list[Req]) -> None:
        for v in victims:
            self.batch.remove([v])
            self.kv.release(v, cache_kv=not self.config.sglang_compat)
            v.preemption_count += 1
            self.stats.preemptions += 1
        self.kv.keep_free(len(self.running) * self.config.retract_decode_steps)

    # ---- running a batch -----------------------------------------------------------------------
    def run(self, batch: Batch) -> StepOutcome:
        """Run ``batch`` and process its tokens."""
        result = self.runner.forward(batch)
        self.account(batch.batch_size, [result.duration_s])
        self.clock.advance(result.duration_s)
        out = StepOutcome(batch.mode.value, result.duration_s, batch.batch_size)
        self._count_tokens(batch, out)
        now = self.clock.now()
        joined = []
        for e in batch.extend:
            r = e.req
            if not e.produces_token:
                continue  # a middle chunk: checkpointed at the start of the next step
            if r is self.chunked_req:
                self.chunked_req = None
            self._emit(r, result.next_tokens[r.rid], now, out)
            if r.finished:
                self.role.prefilled(r)
            else:
                self.kv.checkpoint(r, r.kv_len)
                joined.append(r)
        finished = []
        for d in batch.decode:
            self._emit(d.req, result.next_tokens[d.req.rid], now, out)
            if d.req.finished:
                finished.append(d.req)
        if finished:  # they leave the running batch, caching their KV
            self.batch.remove(finished)
            self._release_finished(finished)
        self.batch.extend(joined)
        return out

    def _count_tokens(self, batch: Batch, out: StepOutcome) -> None:
        st, fair = self.stats, self.policy.charges_service
        if batch.extend:
            st.prefill_steps += 1
            out.prefill_tokens = n = sum(e.num_new for e in batch.extend)
            self.processed_tokens += n
            for e in batch.extend:
                computed = e.num_new - e.host_load_len
                st.prefill_tokens_computed += computed
                e.req.computed_prefill_tokens += computed
                if fair:
                    self.queue.fair.charge(e.req.tenant_key, computed, 0)
        if batch.decode:
            st.decode_steps += 1
            if not batch.extend:
                self.ratio.decay_steps(1)
            if fair:
                for d in batch.decode:
                    self.queue.fair.charge(d.req.tenant_key, 0, 1)

    def _emit(self, r: Req, tok: int, now: float, out: StepOutcome) -> None:
        r.output_ids.append(tok)
        r.times.token_times.append(now)
        if r.times.first_token is None:
            r.times.first_token = now
        out.new_tokens.append((r, [tok]))
        self.check_finish(r)
        if r.finished:
            out.finished.append(r)

    def check_finish(self, r: Req) -> None:
        s, last = r.sampling, r.output_ids[-1] if r.output_ids else None
        if last is not None and (
            last in s.stop_token_ids or (not s.ignore_eos and last in self.eos_ids)
        ):
            r.finish = FinishState(FinishReason.STOP, matched_token=last)
        elif r.output_len >= s.max_new_tokens:
            r.finish = FINISHED_BY_LENGTH
            if r.output_len > s.max_new_tokens:
                raise IntegrityError(f"{r.rid} produced {r.output_len} > {s.max_new_tokens} tokens")
        if r.finished:
            tt = r.times.token_times
            r.times.finish = tt[-1] if tt else self.clock.now()

    def _release_finished(self, finished: list[Req]) -> None:
        self.batch_is_full = False
        for r in finished:
            self.kv.release(r, cache_kv=True)
            self._forget(r)

    def account(self, batch_size: int, durations: list[float]) -> None:
        """Per-pass statistics, after the forward and before finished requests leave."""
        st = self.stats
        for d in durations:  # pass by pass, so grouped passes round like single ones
            st.busy_s += d
            st.running_x_s += batch_size * d
        st.peak_kv_usage = max(st.peak_kv_usage, self.kv_usage())

    # ==== invariants ===========================================================================
    def holders(self) -> list[Req]:
        chunked = [self.chunked_req] if self.chunked_req is not None else []
        return [*self.running, *chunked, *self.role.holders()]

    def check_integrity(self) -> None:
        """Check the module docstring's ownership rules; raise ``IntegrityError`` with numbers."""
        self.cache.check_integrity()
        holders = self.holders()
        self.allocator.check_integrity(
            cache_slots=self.cache.all_values(), request_slots=self.kv.owned_slots(holders)
        )
        for r in self.waiting:
            if r.lock_node is not None or len(r.kv_row):
                raise IntegrityError(f"waiting request {r.rid} holds a lock or KV slots")
        self.role.check_integrity()
        if not holders and self.cache.protected_size() != 0:
            raise IntegrityError(
                f"idle scheduler but {self.cache.protected_size()} tokens remain locked"
            )
        for r in holders:
            r.check_invariants()


__all__ = ["AdmitResult", "Scheduler", "SchedulerStats", "StepOutcome"]
