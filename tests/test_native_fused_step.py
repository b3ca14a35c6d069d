"""A prefill step's admission and ``_batch`` in one native call (``PrefillRun.step``, driven by
``radixsched/native/step.py``'s ``fresh`` and ``continued``): the round on the native adder, the
failed request noted, the queue's take, the new chunked request, the scheduler's native step
and ``extend_run``; what it hands back where a piece declines (None: nothing extends; the
admissions: no native step runs them), and that every run ends in the reference's state."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import golden
from radixsched.adder import Admission
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native import step as steps
from radixsched.native.build import build_scheduler
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.scheduler import NativeScheduler
from radixsched.request import Req, SamplingParams
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.workloads.load import load_workload
from test_native_step import _same as fast_step_same

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

_SHARED = "shared-prefix:groups=3,prompts=6,system_len=256,question_len=32,output_len=16"


def _same(cfg: SchedulerConfig) -> None:
    """The shared-prefix workload on both cores: the same schedule and results."""
    fast_step_same(load_workload(_SHARED, request_rate=50.0), cfg)


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
@pytest.mark.parametrize("chunk", [None, 128])
def test_fresh_and_continued_rounds_run_in_one_native_call(
    policy: str, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Python ``_batch`` and no Python take: the native call takes the admitted
    positions (``queue_take``) and runs the step."""
    outcome = golden.count_calls(monkeypatch, steps, "_outcome")
    batch = golden.count_calls(monkeypatch, steps, "_batch")
    take = golden.count_calls(monkeypatch, NativeWaitingQueue, "take")
    _same(SchedulerConfig(schedule_policy=policy, chunked_prefill_size=chunk))
    assert outcome["calls"] > 0
    assert batch["calls"] == take["calls"] == 0


@pytest.mark.parametrize("chunk", [None, 2048])
def test_a_charging_policys_tenants_pay_what_the_fused_call_computed(
    chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fair runs in the fused call too (and its middle chunks back to back): each request's
    tenant is charged what the call computed for it, in batch order, as the reference's
    ``_count_tokens`` charges it; three tenants under a full cache, so the charges decide
    the order."""
    outcome = golden.count_calls(monkeypatch, steps, "_outcome")
    batch = golden.count_calls(monkeypatch, steps, "_batch")
    w = golden._load("shared-block")
    reqs = [dataclasses.replace(r, tenant=f"t{i % 3}") for i, r in enumerate(w.requests)]
    cfg = SchedulerConfig(schedule_policy="fair", chunked_prefill_size=chunk)
    fast_step_same(dataclasses.replace(w, requests=reqs), cfg, slots=50_000)
    assert outcome["calls"] > 0 and batch["calls"] == 0


def test_no_native_step_runs_the_taken_admissions_on_built_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_native_step`` offers none: the call hands the admissions back (taken, chunked
    request set) and the entries are built and run, as the reference does."""
    monkeypatch.setattr(NativeScheduler, "_native_step", lambda self: None)
    built = golden.count_calls(monkeypatch, NativeScheduler, "_extend_entries")
    _same(SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=128))
    assert built["calls"] > 0


def test_the_python_take_where_the_queue_has_no_native_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queue with its native take off: the call asks the queue's own ``take``."""
    real = NativeWaitingQueue.__init__

    def no_native_take(self: NativeWaitingQueue, *a: Any, **kw: Any) -> None:
        real(self, *a, **kw)
        self._native_take = None

    monkeypatch.setattr(NativeWaitingQueue, "__init__", no_native_take)
    take = golden.count_calls(monkeypatch, NativeWaitingQueue, "take")
    _same(SchedulerConfig(schedule_policy="fcfs", chunked_prefill_size=128))
    assert take["calls"] > 0


