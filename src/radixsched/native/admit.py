"""The accelerated scheduler's admission loop in C++ (``radixsched/_native/adder.cpp``): one
native call walks the round's order (the in-flight recompute guard, the admission's match from
the matcher's memo, the adder's budgets, locks), reading ``order.position(i)`` exactly when the
reference loop would (an order may draw random numbers and permute the list as it is read).

It covers the common case (``covers``): no prefill gate (delayer), an enabled cache (so no
ignore-eos admission of a disabled cache), no host tier, hits in whole pages, the native
tree's own match and touch (no subclass hook the reference would call). SGLang compat's rounds
too: its budgets (``Adder.compat``: the whole clipped ``max_new_tokens`` reserved, no chunk cap
by the input budget, the whole request checked against memory) and no in-flight recompute
guard (SGLang's in-batch dedup is the queue's, in ``deferred``, read as the reference reads
it). Priority preemption calls back into the Python adder (``preempt_to_schedule``, through
``_preempter``) only where the batch is full. Elsewhere the reference loop runs; decided per
round from the config and the round's adder. Bit for bit the reference's admission: the same
budgets (the same floats), the same tree calls in the same order, the same request fields
(tests/test_equivalence.py, tests/test_native_adder.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from radixsched.adder import Admission, PrefillAdder
from radixsched.config import SchedulerConfig
from radixsched.native import core, namespace_of
from radixsched.native.kv import NativeKVManager
from radixsched.queue import RoundOrder
from radixsched.request import EMPTY_SLOTS, Req


class Admitting(Protocol):
    """What of the accelerated scheduler (``native.scheduler.NativeScheduler``) the loop reads and
    sets (spelled out here: that module imports this one)."""

    config: SchedulerConfig
    page_size: int
    cache: Any
    kv: NativeKVManager
    allocator: Any
    _pool: Any  # ``allocator`` (a property there), read without its call
    queue: Any  # its NativeWaitingQueue
    chunked_req: Req | None
    batch_is_full: bool
    native_adder: Any
    batch: Any  # its RunningBatch: ``reqs`` is ``running``

    @property
    def waiting(self) -> list[Req]: ...
    @property
    def running(self) -> list[Req]: ...


def covers(s: Admitting, adder: PrefillAdder | Budgets) -> bool:
    """Whether the native loop does what the reference loop does for this round."""
    return (
        adder.gate is None
        and adder.compat == s.config.sglang_compat  # the native adder's is the config's
        and covers_run(s)
    )


def covers_run(s: Admitting) -> bool:
    """``covers``'s tests of the scheduler's setup (its cache, KV manager and queue)."""
    q = s.queue
    return not (
        s.cache.disabled
        or s.kv.host_tier is not None
        or s.kv.hit_unit != s.page_size
        or not (q.native_nodes and q.native_touch)
        or (s.native_adder.guard and not q.native_lens)
    )


def _preempter(s: Admitting, adder: PrefillAdder) -> Any:
    """The native loop's priority preemption: ``adder.preempt_to_schedule`` for a request, with
    the round's admissions so far (only their requests are read) and the loop's live budget;
    returns (preempted, the budget after, whether requests still run)."""

    def preempt(req: Req, admitted: list[Req], total_offset: float) -> tuple[bool, float, bool]:
        adder.total_offset = total_offset
        run = adder.can_run_list
        adder.can_run_list = run + [Admission(r, 0, 0, False) for r in admitted]
        try:
            ok = adder.preempt_to_schedule(req, s.running)
        finally:
            adder.can_run_list = run
        return ok, adder.total_offset, bool(s.running)

    return preempt


def native_adder(s: Admitting) -> Any:
    """The scheduler's C++ adder: its config set once, each round's budgets by ``begin``."""
    native = core()
    assert native is not None, "the accelerated scheduler runs over the native core"
    a = native.Adder()
    cfg = s.config
    a.page = s.page_size
    a.clip_max_new_tokens = cfg.clip_max_new_tokens
    a.prefill_max_requests = -1 if cfg.prefill_max_requests is None else cfg.prefill_max_requests
    a.compat = cfg.sglang_compat
    a.guard = not cfg.sglang_compat and s.cache.supports_prefix_sharing()
    a.threshold = max(cfg.in_batch_prefix_deprioritize_threshold, 1)
    a.empty_slots = EMPTY_SLOTS
    a.ns_of = namespace_of
    a.admission = Admission
    a.round_order = RoundOrder
    return a


class RoundBudgets(Protocol):
    """What ``admit`` reads and writes of the round's adder: a ``PrefillAdder``, or a fresh
    round's ``Budgets``."""

    new_token_ratio: float
    total_offset: float
    current_offset: float
    rem_input_tokens: int
    rem_chunk_tokens: int | None
    exclusive_chunking: bool
    can_run_list: list[Admission]
    new_chunked_req: Req | None
    log_hit_tokens: int
    log_input_tokens: int


@dataclass(slots=True)
class Budgets:
    """A round's budgets as ``Scheduler.new_adder`` starts a ``PrefillAdder`` with nothing mixed
    and no gate (``native/step.py``: the adder itself is not built), for ``admit``."""

    new_token_ratio: float
    total_offset: float  # the running batch's decode reservations
    rem_input_tokens: int
    rem_chunk_tokens: int | None
    compat: bool = False
    gate: None = None
    exclusive_chunking: bool = False
    current_offset: float = 0.0
    can_run_list: list[Admission] = field(default_factory=list)
    new_chunked_req: Req | None = None
    log_hit_tokens: int = 0
    log_input_tokens: int = 0


def admit(s: Admitting, adder: RoundBudgets, order: RoundOrder, slots: int) -> list[int]:
    """``Scheduler._admit`` in one native call (``Adder.round``), which also gives the
    admitted requests their prefixes (``take_prefix``, once the round's admissions are done:
    a later admission's touch may split the node a prefix ends at, its path keeping its slots)
    and appends them to ``adder.can_run_list`` as the reference's would. Priority preemption
    needs a ``PrefillAdder``."""
    a = s.native_adder
    # ``a.preempt`` is unset or None outside a round that preempts (a native step's budgets
    # never do: ``native/step.py`` runs without priority preemption).
    preempts = type(adder) is not Budgets and s.config.enable_priority_preemption
    if preempts:
        assert isinstance(adder, PrefillAdder), "preemption runs through the Python adder"
        a.preempt = _preempter(s, adder)
    q = s.queue
    positions, chunked, failed, budgets = a.round(
        adder.new_token_ratio,
        adder.total_offset,
        adder.current_offset,
        adder.rem_input_tokens,
        adder.rem_chunk_tokens,
        adder.new_chunked_req is not None,
        adder.exclusive_chunking,
        slots,
        bool(s.batch.reqs),  # (the ``running`` and ``waiting`` lists, without their calls)
        s.chunked_req is not None,
        s.batch_is_full,
        s.cache.tree,  # the native tree (``covers``: ``native_nodes``)
        s._pool,
        order,
        q.reqs,
        q.deferred,
        adder.can_run_list,  # the continued chunk, for the in-flight guard
    )
    if preempts:
        a.preempt = None  # the round's adder is not kept
    if chunked is not None:
        adder.new_chunked_req = chunked
    if failed is not None:
        q.note_tried(failed)
    (
        adder.total_offset,
        adder.current_offset,
        adder.rem_input_tokens,
        adder.rem_chunk_tokens,
        hit,
        computed,
        s.batch_is_full,
    ) = budgets
    adder.log_hit_tokens += hit
    adder.log_input_tokens += computed
    return positions
