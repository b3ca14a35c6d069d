"""``NativeScheduler``'s prefill step in few calls: where the run's setup allows it (``direct``),
a step does what ``Role.step``, ``prefill_round``, ``_build_prefill``, ``new_adder``,
``fill_round``, ``_admit``, ``_prefill_batch``, ``_extend_entries`` and ``run`` do, in that
order. After the queue's round, one native call (``PrefillRun.step``) admits from the
round's budgets (``Adder.round``, no ``PrefillAdder`` built), takes the admitted positions,
and gives the admitted requests their slots with the step run on them (``extend_run``, no
``ExtendEntry`` built); a continued chunk is planned and admitted in one more
(``PrefillRun.continue_chunk``). Where no tenant is charged and there are no EOS ids; a step
the calls hand back, or a setup they do not cover, runs the reference's pieces.

The setup is fixed for the run: a plain co-located role, no prefill gate, no mixed chunks, no
priority preemption (no preempted request to requeue: the adder's preempt list stays empty),
no SGLang compat, a multi-step runner and the native admission's setup
(``native.admit.covers_run``); a policy's chunk limit (spf's) reads only a continued chunk, which
``limited`` plans as ``_plan_round`` does (the queue ordered first). Bit for bit the
reference's schedule (tests/test_equivalence.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from radixsched.adder import Admission, PrefillAdder
from radixsched.clock import Clock
from radixsched.native import admit as admission
from radixsched.queue import RoundOrder
from radixsched.request import Req
from radixsched.runner import Batch, StepOutcome

# What ``covers`` reads of a fresh round's budgets (no gate, not SGLang compat's), read-only.
_FRESH = admission.Budgets(0.0, 0.0, 0, None)


class Stepping(admission.Admitting, Protocol):
    """What of the accelerated scheduler (``native.scheduler.NativeScheduler``) a step reads,
    sets and calls beyond the admission's (spelled out here: that module imports this one)."""

    clock: Clock
    ratio: Any  # its NewTokenRatio: ``current``
    prefill_run: Any  # its native PrefillRun
    max_running_requests: int
    processed_tokens: int
    eos_ids: frozenset[int]
    _chunk: int | None
    _charges: bool  # the policy charges tenants for service (fair)
    policy: Any  # its Policy: ``chunk_limit``

    def decode_round(self, horizon: float | None = None) -> StepOutcome | None: ...
    def run(self, batch: Batch) -> StepOutcome: ...
    def new_adder(self) -> PrefillAdder: ...
    def fill_round(
        self, adder: PrefillAdder, order: RoundOrder | None, mixed: bool, had_chunked: bool
    ) -> Batch | None: ...
    def _admit(
        self, adder: PrefillAdder | admission.Budgets, order: RoundOrder, slots: int
    ) -> list[int]: ...
    def _native_step(self) -> Any: ...
    def _charge_prefill(self, done: list[tuple[Req, int]]) -> None: ...
    def _extend_entries(self, run: list[Admission]) -> list[Any]: ...


def fresh(s: Stepping, horizon: float | None) -> StepOutcome | None:
    """A step with no chunked request (``Role.step`` through ``_build_prefill``, its adder's
    budgets as ``new_adder`` starts them: nothing mixed, no gate)."""
    running = s.batch.reqs
    if not running:
        s.batch_is_full = False
    if s.batch_is_full or not s.queue.reqs:
        return s.decode_round(horizon)
    slots = s.max_running_requests - len(running)
    if slots <= 0:
        s.batch_is_full = True
        return s.decode_round(horizon)
    cfg = s.config
    ratio = s.ratio.current
    # (``decode_tokens`` of an empty batch is (0, 0): not asked)
    full, discounted = s.batch.decode_tokens(cfg.clip_max_new_tokens) if running else (0, 0)
    total = 0.0  # PrefillAdder.total_offset: float(0), then the running reservations
    total += full + discounted * ratio
    order = s.queue.begin_round(running, s.processed_tokens, s.clock.now())
    if order is None:  # nothing to admit: an empty batch, nothing preempted
        return s.decode_round(horizon)
    if not s.eos_ids and admission.covers(s, _FRESH):  # the round's budgets'
        q, mp = s.queue, cfg.max_prefill_tokens
        charges: list[tuple[Req, int]] | None = [] if s._charges else None
        got = s.prefill_run.step(
            s, s.native_adder, s.cache.tree, s.kv.native, q, order, ratio, total, 0.0, mp,
            s._chunk, False, slots, [], bool(running), s.chunked_req is not None,
            s.batch_is_full, s._pool, q.reqs, q.deferred, s.clock, q._take_fixed,
            q._native_take, q.moved, q.tried, q.added, charges
        )  # fmt: skip
        return _outcome(s, got, horizon, charges)
    budgets = admission.Budgets(ratio, total, cfg.max_prefill_tokens, s._chunk)  # chunk_size
    if not admission.covers(s, budgets):  # NativeScheduler._admit's test, as each round asks it
        batch = s.fill_round(s.new_adder(), order, False, False)
        return s.run(batch) if batch is not None else s.decode_round(horizon)
    positions = admission.admit(s, budgets, order, slots)
    return _batch(s, budgets.can_run_list, positions, budgets.new_chunked_req, horizon)


