"""``NativeScheduler``: the reference ``Scheduler`` with accelerators, for the simulator.

Chosen when the scheduler is built (``radixsched.native.build.build_scheduler``), never rewired. Each
override gives exactly the reference's schedule (tests/test_equivalence.py, bit for bit):

- the waiting queue is a ``NativeWaitingQueue`` (incremental matching, dedup and kept orders);
- decode runs on the running batch's native columns (``_core.DecodeBatch``,
  ``radixsched/_native/decode.cpp``) and jumps over the steps in which nothing but lengths can
  change (no admission possible, no stop token, enough memory, before the next external
  event): one native call (``DecodeBatch.jump_round``) finds the steps, times them (the
  roofline's decode step in C++ where the runner offers it, ``_core.DecodeCost``), reserves
  their slots, advances the columns and does the round's bookkeeping (clock, ratio,
  statistics, outcome, the finished requests' retire); the requests' tokens, token times and
  KV slots are written when they leave the batch or are read (deferred state);
- an extend-only step runs in one native call (``_core.PrefillRun``, ``_native/prefill.cpp``:
  its time on the dense roofline, the statistics, the clock, the stand-in tokens, the
  checkpoints) where the runner offers native prefill times and tokens and nothing in the
  batch needs Python (stop ids, scripts, host loads, tenant charges); decided per step;
- where the run's setup allows it (``_direct``), a prefill step goes through ``native/step.py``:
  no ``PrefillAdder`` for a fresh round, the chunked request's continuation planned in one
  native call (``PrefillRun.continuation``), the admission in one (``Adder.round``), and the
  admitted requests' slots with the step in one (``PrefillRun.extend_run``, no entries built);
- a middle chunk of a chunked prefill that fills the round's budget runs as the step alone,
  and the next ones back to back up to the next event, where no round between could do
  anything else: where the prefill step is native, the whole run in one native call
  (``PrefillRun.chunks``, ``_native/chunks.hpp``: checkpoint, budgets, chunk, clock, again);
  decided per step, from the runner and the gates actually present.

Deferred state invariant: while ``unsettled``, the batch's columns are ahead of its requests by
whole decode steps, the last entries of the columns' log (the end time of each deferred step),
and the slots they are owed are exactly the allocator's reservation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from radixsched.adder import AddReqResult, Admission, PrefillAdder
from radixsched.cache.base import IntegrityError
from radixsched.clock import VirtualClock
from radixsched.native import admit as admission
from radixsched.native import core
from radixsched.native import radix as native_radix
from radixsched.native import step as steps
from radixsched.native.kv import NativeKVManager
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.retire import reference_hooks, retire
from radixsched.native.runner import MultiStepRunner
from radixsched.queue import RoundOrder
from radixsched.ratio import NewTokenRatioTracker
from radixsched.request import FINISHED_BY_LENGTH, Req
from radixsched.roles import Role
from radixsched.runner import Batch, ExtendEntry
from radixsched.running import RunningBatch, retraction_order
from radixsched.scheduler import Scheduler, StepOutcome

# ``native/retire.py``'s ``retire`` as imported: a jump retires natively while the module's
# ``retire`` is still it (``DecodeRun``; a test may replace it to count its calls).
_NATIVE_RETIRE = retire

# What a native prefill step needs (``PrefillRun.run``): step timer, stand-ins' hashes, vocabulary.
NativeStep = tuple[Any, Mapping[str, int], int]


class ChunkPlan(NamedTuple):
    """A step opened by continuing the chunked request."""

    adder: PrefillAdder
    still_chunked: Req | None  # None when this is the last chunk
    req: Req

    @property
    def is_middle(self) -> bool:
        """A middle chunk that fills the round's budget: the round then orders no queue,
        admits nothing and runs no decode, so the step is the chunk alone."""
        return (
            self.still_chunked is not None
            and bool(self.adder.can_run_list)
            and self.adder.budget_state() is AddReqResult.OTHER
        )


@dataclass(slots=True)
class JumpOutcome(StepOutcome):
    """A decode jump's outcome: its tokens are paired with their requests only when read.
    ``pending``: (requests, tokens) of eager steps, or (requests, runner, fills before, steps)
    of a jump, whose tokens are asked of the runner then (``_jump_tokens``). A tuple, not a
    closure: one object a round, where a closure's cells and function were six."""

    pending: tuple[Any, ...] | None = field(default=None, repr=False)

    @property
    def new_tokens(self) -> list[tuple[Req, list[int]]]:
        p = self.pending
        if p is not None:
            self.pending = None
            reqs = p[0]
            toks = p[1] if len(p) == 2 else _jump_tokens(p[1], reqs, p[2], p[3])
            self._tokens.extend(zip(reqs, toks, strict=True))
        return self._tokens