# ---- the native call on a scheduler's state ------------------------------------------------------
def _scheduler(lens: list[int], max_prefill: int = 16384, chunk: int | None = 64) -> Any:
    cfg = SchedulerConfig(
        schedule_policy="fcfs", chunked_prefill_size=chunk, max_prefill_tokens=max_prefill
    )
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=5)
    s = build_scheduler(cfg, runner, accelerate=True, kv_slots=4096)
    assert s._fresh_direct
    rng = np.random.default_rng(7)
    for i, n in enumerate(lens):
        prompt = rng.integers(0, 1000, n).astype(np.int32)
        s.add_request(Req(f"r{i}", prompt, SamplingParams(max_new_tokens=4)), now=0.0)
    return s


def _step(s: Any, order: Any, can_run: list[Admission] | None = None, slots: int = 8) -> Any:
    """``fresh``'s native call (an empty running batch: no reservation)."""
    cfg = s.config
    q = s.queue
    return s.prefill_run.step(
        s, s.native_adder, s.cache.tree, s.kv.native, q, order, s.ratio.current, 0.0,
        0.0, cfg.max_prefill_tokens, s._chunk, False, slots,
        [] if can_run is None else can_run, bool(s.batch.reqs), s.chunked_req is not None,
        s.batch_is_full, s._pool, q.reqs, q.deferred, s.clock, q._take_fixed, q._native_take,
        q.moved, q.tried, q.added,
    )  # fmt: skip


def _order(s: Any) -> Any:
    return s.queue.begin_round(s.batch.reqs, s.processed_tokens, s.clock.now())


def test_nothing_admitted_hands_back_none_and_takes_nothing() -> None:
    """An order with nothing in it, then no slot left: nothing admitted, nothing taken, the
    batch's fullness written back (full where the slots ran out)."""
    s = _scheduler([20, 30])
    waiting = list(s.queue.reqs)
    assert _step(s, SimpleNamespace(position=lambda i: None)) is None
    assert s.queue.reqs == waiting and s.batch_is_full is False
    assert _step(s, _order(s), slots=0) is None
    assert s.queue.reqs == waiting and s.batch_is_full is True
    assert s.clock.now() == 0.0 and s.stats.prefill_steps == 0


def test_no_order_runs_the_continued_admissions_alone() -> None:
    """No order (the continued chunk spent the round): no admission, the given admissions
    run; with none, nothing does."""
    s = _scheduler([20, 30])
    assert _step(s, None) is None
    r = s.queue.reqs[0]
    s.queue.take([0])  # as if it were the continued chunk, its prefix taken
    s.match_for_admission(r)
    s.kv.take_prefix(r)
    r.extend_end = len(r.prompt_ids)
    got = _step(s, None, [Admission(r, 0, len(r.prompt_ids), False)])
    assert type(got) is tuple and got[-1] == 1  # one entry
    assert s.batch.reqs == [] and got[4] == [r] and len(s.queue.reqs) == 1


def test_the_native_step_declined_hands_back_the_admissions_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = _scheduler([20, 100])
    monkeypatch.setattr(s, "_native_step", lambda: None)
    first, second = s.queue.reqs
    got = _step(s, _order(s))
    assert type(got) is list and [a.req for a in got] == [first, second]
    assert [a.extend_len for a in got] == [20, 44]  # the second chunked at 64 tokens
    assert s.queue.reqs == [] and s.chunked_req is second
    assert s.clock.now() == 0.0 and s.stats.prefill_steps == 0


def test_a_second_chunked_request_fails_the_reference_assertion() -> None:
    s = _scheduler([100])
    s.chunked_req = Req("other", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=1))
    with pytest.raises(AssertionError, match="only one chunked request at a time"):
        _step(s, _order(s))


def test_a_request_the_round_fails_is_noted_as_tried() -> None:
    """Past the prefill budget (no chunking): the second request is tried, not admitted (its
    matched length is the admission's now: ``note_tried``), and stays waiting."""
    s = _scheduler([40, 40], max_prefill=48, chunk=None)
    first, second = s.queue.reqs
    got = _step(s, _order(s))
    assert type(got) is tuple and got[1] == 40 and got[4] == [first]
    assert s.queue.reqs == [second] and s.queue.tried == {id(second): second}


