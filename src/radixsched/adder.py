"""``PrefillAdder``: decides which waiting requests, and how many tokens of each, go into the
next prefill (extend) batch.

Three budgets gate admission: compute (``rem_input_tokens``: ``--max-prefill-tokens``;
``rem_chunk_tokens``: ``--chunked-prefill-size``, None without chunking); memory
(``rem_total_tokens``: free + evictable KV minus the decode reservations of running and admitted
requests, and ``cur_rem_tokens``: free + evictable minus what this round allocates now, both
*live*: they re-read the allocator and the cache, so locking a prefix or preempting a request
changes them at once); request slots (the scheduler's, and ``--prefill-max-requests``).

Where radixsched deviates from SGLang 0.5.23 (``compat="sglang"`` restores each; ``config.
COMPAT_NOTES`` lists them): symmetric decode reservations (an admitted request reserves what
a running one does), chunked admission by the first chunk (not the whole request),
continuations capped by the memory that exists (both modes), ``--max-prefill-tokens`` enforced
after the first request, the ignore-eos simulation's sorted insert.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from radixsched.cache.base import BasePrefixCache, ceil_page, floor_page
from radixsched.config import SchedulerConfig
from radixsched.policies import prio_value
from radixsched.request import Req

IGNORE_EOS_RESERVE_TOKENS = 1


class AddReqResult(enum.Enum):
    CONTINUE = "continue"  # the next request may be tried
    NO_TOKEN = "no_token"  # out of KV memory: the running batch counts as full
    OTHER = "other"  # stop this round for a non-memory reason


class PrefillGate(Protocol):
    """The prefill delayer's per-pass executor (``cluster.delayer.PrefillDelayerPass``).

    Contract: ``negotiate`` runs the cross-rank collective at most once per pass and returns
    the cached verdict afterwards; ``finalize`` must be called at the end of every pass,
    negotiated or not (it joins the collective for a rank that did not prefill)."""

    def negotiate(self, local_prefillable: bool) -> bool: ...

    def finalize(self, actual_prefill_bs: int) -> object: ...


class FreeSpace(Protocol):
    def available_size(self) -> int: ...


@dataclass(slots=True)
class Admission:
    req: Req
    prefix_len: int
    extend_len: int
    chunked: bool


class PrefillAdder:
    __slots__ = tuple(
        [
            "_ignore_eos_states",
            "allocator",
            "cache",
            "can_run_list",
            "chunked_req_limit",
            "compat",
            "config",
            "current_offset",
            "exclusive_chunking",
            "gate",
            "gate_verdict",
            "log_hit_tokens",
            "log_input_tokens",
            "new_chunked_req",
            "new_token_ratio",
            "page_size",
            "preempt_fn",
            "preempt_list",
            "rem_chunk_tokens",
            "rem_input_tokens",
            "running",
            "total_offset",
        ]
    )

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        cache: BasePrefixCache,
        allocator: FreeSpace,
        running: Sequence[Req],
        new_token_ratio: float,
        num_mixed_decode_tokens: int = 0,
        gate: PrefillGate | None = None,
        preempt_fn: Callable[[list[Req]], None] | None = None,
        running_tokens: tuple[int, int] = (0, 0),
        exclusive_chunking: bool = False,
    ) -> None:
        self.config = config
        self.cache = cache
        self.allocator = allocator
        self.running = running
        self.page_size = config.page_size
        self.new_token_ratio = new_token_ratio
        self.compat = config.sglang_compat
        self.gate = gate
        self.gate_verdict: bool | None = None
        self.preempt_fn = preempt_fn
        # No request starts chunking while a chunked one continues (spf's chunk limit).
        self.exclusive_chunking = exclusive_chunking

        self.rem_input_tokens = config.max_prefill_tokens - num_mixed_decode_tokens
        chunk = config.chunk_size
        self.rem_chunk_tokens: int | None = (
            None if chunk is None else chunk - num_mixed_decode_tokens
        )
        self.total_offset: float = float(num_mixed_decode_tokens)
        self.current_offset: float = float(num_mixed_decode_tokens)
        # Decode reservations of the running batch (``RunningBatch.decode_tokens`` says how).
        full, discounted = running_tokens
        self.total_offset += full + discounted * new_token_ratio

        self.can_run_list: list[Admission] = []
        self.new_chunked_req: Req | None = None
        self.chunked_req_limit: int | None = None
        self.preempt_list: list[Req] = []
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self._ignore_eos_states: list[tuple[float, int]] | None = None

    # ---- budgets -------------------------------------------------------------------------
    def running_reservation(self, r: Req) -> float:
        """Decode tokens a running request may still need (clipped, discounted by the ratio)."""
        ratio = 1.0 if r.sampling.ignore_eos else self.new_token_ratio
        return min(r.remaining_new_tokens, self.config.clip_max_new_tokens) * ratio

    def admission_reservation(self, req: Req) -> float:
        if self.compat:
            return float(min(req.max_new_tokens, self.config.clip_max_new_tokens))
        return self.running_reservation(req)

    @property
    def _available_and_evictable(self) -> int:
        return self.allocator.available_size() + self.cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        return self._available_and_evictable - self.total_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._available_and_evictable - self.current_offset

    def budget_state(self) -> AddReqResult:
        # Both budgets left (total, current), free + evictable read once (every loop turn).
        room = self.allocator.available_size() + self.cache.evictable_size()
        if not (room - self.total_offset > 0 and room - self.current_offset > 0):
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _charge(self, prefix_len: int, extend_len: int, reservation: float) -> None:
        paged = ceil_page(extend_len, self.page_size)
        immediate = paged + self.page_size
        self.total_offset += immediate + reservation
        self.current_offset += immediate
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    def _negotiate(self) -> bool:
        if self.gate is None:
            return True
        if self.gate_verdict is None:
            self.gate_verdict = self.gate.negotiate(True)
        return self.gate_verdict

    # ---- the in-flight chunked request ---------------------------------------------------
    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the chunked request; returns it while still chunked, None when done."""
        assert self.rem_chunk_tokens is not None, "a chunked request needs chunking enabled"
        room = self.allocator.available_size() + self.cache.evictable_size()
        rem = min(self.rem_chunk_tokens, math.floor(room - self.total_offset))
        if rem <= 0:
            rem = self.rem_chunk_tokens  # a continuation always makes progress
        # Never plan more than can be allocated now, in both modes: SGLang's
        # continuation ignores memory and can fail its allocation; reproducing that would
        # crash the loop.
        rem = min(rem, floor_page(math.floor(room - self.current_offset), self.page_size))
        if self.gate is not None:
            self._negotiate()  # the collective must happen; the verdict is ignored mid-chunk
        if self.chunked_req_limit is not None:
            rem = min(rem, self.chunked_req_limit)
        cand = req.fill_len - req.prefix_len
        if rem <= 0:
            # No memory for even one page: the continuation stalls this round and nothing else
            # may be admitted ahead of it (budget_state() now reports NO_TOKEN).
            self.current_offset = float(self._available_and_evictable)
            return req
        truncated = cand > rem
        new_len = min(cand, rem)
        if truncated and new_len < cand:
            # Keep chunk boundaries page-aligned so the checkpoint caches whole pages.
            end = floor_page(req.prefix_len + new_len, self.page_size)
            new_len = max(end - req.prefix_len, 0)
            if new_len == 0:
                self.current_offset = float(self._available_and_evictable)
                return req
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(Admission(req, req.prefix_len, new_len, truncated))
        self._charge(0, new_len, 0.0 if truncated else self.admission_reservation(req))
        return req if truncated else None

    # ---- a new or resumed request --------------------------------------------------------
    def add_one_req(self, req: Req, *, has_chunked_req: bool) -> AddReqResult:
        """Admit ``req`` (already re-matched by the scheduler: prefix_len, last_node set)."""
        cfg = self.config
        if (
            cfg.prefill_max_requests is not None
            and len(self.can_run_list) >= cfg.prefill_max_requests
        ):
            return AddReqResult.OTHER
        if req.sampling.ignore_eos and self.cache.disabled:
            return self._add_one_req_ignore_eos(req, has_chunked_req)

        reservation = self.admission_reservation(req)
        cand = req.fill_len - req.prefix_len
        max_new_check: float
        if self.compat:
            max_new_check = min(req.remaining_new_tokens, cfg.clip_max_new_tokens)
        else:
            max_new_check = reservation
        with _locked(self.cache, req.last_node):
            shape = self._select(req, cand, max_new_check, has_chunked_req)
            if isinstance(shape, AddReqResult):
                return shape
            if not self._negotiate():
                return AddReqResult.OTHER
            extend_len, chunked = shape
            self._take(req, extend_len, chunked, reservation, hit=req.prefix_len)
        return self.budget_state()

    def _take(self, req: Req, extend_len: int, chunked: bool, reservation: float, hit: int) -> None:
        """Admit ``req``: lock its prefix, list it and charge the budgets (``hit`` cached tokens
        logged; a chunk reserves no decode tokens)."""
        req.extend_end = req.prefix_len + extend_len
        req.lock_node = req.last_node
        self.cache.inc_lock_ref(req.lock_node)
        self.can_run_list.append(Admission(req, req.prefix_len, extend_len, chunked))
        if chunked:
            self.new_chunked_req = req
        self._charge(hit, extend_len, 0.0 if chunked else reservation)

    def _select(
        self, req: Req, cand: int, max_new_check: float, has_chunked_req: bool
    ) -> tuple[int, bool] | AddReqResult:
        """The admission's shape (tokens to extend now, whether it chunks), or why not."""
        p = self.page_size
        extend_len = cand
        input_tokens = ceil_page(extend_len, p)
        rem_chunk = self.rem_chunk_tokens
        if rem_chunk is not None and not self.compat and self.can_run_list:
            rem_chunk = min(rem_chunk, self.rem_input_tokens)

        will_chunk = rem_chunk is not None and input_tokens > rem_chunk
        if self.compat or not will_chunk:
            total_tokens = cand + max_new_check + p
        else:
            assert rem_chunk is not None
            total_tokens = floor_page(rem_chunk, p) + max_new_check + p
        if not total_tokens < self.rem_total_tokens:
            return AddReqResult.NO_TOKEN

        if rem_chunk is None:
            if self.can_run_list and input_tokens >= self.rem_input_tokens:
                return AddReqResult.OTHER
            return extend_len, False
        if not will_chunk:
            return extend_len, False
        if has_chunked_req and self.exclusive_chunking:
            return AddReqResult.OTHER
        if self.new_chunked_req is not None:
            return AddReqResult.OTHER  # one chunked request at a time
        chunk = floor_page(rem_chunk, p)
        end = floor_page(req.prefix_len + chunk, p)
        chunk = end - req.prefix_len
        if chunk <= 0:
            return AddReqResult.OTHER
        return chunk, True

    # ---- ignore_eos with the cache disabled ------------------------------------------------
    def _add_one_req_ignore_eos(self, req: Req, has_chunked_req: bool) -> AddReqResult:
        p = self.page_size
        cand = req.fill_len - req.prefix_len
        paged_input = ceil_page(cand, p) + p
        if paged_input > min(self.cur_rem_tokens, self.rem_total_tokens):
            return AddReqResult.NO_TOKEN

        def state_of(r: Req) -> tuple[float, int]:
            ratio = 1.0 if r.sampling.ignore_eos else self.new_token_ratio
            return (r.max_new_tokens * ratio - r.output_len, r.fill_len)

        new_state = state_of(req)
        if self._ignore_eos_states is None:
            pool = [req, *self.running, *(a.req for a in self.can_run_list)]
            self._ignore_eos_states = sorted(
                (s for s in map(state_of, pool) if s[0] > 0), key=lambda s: s[0]
            )
        elif new_state[0] > 0:
            states = self._ignore_eos_states
            keys = [s[0] for s in states]
            idx = bisect.bisect_left(keys, new_state[0])
            if self.compat and idx == len(states) and states:
                idx = len(states) - 1  # SGLang's off-by-one: before the last
            states.insert(idx, new_state)
        cur = self.cur_rem_tokens - paged_input
        freed = 0.0
        states = self._ignore_eos_states
        for i, (tokens_left, occupied) in enumerate(states):
            bs = len(states) - i
            if cur + freed - tokens_left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return AddReqResult.NO_TOKEN
            freed += occupied
        if not self._negotiate():
            return AddReqResult.OTHER
        rem_chunk = self.rem_chunk_tokens
        reservation = float(min(req.max_new_tokens, self.config.clip_max_new_tokens))
        if rem_chunk is None or cand <= rem_chunk:
            self._take(req, cand, False, reservation, hit=0)
        else:
            # One chunked request: a continuation cut to pages or memory can leave chunk budget.
            if rem_chunk <= 0 or self.new_chunked_req is not None or has_chunked_req:
                return AddReqResult.OTHER
            trunc = floor_page(rem_chunk, p) if not self.compat else rem_chunk
            if trunc <= 0:
                return AddReqResult.OTHER
            self._take(req, trunc, True, 0.0, hit=0)
        return self.budget_state()

    # ---- priority preemption --------------------------------------------------------------
    def preempt_to_schedule(self, req: Req, running: list[Req]) -> bool:
        """Pick running victims less important than ``req`` by more than the threshold."""
        cfg = self.config
        sign = cfg.priority_sign
        admitted = {id(a.req) for a in self.can_run_list}
        cands = [
            r
            for r in running
            if not r.finished and r not in self.preempt_list and id(r) not in admitted
        ]
        cands.sort(key=lambda r: (prio_value(r, sign) * -sign, -r.queue_entry_time))
        need = (
            (req.fill_len - req.prefix_len)
            + min(req.max_new_tokens, cfg.clip_max_new_tokens)
            - self.rem_total_tokens
        )
        victims: list[Req] = []
        req_p = prio_value(req, sign)
        for c in cands:
            diff = (req_p - prio_value(c, sign)) * -sign
            if diff > cfg.priority_scheduling_preemption_threshold:
                victims.append(c)
                need -= self.running_reservation(c)
                if need <= 0:
                    break
            else:
                break
        if not victims or need > 0:
            return False
        for v in victims:
            self.total_offset -= self.running_reservation(v)
        assert self.preempt_fn is not None, "preemption needs the scheduler's release callback"
        self.preempt_fn(victims)
        self.preempt_list.extend(victims)
        return True


@contextmanager
def _locked(cache: BasePrefixCache, node: Any) -> Iterator[None]:
    """Lock ``node`` during the admission checks: the request's own prefix is not evictable."""
    if node is not None:
        cache.inc_lock_ref(node)
    try:
        yield
    finally:
        if node is not None:
            cache.dec_lock_ref(node)