# ``JumpOutcome``'s fields as ``DecodeRun.make_outcome`` sets them: (name, default, factory).
_NONE = dataclasses.MISSING
_OUTCOME_FIELDS = (
    *(("mode", _NONE, _NONE), ("duration_s", _NONE, _NONE), ("batch_size", _NONE, _NONE)),
    *(("num_steps", 1, _NONE), ("prefill_tokens", 0, _NONE), ("finished", _NONE, list)),
    *(("retracted", _NONE, list), ("_tokens", _NONE, list), ("pending", None, _NONE)),
)


def _plain_outcome(cls: type) -> bool:
    """Whether ``cls("decode", d, n, k)`` is what ``DecodeRun.make_outcome`` builds without
    calling it: a slots dataclass with exactly ``_OUTCOME_FIELDS`` (no pseudo-field), its
    generated ``__init__``, no ``__post_init__``, ``object``'s ``__new__``."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        return False
    got = tuple((f.name, f.default, f.default_factory) for f in dataclasses.fields(cls))
    params: Any = getattr(cls, "__dataclass_params__", None)
    return (
        got == _OUTCOME_FIELDS
        and len(getattr(cls, "__dataclass_fields__", ())) == len(got)
        and bool(params is not None and params.init)
        and not hasattr(cls, "__post_init__")
        and cls.__new__ is object.__new__
    )


def decode_batch(reqs: list[Req], has_eos: bool) -> Any:
    """The native columns (``_core.DecodeBatch``) of ``reqs`` as their state gives them."""
    cols = cast(Any, core()).DecodeBatch(has_eos)
    cols.extend(reqs)
    return cols


class NativeRunningBatch(RunningBatch):
    """The running batch with its native columns (``cols``, None until a decode step builds
    them). Invariant: ``cols`` is None or lists exactly ``reqs``, in order, with their lengths
    as the requests will have them once settled."""

    def __init__(self, has_eos: bool, settle: Callable[[list[int]], None]) -> None:
        """``has_eos``: the model has EOS tokens; ``settle(rows)`` writes those rows' deferred
        decode state into their requests (``NativeScheduler.settle``)."""
        super().__init__()
        self.has_eos, self.settle = has_eos, settle
        self.cols: Any = None

    def columns(self) -> Any:
        if self.cols is None:
            self.cols = decode_batch(self.reqs, self.has_eos)
        return self.cols

    def extend(self, reqs: list[Req]) -> None:
        self.reqs.extend(reqs)  # ``RunningBatch.extend``, without its call
        if self.cols is not None and reqs:
            self.cols.extend(reqs)

    def remove(self, reqs: list[Req]) -> None:
        """Requests leave; their deferred state is written first, the survivors keep theirs."""
        if not reqs:
            return
        if self.cols is not None:
            rows = self.cols.positions_of(reqs)
            self.settle(rows)
            self.cols.remove_at(rows)
        super().remove(reqs)

    def remove_at(self, positions: list[int]) -> None:
        """Remove the (settled) requests at ``positions`` (ascending)."""
        for i in reversed(positions):
            del self.reqs[i]
        if self.cols is not None:
            self.cols.remove_at(positions)

    def decode_tokens(self, clip: int) -> tuple[int, int]:
        cols = self.cols
        if cols is None:  # built only for rows (columns of no rows sum to (0, 0) too)
            if not self.reqs:
                return (0, 0)
            cols = self.columns()
        # A clip past int64 clips nothing (each row's tokens to go are int64): min(clip, max)
        # without its call.
        got: tuple[int, int] = cols.decode_tokens(clip if clip <= _INT64_MAX else _INT64_MAX)
        return got

    def progress(self) -> tuple[int, int]:
        return cast(tuple[int, int], self.columns().progress()) if self.reqs else (0, 0)

    def retraction_order(self, policy: str, sign: int) -> list[Req]:
        """The reference's order sorted natively (``DecodeBatch.retraction_order``), or in
        Python where the columns decline (a priority past int64, a policy they do not know)."""
        got: list[Req] | None = self.columns().retraction_order(policy, sign) if self.reqs else None
        if got is None:  # no rows, a priority past int64 or a policy the columns do not know
            out = self.columns().out_len.tolist() if self.reqs else []
            got = retraction_order(self.reqs, out, policy, sign)
        return got

    def step_need(self, page: int) -> list[int]:
        return cast(list[int], self.columns().need(1, page)) if self.reqs else []


class NativeScheduler(Scheduler):
    cache_factory = staticmethod(native_radix.make_cache)
    kv_class = NativeKVManager
    queue_class = NativeWaitingQueue
    queue: NativeWaitingQueue
    batch: NativeRunningBatch
    kv: NativeKVManager

    def pool_factory(self, size: int, page: int) -> Any:
        """The native pool made at once (not a TokenAllocator's pages, 40 MB for a B200's,
        first); counting, with no slot ids, where the runner reads none."""
        return native_radix.make_pool(size, page, not getattr(self.runner, "reads_kv_slots", True))

    @property
    def allocator(self) -> Any:
        """The native slot pool (``native_radix.make_pool``): ``TokenAllocator``'s interface
        and free list, in C++."""
        return self._pool

    @allocator.setter
    def allocator(self, alloc: Any) -> None:  # (the reference's __init__ sets pool_factory's)
        self._pool = alloc

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.native_adder = admission.native_adder(self)  # the admission loop's, in C++
        cfg = self.config
        # Deferral needs nothing to read running requests mid-flight: priority preemption and
        # mixed chunks do, and so does the ignore-eos admission of a disabled cache (a decode
        # instance's cache is off, but it admits nothing: its preallocation counts requests).
        admits = self.cache.disabled and self.role.prefills
        self.defers = not (cfg.enable_priority_preemption or cfg.enable_mixed_chunk or admits)
        self.unsettled = False
        # The native prefill step (``run``) over the pool, the tree and the KV checkpoint. Set
        # here, not on first use: a cached_property writes through the instance's __dict__,
        # which CPython 3.11 then materializes, and every ``self.x`` read gets slower.
        self.prefill_run = cast(Any, core()).PrefillRun(
            self.allocator, self.kv.cache.tree.evictable_size, self.capacity, self.kv.checkpoint
        )
        # The pool's and the tree's counters, bound once (``_room`` runs several times a step).
        self._free_size = self._pool.available_size
        self._evictable_size = self.kv.cache.tree.evictable_size
        fresh = self._fresh_ok()
        self._fusion = fresh and self.policy.chunk_limit is None  # the policy is frozen
        # ``_native_chunks``'s test: more left than this (None: no chunking) may be a middle
        # chunk (the config is frozen).
        self._chunk = chunk = cfg.chunk_size
        self._middle_least = (
            None if chunk is None else min(chunk, cfg.max_prefill_tokens) - cfg.page_size
        )
        # ``_native_step``'s tests that hold for the whole run (the KV manager's host tier, the
        # frozen policy, the clock and the runner are set once); the runner's timer and
        # stand-ins' recipe can change (a cost model or seed reassigned) and are asked each time.
        # A charging policy's prefill steps run natively too, its tenants charged after
        # (``_charge_prefill``); its runs of middle chunks do not (each chunk charges).
        self._charges = self.policy.charges_service  # the policy is frozen
        self._repeat_add = cast(Any, core()).repeat_add  # ``_charge_decode``'s sums
        self._tenant_counts = cast(Any, core()).tenant_counts  # its Counter of tenants
        self._decay_ratio = cast(Any, core()).decay_ratio  # ``_decay``'s steps
        # ``_jump``'s native round: what it holds for the run (the pool, the tree's and the
        # cache's bound methods, the capacity and page, the classes it builds or compares, the
        # setup's ``defers`` and preemption) and what this class leaves to its Python
        # (``_may_jump``, ``_decay`` or ``_retire_finished`` overridden, fair's charge), asked
        # once: the config is frozen, the class, its hooks and the policy are fixed.
        cls = type(self)
        self._decode_run = cast(Any, core()).DecodeRun(
            self._pool,
            self._evictable_size,
            _evictor(self.cache),
            self.capacity,
            self.page_size,
            VirtualClock,
            NewTokenRatioTracker,
            JumpOutcome,
            FINISHED_BY_LENGTH,
            globals(),  # its ``retire``, looked up when a jump retires (as ``_retire_finished``)
            _NATIVE_RETIRE,
            _plain_outcome(JumpOutcome),
            self.defers,
            cfg.enable_priority_preemption,
            self._charges,
            cls._may_jump is NativeScheduler._may_jump,
            cls._decay is NativeScheduler._decay,
            cls._retire_finished is NativeScheduler._retire_finished and reference_hooks(self),
        )
        self._native_steps = (
            self.kv.host_tier is None
            and type(self.clock) is VirtualClock
            and self.runner.supports_multi_step
        )
        # A prefill step in few calls (``native/step.py``), where the run's setup allows it: a
        # fresh one (no chunked request: a chunk limit reads none) and a continued one.
        self._fresh_direct = fresh and self._steps_direct()
        self._direct = self._fusion and self._fresh_direct

    def _steps_direct(self) -> bool:
        """Whether ``native.step`` may run this scheduler's prefill steps: the reference's step
        pieces as defined here (a subclass or role that overrides one keeps them), and the
        native admission's setup (``admission.covers_run``)."""
        cls = type(self)
        pieces = (
            *("prefill_round", "_build_prefill", "new_adder", "fill_round", "_admit"),
            *("_prefill_batch", "_extend_entries", "run", "_requeue", "order_round", "running"),
        )
        return (
            type(self.role).step is Role.step
            and all(getattr(cls, p) is getattr(NativeScheduler, p) for p in pieces)
            and admission.covers_run(self)
        )

    def _make_running(self) -> NativeRunningBatch:
        return NativeRunningBatch(bool(self.eos_ids), self.settle)

    @property
    def jumper(self) -> MultiStepRunner:
        """The runner, read as a multi-step one where ``supports_multi_step`` says it is."""
        return cast(MultiStepRunner, self.runner)

    # ---- deferred decode state ------------------------------------------------------------------
    def settle(self, rows: list[int]) -> None:
        """Write the deferred decode steps of the batch's ``rows`` (ascending) into their
        requests, natively (``DecodeBatch.settle``): tokens (a plain request's stand-ins
        computed there, the others asked of the runner again, once per distinct number owed:
        they depend only on request and position), token times (the last entries of the
        columns' log), ``kv_len`` and their reserved slots, claimed in row
        order. Nothing is owed unless ``unsettled``."""
        cols = self.batch.cols
        if self.unsettled and cols is not None and rows:
            runner = self.jumper
            cols.settle(rows, runner.tokens_at, runner.native_tokens(), self.allocator)

    def sync_running(self) -> None:
        if self.unsettled:
            cols = self.batch.columns()
            self.settle(list(range(len(cols))))
            cols.clear_log()  # nothing is owed any more
            self.unsettled = False

    def _running_changed(self) -> None:
        """Someone is about to read or write running requests directly."""
        self.sync_running()
        self.batch.cols = None

    def decode_tokens_to_go(self) -> list[int]:
        if not self.running:
            return []
        return cast(list[int], self.batch.columns().to_go())

    def abort(self, rid: str, message: str = "aborted by client", status_code: int = 499) -> bool:
        self._running_changed()
        return super().abort(rid, message, status_code)

    def discard(self, req: Req, status_code: int, message: str) -> None:
        self._running_changed()
        super().discard(req, status_code, message)

    # ---- prefill --------------------------------------------------------------------------------
    def match_for_admission(self, req: Req) -> None:
        """The reference's admission match, from the matcher's memo when it is current (the
        walk's side effects, without the walk)."""
        end = self.queue.admission_end(req)
        if end is None:
            super().match_for_admission(req)
            return
        node, offset, length = end
        assert self.queue.matcher is not None
        last = self.queue.matcher.cache.touch_at(node, offset)
        self.kv.borrow(req, self.kv.admission_key(req), length, last)

    def _admit(
        self, adder: PrefillAdder | admission.Budgets, order: RoundOrder, slots: int
    ) -> list[int]:
        """The admission loop in C++ where it covers the round (``native/admit.py``; a round of
        ``Budgets`` only, ``native/step.py``)."""
        if admission.covers(self, adder):
            return admission.admit(self, adder, order, slots)
        assert isinstance(adder, PrefillAdder), "the reference loop runs on a PrefillAdder"
        return super()._admit(adder, order, slots)

    def _try_admit(self, adder: PrefillAdder, req: Req) -> tuple[bool, AddReqResult]:
        ok, res = super()._try_admit(adder, req)
        if not ok:
            self.queue.note_tried(req)  # its matched length is the admission's now
        return ok, res

    def _extend_entries(self, run: list[Admission]) -> list[ExtendEntry]:
        """The reference's (``_extend``: first-schedule stamps and stats, rows and slots) in one
        native call (``KV.extend_batch``) where no host tier loads prefixes back."""
        if self.kv.host_tier is not None:
            return super()._extend_entries(run)
        entries, cached, host, prompt = self.kv.native.extend_batch(run, self.clock.now)
        st = self.stats
        st.cached_prompt_tokens += cached
        st.host_cached_prompt_tokens += host
        st.prompt_tokens += prompt
        return cast(list[ExtendEntry], entries)

    def run(self, batch: Batch) -> StepOutcome:
        """The reference's; an extend-only step in one native call (``_core.PrefillRun``: the
        step's time, statistics, clock, stand-in tokens and checkpoints) where
        ``_native_prefill`` offers it and the call does not decline (it then changed nothing)."""
        native = self._native_prefill(batch)
        if native is not None:
            res = self.prefill_run.run(batch.extend, *native, self, self.clock.now())
            if res is not None:
                d, n, tokens, finished, joined = res
                if self._charges:
                    self._charge_prefill([(e.req, e.num_new) for e in batch.extend])
                self.batch.extend(joined)
                size = len(batch.extend)
                return StepOutcome("extend", d, size, 1, n, finished, [], tokens)  # (positional)
        if batch.decode:  # a mixed batch grew the running requests' rows
            self._running_changed()
        return super().run(batch)

    def _charge_prefill(self, done: list[tuple[Req, int]]) -> None:
        """A native prefill step's tenants charged for its (request, tokens computed) in batch
        order, as the reference's ``_count_tokens`` does (no host tier on the native path: no
        token is loaded back)."""
        charge = self.queue.fair.charge
        for r, n in done:
            charge(r.tenant_key, n, 0)

    def _native_prefill(self, batch: Batch) -> NativeStep | None:
        """(step timer, stand-ins' hashes, vocabulary) where the step can run natively: an
        extend-only batch, no EOS ids, and what ``_native_step`` asks."""
        if batch.decode or self.eos_ids:
            return None
        return self._native_step()

    def _native_step(self) -> NativeStep | None:
        """``_native_prefill``'s answer for a step whose entries produce no token (EOS ids
        then matter not): no host tier, no tenant to charge, virtual time, and a runner with
        native prefill times and tokens."""
        if not self._native_steps:
            return None
        runner: Any = self.runner  # multi-step (``_native_steps``): ``jumper`` without its calls
        got: NativeStep | None = runner.native_step()
        return got

    def _finish_prefill(self, r: Req) -> bool:
        """``r`` reached its ``max_new_tokens`` in a native prefill step: the reference's
        finish check and, finished, the role's hand-off (``Scheduler.run``)."""
        self.check_finish(r)
        if r.finished:
            self.role.prefilled(r)
        return r.finished

    # ---- middle chunks --------------------------------------------------------------------------
    def _fresh_ok(self) -> bool:
        """Whether a step's round may run on ``native.step``'s budgets (and one that continues a
        chunked request fuse its middle chunks, where no chunk limit applies): fixed for the
        run (the config is frozen, the runner and the gate are set once), so ``__init__`` asks
        it once (``_fresh_direct``, ``_fusion``)."""
        cfg = self.config
        return (
            self.gate_factory is None
            and self.runner.supports_multi_step
            and not cfg.enable_mixed_chunk
            and not cfg.enable_priority_preemption
            and not cfg.sglang_compat
        )

    def _room(self) -> int:
        return cast(int, self._free_size() + self._evictable_size())

    def step(self, horizon: float | None = None) -> StepOutcome | None:
        req = self.chunked_req
        if req is None:
            if not self._fresh_direct:
                return super().step(horizon)
            st, waiting = self.stats, len(self.queue.reqs)
            if waiting > st.peak_waiting:  # max(peak, waiting): ints, the same value
                st.peak_waiting = waiting
            return steps.fresh(self, horizon)
        if not self._fusion and not self._fresh_direct:
            return super().step(horizon)
        st, waiting = self.stats, len(self.queue.reqs)
        if waiting > st.peak_waiting:
            st.peak_waiting = waiting
        if not self._fusion:  # a chunk limit (spf): the queue ordered first, then the cap
            return steps.limited(self, req, horizon)
        # A middle chunk (from extend_end, where the checkpoint leaves prefix_len) is cut
        # short of what is left (new_len < left) and spends the chunk or the prefill budget
        # (ceil_page(new_len) >= the smaller, so new_len > the smaller - page): with no more
        # left than that the continuation is not one (a last chunk: the common case), and
        # Python plans it without ``_native_chunks``. Only speed depends on this test (what is
        # left: fill_len - extend_end, fill_len read without its property call).
        least, out = self._middle_least, None
        if least is not None and len(req.prompt_ids) + len(req.output_ids) - req.extend_end > least:
            out = StepOutcome("extend", 0.0, 1, 0)
            if self._native_chunks(horizon, out):
                return out
        if self._direct and (out is None or not out.num_steps):  # natively, unless a middle one
            got = steps.continuation(self, req)  # (``_continue_chunked`` first, there)
            if got is not None:
                budgets, self.chunked_req, other = got
                # ``order_round`` (the reference's: ``_direct``), without its calls
                q, now = self.queue, self.clock.now()
                order = (
                    None if other else q.begin_round(self.batch.reqs, self.processed_tokens, now)
                )
                return steps.continued(self, budgets, order, horizon, True)  # covered
            plan = self._adder_plan(req)
        else:
            plan = self._plan_continuation()
        # A run of middle chunks: none ran natively and this is one, or the native run stopped
        # inside the run (past its horizon check) and Python goes on where it stopped.
        if out is None:
            out = StepOutcome("extend", 0.0, 1, 0)
        if plan.is_middle or out.num_steps:
            while plan.is_middle:
                self._run_chunk(plan, out)
                if not (horizon is not None and self.clock.now() < horizon and self.chunked_req):
                    return out
                plan = self._plan_continuation()
            plan.req.extend_end = plan.req.prefix_len  # not a middle chunk: the next step plans it
            return out
        self.chunked_req = plan.still_chunked
        adder = plan.adder
        order = None if adder.budget_state() is AddReqResult.OTHER else self.order_round()
        if self._direct:
            return steps.continued(self, adder, order, horizon)
        batch = self.fill_round(adder, order, False, True)
        return self.run(batch) if batch is not None else self.decode_round(horizon)

    def _native_chunks(self, horizon: float | None, out: StepOutcome) -> bool:
        """The run of middle chunks that opens the step, in one native call where the step's
        prefill is native (``_native_step``) and the continuation may be a middle chunk
        (``PrefillRun.chunks``, ``_native/chunks.hpp``: what ``_plan_continuation``,
        ``ChunkPlan.is_middle`` and ``_run_chunk`` do, chunk after chunk up to the horizon),
        its time, last chunk's tokens and count written into ``out``. True: the step is over;
        False: the continuation (checkpointed or not, nothing else changed) is Python's to
        plan. The adder's inputs are read once: no middle chunk changes the running batch or
        the new-token ratio. Called only where more is left than ``_middle_least`` (``step``)."""
        req = self.chunked_req
        assert req is not None
        native = self._native_step()
        if native is None:
            return False
        if not self.batch.reqs:
            self.batch_is_full = False
        cfg, chunk = self.config, self._chunk
        assert chunk is not None  # ``step`` asks only where ``_middle_least`` is not None
        full, discounted = self.batch.decode_tokens(cfg.clip_max_new_tokens)
        charges: list[tuple[Req, int]] | None = [] if self._charges else None
        done: bool
        done, out.duration_s, out.prefill_tokens, out.num_steps = self.prefill_run.chunks(
            self.kv.native,
            req,
            native[0],
            self,
            horizon,
            cfg.page_size,
            cfg.max_prefill_tokens,
            chunk,
            full,
            discounted,
            self.ratio.current,
            charges,
        )
        if charges:  # each chunk's tokens, charged in order
            self._charge_prefill(charges)
        return done  # (annotated: no ``cast`` call)

    def _plan_continuation(self) -> ChunkPlan:
        """What ``prefill_round`` does up to the continuation (no gate: fusion needs none)."""
        return self._adder_plan(self._continue_chunked())

    def _continue_chunked(self) -> Req:
        """``prefill_round`` up to the round's adder: the chunked request's last chunk
        checkpointed."""
        req = self.chunked_req
        assert req is not None
        if req.extend_end > req.prefix_len:
            self.kv.checkpoint(req, req.extend_end)
        if not self.batch.reqs:
            self.batch_is_full = False
        return req

    def _adder_plan(self, req: Req) -> ChunkPlan:
        """The round's adder with the chunked request ``req`` continued into it."""
        adder = self.new_adder()
        return ChunkPlan(adder, adder.add_chunked_req(req), req)

    def _run_chunk(self, plan: ChunkPlan, out: StepOutcome) -> None:
        """A middle chunk exactly as a step whose batch is that chunk alone, added to ``out``,
        in Python (a native step runs it in ``_native_chunks``)."""
        req = plan.req
        entry = self.kv.extend_entry(req, req.prefix_len, req.extend_end)
        batch = Batch([entry], [])
        result = self.runner.forward(batch)
        d = result.duration_s
        self.account(1, [d])
        self.clock.advance(d)
        self._count_tokens(batch, out)
        out.duration_s += d
        out.num_steps += 1

    # ---- decode ---------------------------------------------------------------------------------
    def decode_round(self, horizon: float | None = None) -> StepOutcome | None:
        if not self.runner.supports_multi_step:  # one step at a time, on the requests
            self._running_changed()
            return super().decode_round(horizon)
        batch = self.batch
        if not batch.reqs:
            if self.is_idle:
                self.ratio.reset()
            return None
        cols = batch.cols if batch.cols is not None else batch.columns()  # (without its call)
        # The common case, one native call: ``_jump(cols, self._may_jump(), horizon)`` where
        # ``self.defers and not cols.can_stop`` (tested there first, ``_may_jump`` asked there).
        jumped = self._jump(cols, None, horizon)
        if jumped is not None:
            return jumped
        retracted = self._make_room_for_decode()
        if not self.batch.reqs:
            return StepOutcome("decode", 0.0, 0, num_steps=0, retracted=retracted)
        cols = self.batch.columns()
        free = not retracted and self._may_jump()
        out: StepOutcome | None
        if self.defers and not cols.can_stop:
            out = self._jump(cols, free, horizon)
            assert out is not None, "a decode step fits once room is made"
        else:
            t0 = self.clock.now()
            k = cols.steps(free, self._room(), self.page_size, t0, horizon, self._step_timer())
            out = self._decode_eager(k, cols)
        out.retracted = retracted
        return out

    def _decode_fits(self) -> bool:
        """The reference's test (the next step's slots fit in free + evictable memory), summed
        natively."""
        need = self.batch.columns().need_total(1, self.page_size) if self.running else 0
        return bool(need <= self._room())

    def _may_jump(self) -> bool:
        """Nothing but lengths can change over several decode steps: no chunked request and no
        prefill possible (an empty queue, or a full batch without preemption). The columns add
        the rest (``DecodeBatch.steps``): no stop token that could end a request early, enough
        memory for every step, and the jump ends with the step that reaches the horizon (the
        next arrival), queue or not: whoever looks at the scheduler then (a router reading each
        replica's load) sees what single steps leave."""
        if self.chunked_req is not None:
            return False
        return not self.queue.reqs or (
            self.batch_is_full and not self.config.enable_priority_preemption
        )

    def _step_timer(self) -> Any:
        """What times decode steps: the runner's native ``DecodeCost`` where it has one, else
        the runner itself (``decode_durations``)."""
        runner = self.jumper
        native = runner.native_decode_cost()
        return runner if native is None else native

    def _jump(self, cols: Any, free: bool | None, horizon: float | None) -> JumpOutcome | None:
        """Deferred decode steps as that many reference decode rounds, in one native call
        (``DecodeBatch.jump_round``, ``_native/decode.cpp``): how many, their times, their slots
        reserved, the log and the columns advanced (``DecodeBatch.jump``), then the clock, the
        ratio (``_decay``), the statistics, the outcome, the tenants' charge
        (``_charge_decode``) and the finished rows retired (``_retire_finished``'s, natively
        where ``native/retire.py`` covers them), each as this class's Python did it, in its
        order. None, nothing changed, where the scheduler does not defer or a row can stop
        (``decode_round`` decides) or one step does not fit (room must be made first);
        ``_alloc_failed`` raised when the reservation fails. ``free``: ``_may_jump()``'s
        answer; None: asked in the call (natively where this class's is NativeScheduler's)."""
        got: JumpOutcome | None = cols.jump_round(self._decode_run, self, free, horizon)
        return got

    def _decay(self, k: int) -> None:
        """``ratio.decay_steps(k)``: natively (the same float steps, ``_core.decay_ratio``)
        where the tracker is the reference's and its values are floats."""
        r = self.ratio
        cur, dec, lo = r.current, r.decay, r.min
        if type(r) is NewTokenRatioTracker and type(cur) is type(dec) is type(lo) is float:
            r.current = self._decay_ratio(cur, dec, lo, k)
        else:
            r.decay_steps(k)

    def _decode_eager(self, k: int, cols: Any) -> StepOutcome:
        """``k`` decode steps of the running batch written into the requests now (a request
        that can stop, or a configuration that reads running requests mid-flight)."""
        reqs, fill0 = list(self.running), cols.fill  # before the steps: the outcome's tokens
        self.sync_running()
        res = self.jumper.decode_multi(reqs, fill0, k)
        durations, toks = res.step_durations_s, res.tokens.tolist()
        needs = cols.need(k, self.page_size)
        total = sum(needs)
        slots = self.kv.alloc(total) if total else None
        t0 = self.clock.now()
        ends = _step_ends(t0, durations)
        self._advance_to(float(ends[-1]), float(ends[-1] - t0))
        self.ratio.decay_steps(k)
        self.stats.decode_steps += k
        self.account(len(reqs), durations.tolist())
        out = JumpOutcome("decode", float(ends[-1] - t0), len(reqs), num_steps=k)
        times = ends.tolist()
        self._write_steps(reqs, (fill0 + (k - 1)).tolist(), toks, times, needs, slots)
        out.pending = (reqs, toks)
        if self.policy.charges_service:
            self._charge_decode(reqs, k)
        cols.advance(k, self.page_size)
        maybe = cols.maybe_finished()
        if maybe:
            self._retire_finished(maybe, out)
        return out

    def _advance_to(self, end: float, total: float) -> None:
        if isinstance(self.clock, VirtualClock):
            self.clock.jump_to(end)  # exactly where k single steps would end
        else:
            self.clock.advance(total)

    def _alloc_failed(self, n: int) -> IntegrityError:
        return IntegrityError(
            f"KV allocation of {n} slots failed: available {self.allocator.available_size()}, "
            f"evictable {self.cache.evictable_size()} (the admission budget was violated)"
        )

    def _write_steps(
        self,
        reqs: list[Req],
        ends: list[int],
        toks: list[list[int]],
        times: list[float],
        needs: list[int],
        slots: np.ndarray | None,
    ) -> None:
        """Eager decode state: every request's tokens, times, slots and ``kv_len`` now."""
        off = 0
        for r, tk, n, end in zip(reqs, toks, needs, ends, strict=True):
            if n:
                assert slots is not None
                _append(r, slots[off : off + n])
                off += n
            r.kv_len = end
            r.output_ids.extend(tk)
            r.times.token_times.extend(times)

    def _charge_decode(self, reqs: list[Req], k: int) -> None:
        """Each request's tenant charged for ``k`` decode tokens, as ``k`` single steps would:
        counters are integral, so the sums are exact either way. Tenant by tenant, each
        request's ``VirtualTokenCounter.charge(tenant, 0, k)`` in batch order (its float
        additions, in its order: only a tenant's own charges touch its counter)."""
        fair = self.queue.fair
        counters = fair.counters
        none, inc = fair.prefill_weight * 0, fair.decode_weight * k
        floats = type(none) is float and type(inc) is float  # (ints add exactly, unbounded)
        for tenant, n in self._tenant_counts(reqs).items():
            c = counters.get(tenant, 0.0)
            if floats and type(c) is float:  # natively: C doubles add as Python floats do
                counters[tenant] = self._repeat_add(c, none, inc, n)
                continue
            for _ in range(n):
                c = c + none + inc
            counters[tenant] = c

    def _retire_finished(self, maybe: list[int], out: StepOutcome) -> None:
        """Only the rows that can have finished (``maybe``) are checked (a jump never spans a
        stop): in one native call where no row can stop early (``native/retire.py``)."""
        if retire(self, maybe, out):
            return
        if self.unsettled:
            self.settle(maybe)
        running, gone = self.running, []
        for i in maybe:
            r = running[i]
            self.check_finish(r)
            if r.finished:
                out.finished.append(r)
                gone.append(i)
        if gone:
            self.batch.remove_at(gone)  # settled above: the survivors keep their state
            self._release_finished(out.finished)

    # ---- invariants -------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """The reference checks, then: the columns describe the batch, and deferred state is
        whole decode steps of the log with its slots exactly the allocator's reservation."""
        super().check_integrity()
        cols = self.batch.cols
        fresh = decode_batch(self.running, bool(self.eos_ids))
        reserved = self.allocator.reserved_size()
        if not self.unsettled:
            if reserved:
                raise IntegrityError(f"{reserved} KV slots reserved, none owed")
            if cols is not None and not cols.same_as(fresh):
                raise IntegrityError("stale running-batch columns")
            return
        if cols is None:
            raise IntegrityError("deferred columns do not list the running batch")
        err = cols.deferred_error(fresh, cols.log_len, reserved)
        if err is not None:
            raise IntegrityError(err)