def test_covers_refusing_keeps_the_python_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``covers`` says no, neither a fresh round nor a continued one (on the Python
    adder's plan) is fused: the reference's loop runs them."""
    from radixsched.native import admit as admission

    monkeypatch.setattr(admission, "covers", lambda s, adder: False)
    fused: list[Any] = []  # what the native calls handed ``_outcome`` (None: a decode round)
    real = steps._outcome

    def outcome(s: Any, got: Any, horizon: Any, charges: Any) -> Any:
        fused.append(got)
        return real(s, got, horizon, charges)

    monkeypatch.setattr(steps, "_outcome", outcome)
    continued = golden.count_calls(monkeypatch, steps, "continued")
    batch = golden.count_calls(monkeypatch, steps, "_batch")
    _same(SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=128))
    assert continued["calls"] > 0 and batch["calls"] > 0
    assert all(got is None for got in fused)


def test_an_exclusive_round_admits_no_second_chunked_request() -> None:
    """Exclusive chunking (a chunk-limit policy's budgets) with a chunked request: a request
    that would chunk is not admitted, and nothing extends."""
    s = _scheduler([100])
    s.chunked_req = Req("other", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=1))
    cfg, waiting = s.config, list(s.queue.reqs)
    q = s.queue
    got = s.prefill_run.step(
        s, s.native_adder, s.cache.tree, s.kv.native, q, _order(s), s.ratio.current, 0.0,
        0.0, cfg.max_prefill_tokens, s._chunk, True, 8, [], False, True, False, s._pool,
        q.reqs, q.deferred, s.clock, q._take_fixed, q._native_take, q.moved, q.tried, q.added,
    )  # fmt: skip
    assert got is None and s.queue.reqs == waiting


def test_a_round_with_a_new_chunked_request_runs_the_python_batch() -> None:
    """``continued`` with budgets that chunked a new request already: ``_batch`` sets it as
    the scheduler's chunked request (the native call would not know it)."""
    from radixsched.native import admit as admission

    s = _scheduler([20, 30])
    r = s.queue.reqs[0]
    s.queue.take([0])  # as if it were the continued chunk, its prefix taken
    s.match_for_admission(r)
    s.kv.take_prefix(r)
    r.extend_end = len(r.prompt_ids)
    b = admission.Budgets(s.ratio.current, 0.0, s.config.max_prefill_tokens, s._chunk)
    b.can_run_list.append(Admission(r, 0, len(r.prompt_ids), False))
    other = Req("other", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=1))
    b.new_chunked_req = other
    out = steps.continued(s, b, None, None, True)
    assert out is not None and out.prefill_tokens == len(r.prompt_ids)
    assert s.chunked_req is other


def test_a_continuation_covers_refuses_is_checkpointed_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``continuation`` where ``covers`` says no: the last chunk checkpointed all the same
    (``_adder_plan`` plans from there), None."""
    from radixsched.native import admit as admission

    s = _scheduler([100])
    s.step()  # the first chunk (64 tokens)
    r = s.chunked_req
    assert r is not None and (r.prefix_len, r.extend_end) == (0, 64)
    monkeypatch.setattr(admission, "covers", lambda sched, adder: False)
    assert steps.continuation(s, r) is None
    assert r.prefix_len == 64


def test_the_python_batchs_native_step_reports_what_finished() -> None:
    """``_batch``'s native step (``extend_run``, a new chunked request's round): a request
    done at its first token is the outcome's ``finished``; nothing is retracted."""
    from radixsched.native import admit as admission

    s = _scheduler([20])
    r = s.queue.reqs[0]
    r.sampling = dataclasses.replace(r.sampling, max_new_tokens=1)
    s.queue.take([0])
    s.match_for_admission(r)
    s.kv.take_prefix(r)
    r.extend_end = len(r.prompt_ids)
    b = admission.Budgets(s.ratio.current, 0.0, s.config.max_prefill_tokens, s._chunk)
    b.can_run_list.append(Admission(r, 0, len(r.prompt_ids), False))
    b.new_chunked_req = Req("other", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=1))
    out = steps.continued(s, b, None, None, True)
    assert out is not None and out.finished == [r] and out.retracted == []