def continuation(s: Stepping, req: Req) -> tuple[admission.Budgets, Req | None, bool] | None:
    """``_plan_continuation`` without the adder: the chunked request ``req``'s last chunk
    checkpointed (``_continue_chunked``, always), then the continued chunk in a fresh round's
    budgets, the request while still chunked, and whether the budgets are spent
    (``budget_state()`` is OTHER); None (nothing else changed: ``_adder_plan`` goes on) where
    Python plans it: a middle chunk, a value the adder would raise on, or a round ``covers``
    leaves to the reference's loop. The checkpoint, the plan and the admission are one native
    call (``PrefillRun.continue_chunk``; the checkpoint changes neither the running batch's
    decode tokens nor what ``covers`` reads, which come first here)."""
    if not s.batch.reqs:
        s.batch_is_full = False
    cfg, chunk, ratio = s.config, s._chunk, s.ratio.current
    running = s.batch.decode_tokens(cfg.clip_max_new_tokens)
    b = admission.Budgets(ratio, 0.0, cfg.max_prefill_tokens, chunk)
    if not admission.covers(s, b):
        if req.extend_end > req.prefix_len:  # ``_continue_chunked``, without its call
            s.kv.checkpoint(req, req.extend_end)
        return None
    got = s.prefill_run.continue_chunk(
        s.kv.native, req, cfg.page_size, cfg.max_prefill_tokens, chunk, cfg.clip_max_new_tokens,
        *running, ratio, Admission
    )  # fmt: skip
    if got is None:
        return None
    a, truncated, spent = _into_budgets(b, got)
    if a is not None:  # else a stall: nothing admitted, still chunked
        b.can_run_list.append(a)
    return b, (req if truncated else None), spent


def _into_budgets(b: admission.Budgets, got: tuple[Any, ...]) -> tuple[Any, bool, bool]:
    """A native continuation's answer (what it admitted, whether the request stays chunked,
    the budgets after, whether they are spent): its four budgets written into ``b``, in the
    adder's order; the rest returned."""
    (
        first,
        truncated,
        b.total_offset,
        b.current_offset,
        b.rem_input_tokens,
        b.rem_chunk_tokens,
        spent,
    ) = got
    return first, truncated, spent


def _plan_into(
    s: Stepping, req: Req, b: admission.Budgets, running: tuple[int, int], limit: int | None
) -> tuple[Req | None, bool] | None:
    """The continued chunk of ``req`` planned natively (``PrefillRun.continuation``, capped
    at ``limit``) into the fresh round's budgets ``b`` (``running``: the batch's decode
    tokens, full and discounted): (the request while still chunked, whether the budgets are
    spent), or None where Python plans it (nothing changed)."""
    cfg = s.config
    got = s.prefill_run.continuation(
        s.kv.native,
        req,
        cfg.page_size,
        cfg.max_prefill_tokens,
        s._chunk,
        cfg.clip_max_new_tokens,
        *running,
        b.new_token_ratio,
        limit,
    )
    if got is None:
        return None
    n, truncated, spent = _into_budgets(b, got)
    if n:  # else a stall: nothing admitted, still chunked
        b.can_run_list.append(Admission(req, req.prefix_len, n, truncated))
    return (req if truncated else None), spent


def limited(s: Stepping, req: Req, horizon: float | None) -> StepOutcome | None:
    """``Role.step`` continuing ``req`` under the policy's chunk limit (spf), as ``_plan_round``
    runs it: the last chunk checkpointed, the queue ordered (an order always comes back: no
    second ordering), the limit read off the ordered list, the continuation capped by it
    (natively; a middle chunk on the Python adder), then the round."""
    if req.extend_end > req.prefix_len:  # ``prefill_round``'s checkpoint
        s.kv.checkpoint(req, req.extend_end)
    if not s.batch.reqs:  # (``_build_prefill``'s)
        s.batch_is_full = False
    cfg, chunk, ratio, q = s.config, s._chunk, s.ratio.current, s.queue
    order = q.begin_round(s.batch.reqs, s.processed_tokens, s.clock.now())
    limit = s.policy.chunk_limit(req, q.reqs, chunk or 0, s.page_size, q.deferred)
    running = s.batch.decode_tokens(cfg.clip_max_new_tokens)
    # ``new_adder``'s budgets for a chunk-limit policy: only one chunked request at a time
    b = admission.Budgets(ratio, 0.0, cfg.max_prefill_tokens, chunk, exclusive_chunking=True)
    got = _plan_into(s, req, b, running, limit)
    if got is None:  # a middle chunk (or a value the adder raises on): the Python adder
        adder = s.new_adder()
        adder.chunked_req_limit = limit
        s.chunked_req = adder.add_chunked_req(req)
        return continued(s, adder, order, horizon)
    s.chunked_req = got[0]  # (the admission reads the budgets: a spent round admits nothing)
    return continued(s, b, order, horizon, True)  # covered: ``_fresh_direct``'s setup