def _append(r: Req, slots: np.ndarray) -> None:
    """``slots`` (the KV manager's ``alloc``: its rows' dtype) appended to ``r.kv_row``."""
    have, n = len(r.kv_row), len(slots)
    if len(r.kv_buf) < have + n:
        buf = np.empty(max(2 * (have + n), 64), dtype=slots.dtype)
        buf[:have] = r.kv_row
        r.kv_buf = buf
    r.kv_buf[have : have + n] = slots
    r.kv_row = r.kv_buf[: have + n]


_INT64_MAX = (1 << 63) - 1


def _evictor(cache: Any) -> Callable[[int], int]:
    """``cache.evict``; where that is the native cache's own over the native pool, what it
    calls (``tree.evict_free(pool, n)``), bound once: a call into C++ without a Python frame
    (the cache's ``allocator`` and ``tree`` are set once, when it is built)."""
    evict: Callable[[int], int] = cache.evict
    pool = getattr(cache, "allocator", None)
    if (
        getattr(evict, "__func__", None) is native_radix.NativeRadixCache.evict
        and pool is not None
        and type(pool) is cache._pool_type
    ):
        return functools.partial(cache.tree.evict_free, pool)
    return evict


def _jump_tokens(runner: MultiStepRunner, reqs: list[Req], fill0: bytes, k: int) -> list[list[int]]:
    """The tokens of a jump's ``k`` steps per request: ``fill0`` is the fills before them, as
    ``DecodeBatch.jump`` gives them (int64 bytes)."""
    fills = np.frombuffer(fill0, dtype=np.int64)
    got: list[list[int]] = runner.tokens_at(
        reqs, fills[:, None] + np.arange(k, dtype=np.int64)[None, :]
    ).tolist()
    return got


def _step_ends(t0: float, durations: np.ndarray) -> np.ndarray:
    """End time of each of several consecutive steps, accumulated left to right exactly as a
    clock advanced step by step would (``t0 + (d1 + d2)`` can differ from ``(t0 + d1) + d2``)."""
    return np.cumsum(np.concatenate([[t0], durations]))[1:]