def continued(
    s: Stepping,
    adder: PrefillAdder | admission.Budgets,
    order: RoundOrder | None,
    horizon: float | None,
    covered: bool = False,
) -> StepOutcome | None:
    """The rest of a step that continued the chunked request into ``adder``: ``fill_round``
    (not mixed, had a chunked request) and what runs. ``covered``: ``covers`` said yes to
    ``adder`` (``continuation``'s budgets: it reads only the setup and the budgets' gate and
    compat, which nothing changes), so ``_admit`` (``NativeScheduler``'s: ``direct``) is the
    native loop without asking again. Where the native loop covers the round, nothing new is
    chunked yet (``adder.new_chunked_req``: ``_batch`` would set it) and there are no EOS
    ids, the admission and ``_batch`` up to the run are one native call
    (``PrefillRun.step``: ``adder``'s budgets are not written back, nobody reads them; a
    charging policy's tenants pay what it computed, after it)."""
    positions: list[int] = []
    b = adder  # the admission and ``_batch`` natively, where nothing new is chunked yet
    fused = covered or admission.covers(s, b)
    if b.new_chunked_req is None and not s.eos_ids and fused:
        q, running = s.queue, s.batch.reqs
        charges: list[tuple[Req, int]] | None = [] if s._charges else None
        got = s.prefill_run.step(
            s, s.native_adder, s.cache.tree, s.kv.native, q, order, b.new_token_ratio,
            b.total_offset, b.current_offset, b.rem_input_tokens, b.rem_chunk_tokens,
            b.exclusive_chunking, s.max_running_requests - len(running) + 1, b.can_run_list,
            bool(running), s.chunked_req is not None, s.batch_is_full, s._pool, q.reqs,
            q.deferred, s.clock, q._take_fixed, q._native_take, q.moved, q.tried, q.added,
            charges
        )  # fmt: skip
        return _outcome(s, got, horizon, charges)
    if order is not None:
        slots = s.max_running_requests - len(s.batch.reqs) + 1  # a chunked request's too
        if covered:
            positions = admission.admit(s, adder, order, slots)
        else:
            positions = s._admit(adder, order, slots)
    return _batch(s, adder.can_run_list, positions, adder.new_chunked_req, horizon)


def _outcome(
    s: Stepping, got: Any, horizon: float | None, charges: list[tuple[Req, int]] | None
) -> StepOutcome | None:
    """The step after ``PrefillRun.step`` (the admission and ``_batch`` up to the run): None,
    nothing extends (the decode round); a list, the round's admissions that no native step
    runs (their entries built and run: ``run`` charges them); else extend_run's answer, whose
    ``charges`` (a charging policy's: what each request computed) its tenants pay."""
    if got is None:
        return s.decode_round(horizon)
    if type(got) is list:
        return s.run(Batch(s._extend_entries(got), []))
    if charges:
        s._charge_prefill(charges)
    d, n, tokens, finished, joined, size = got
    s.batch.extend(joined)
    # (positional, the fields' order: a keyword call costs a third more)
    return StepOutcome("extend", d, size, 1, n, finished, [], tokens)


def _batch(
    s: Stepping,
    run: list[Admission],
    positions: list[int],
    chunked: Any,
    horizon: float | None,
) -> StepOutcome | None:
    """``_prefill_batch`` with no preempted request and nothing mixed, then the step."""
    for a in run:
        if a.extend_len:
            break
    else:  # nothing to run (or empty)
        return s.decode_round(horizon)
    s.queue.take(positions)
    if chunked is not None:
        assert s.chunked_req is None, "only one chunked request at a time"
        s.chunked_req = chunked
    native = None if s.eos_ids else s._native_step()
    if native is not None:
        # A charging policy's tenants pay what each request computed: the native step adds
        # it to ``computed_prefill_tokens`` as the reference's ``_count_tokens`` does.
        # (An admission extending nothing is in no entry: not charged.)
        before = (
            [(a.req, a.req.computed_prefill_tokens) for a in run if a.extend_len]
            if s._charges
            else None
        )
        res = s.prefill_run.extend_run(s.kv.native, run, *native, s, s.clock.now())
        if res is not None:
            d, n, tokens, finished, joined, size = res
            if before is not None:
                s._charge_prefill([(r, r.computed_prefill_tokens - c) for r, c in before])
            s.batch.extend(joined)
            return StepOutcome("extend", d, size, 1, n, finished, [], tokens)  # (positional)
    return s.run(Batch(s._extend_entries(run), []))
