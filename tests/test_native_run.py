"""The native prefill step (``_core.PrefillCost``, ``_core.PrefillRun``, ``_native/prefill.cpp``):
its time equals the dense roofline's ``_dense_step_s`` float for float, and a ``NativeScheduler``
whose extend-only steps run natively ends in exactly the reference scheduler's state; where
the reference needs Python (stop ids, tenant charges, a host load) the native call declines
before it changes anything and the reference runs."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.build import build_scheduler
from radixsched.native.scheduler import NativeScheduler
from radixsched.request import Req, SamplingParams
from radixsched.scheduler import Scheduler
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.roofline import CostModel
from radixsched.sim.cost.runner import CostModelRunner, _native_prefill_cost

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


# ---- the step's time ----------------------------------------------------------------------------
def _cost(tp: int, eff: float, sched: float, per_req: float, per_prefill: float) -> CostModel:
    return dataclasses.replace(
        load_cost_model(model="llama-3.1-8b", tp=tp),
        prefill_eff_tokens=eff,
        sched_step_s=sched,
        sched_per_req_s=per_req,
        sched_per_prefill_s=per_prefill,
    )


@settings(max_examples=300, deadline=None)
@given(
    tp=st.sampled_from([1, 2]),
    eff=st.sampled_from([0.0, 64.0, 128, 17.3]),
    consts=st.tuples(*[st.sampled_from([0.0, 1e-4, 3.7e-5, 2]) for _ in range(3)]),
    tokens=st.integers(0, 200_000),
    pairs=st.integers(0, 10**12),
    kv=st.integers(0, 10**7),
    entries=st.integers(1, 300),
)
def test_prefill_cost_equals_dense_step_s(
    tp: int,
    eff: float,
    consts: tuple[float, float, float],
    tokens: int,
    pairs: int,
    kv: int,
    entries: int,
) -> None:
    cost = _cost(tp, eff, *consts)
    native = _native_prefill_cost(cost)
    assert native is not None
    want = cost._dense_step_s(tokens, pairs, kv, 0, entries, entries)
    assert native.step(tokens, pairs, kv, entries, entries) == want


def test_prefill_cost_asks_allreduce_once_per_token_count() -> None:
    """``PrefillCost`` keeps ``allreduce(tokens)`` per token count (a pure function of the cost
    model): asked once per count, each step the one a fresh object gives."""
    c: Any = core()
    asked: list[int] = []

    def allreduce(tokens: int) -> float:
        asked.append(tokens)
        return tokens * 1e-9 + 1e-5

    def cost(f: Any) -> Any:
        return c.PrefillCost(1.0, 1.0, 1e12, 1e9, 1e3, 1e12, 64.0, 1e-3, 0.0, 0.0, 0.0, f)

    kept = cost(allreduce)
    got = [kept.step(t, 10, 10, 1, 1) for t in (8192, 100, 8192, 100, 8192)]
    assert asked == [8192, 100]
    fresh = [cost(allreduce).step(t, 10, 10, 1, 1) for t in (8192, 100)]
    assert got == [fresh[0], fresh[1], fresh[0], fresh[1], fresh[0]]
    assert fresh[0] != cost(None).step(8192, 10, 10, 1, 1)  # (the all-reduce counts)


def test_no_native_prefill_cost_without_a_dense_roofline_or_a_pcie_rate() -> None:
    cost = load_cost_model(model="llama-3.1-8b")
    no_pcie = dataclasses.replace(cost, gpu=dataclasses.replace(cost.gpu, pcie_bw=0.0))
    assert _native_prefill_cost(no_pcie) is None
    assert _native_prefill_cost(load_cost_model(model="mixtral-8x7b", tp=2)) is None
    runner = CostModelRunner(cost)
    first = runner.native_prefill_cost()
    assert first is not None and runner.native_prefill_cost() is first  # built once per cost
    runner.cost = no_pcie
    assert runner.native_prefill_cost() is None


# ---- the step's bookkeeping: the reference scheduler's final state --------------------------------
def _reqs(stops: bool = False, tenants: bool = False) -> list[Req]:
    """Shared prefixes, a request that finishes with its first token, a retracted-free pool."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 1000, 96).astype(np.int32)
    out = []
    for i, n in enumerate([4, 1, 6, 1, 3, 5]):
        prompt = np.concatenate([base[: 32 + 16 * (i % 3)], rng.integers(0, 1000, 20 + i)])
        stop = (7,) if stops and i == 2 else ()
        out.append(
            Req(
                f"q{i}",
                prompt.astype(np.int32),
                SamplingParams(max_new_tokens=n, stop_token_ids=stop),
                extra_key=None,
                tenant=f"t{i % 2}" if tenants else None,
            )
        )
    return out


def _drive(accelerate: bool, policy: str, reqs: list[Req]) -> Scheduler:
    cfg = SchedulerConfig(schedule_policy=policy, chunked_prefill_size=64, page_size=1)
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=5)
    s = build_scheduler(cfg, runner, accelerate=accelerate, kv_slots=4096)
    assert isinstance(s, NativeScheduler) == accelerate
    for k, r in enumerate(reqs):
        s.add_request(r, now=0.001 * k)
    for _ in range(500):
        if s.is_idle:
            break
        s.step()
        if isinstance(s, NativeScheduler):
            s.check_integrity()
    assert s.is_idle
    return s


def _state(s: Scheduler, reqs: list[Req]) -> Any:
    per = [
        (
            r.rid,
            list(r.output_ids),
            list(r.times.token_times),
            r.times.first_token,
            r.times.finish,
            r.computed_prefill_tokens,
            r.finish,
        )
        for r in reqs
    ]
    charged = list(s.queue.fair.counters.items())  # fair's tenant counters, in their order
    return per, dataclasses.asdict(s.stats), s.processed_tokens, s.clock.now(), charged


def _compare(policy: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> int:
    """Both cores from fresh requests; returns how often the fast one ran the reference's
    ``Scheduler.run``."""
    ref_reqs = _reqs(**kw)
    ref = _drive(False, policy, ref_reqs)
    calls: list[int] = []
    orig = Scheduler.run

    def counting(self: Scheduler, batch: Any) -> Any:
        calls.append(1)
        return orig(self, batch)

    monkeypatch.setattr(Scheduler, "run", counting)
    fast_reqs = _reqs(**kw)
    fast = _drive(True, policy, fast_reqs)
    assert _state(fast, fast_reqs) == _state(ref, ref_reqs)
    assert fast.stats.prefill_steps > 3
    assert any(r.output_len == 1 for r in fast_reqs)  # finished at its prefill
    return len(calls)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_native_prefill_steps_end_in_the_reference_state(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _compare(policy, monkeypatch) == 0  # every prefill step ran natively


def test_a_request_with_stop_ids_runs_its_step_on_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _compare("fcfs", monkeypatch, stops=True) > 0


def test_tenant_charges_run_natively_and_charge_as_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fair's prefill steps (fresh and continued chunks) run natively, each tenant charged
    what its requests computed there: the counters end as the reference's."""
    assert _compare("fair", monkeypatch, tenants=True) == 0


def test_a_chunk_limit_policy_runs_its_fresh_rounds_direct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """spf caps a continued chunk: its rounds take ``native.step``'s paths (``fresh`` without a
    chunked request, ``limited`` with one: the queue ordered first, the cap read off it),
    ending in the reference's state."""
    from radixsched.native import step

    seen: list[str] = []
    fresh, limited = step.fresh, step.limited

    def counting_fresh(s: Any, horizon: Any) -> Any:
        seen.append("fresh")
        return fresh(s, horizon)

    def counting_limited(s: Any, req: Any, horizon: Any) -> Any:
        seen.append("limited")
        return limited(s, req, horizon)

    monkeypatch.setattr(step, "fresh", counting_fresh)
    monkeypatch.setattr(step, "limited", counting_limited)
    _compare("shortest-prefill-first", monkeypatch)  # the states compared there
    assert {"fresh", "limited"} <= set(seen)


def test_a_capped_middle_chunk_runs_on_the_python_adder_with_its_cap() -> None:
    """spf under a prefill budget below the chunk (``--max-prefill-tokens`` < chunk): a capped
    continuation can spend the round, a middle chunk the native plan leaves to the Python
    adder, which then applies the same cap. Both cores end in the same state."""
    from radixsched.adder import PrefillAdder

    def drive(accelerate: bool) -> tuple[Scheduler, list[Req], list[int | None]]:
        rng = np.random.default_rng(11)
        lens = [300, 20, 50, 60, 150, 55, 260, 48]
        reqs = [
            Req(f"c{i}", rng.integers(0, 1000, n).astype(np.int32),
                SamplingParams(max_new_tokens=2), extra_key=None)
            for i, n in enumerate(lens)
        ]  # fmt: skip
        cfg = SchedulerConfig(
            schedule_policy="shortest-prefill-first",
            chunked_prefill_size=64,
            max_prefill_tokens=40,
            page_size=1,
        )
        runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=5)
        s = build_scheduler(cfg, runner, accelerate=accelerate, kv_slots=4096)
        caps: list[int | None] = []
        orig = PrefillAdder.add_chunked_req

        def noting(adder: PrefillAdder, req: Req) -> Any:
            caps.append(adder.chunked_req_limit)
            return orig(adder, req)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(PrefillAdder, "add_chunked_req", noting)
            s.add_request(reqs[0], now=0.0)
            s.step()  # the long prompt is chunked before the short ones arrive
            for k, r in enumerate(reqs[1:], 1):
                s.add_request(r, now=0.0005 * k)
            for _ in range(800):
                if s.is_idle:
                    break
                s.step()
        assert s.is_idle
        return s, reqs, caps

    ref, ref_reqs, _ = drive(False)
    fast, fast_reqs, caps = drive(True)
    assert _state(fast, fast_reqs) == _state(ref, ref_reqs)
    assert any(c is not None for c in caps)  # the Python adder continued a capped chunk


def test_the_native_call_declines_before_changing_anything() -> None:
    """An entry the reference must run (here a host load after a plain entry): None, and
    neither the plain entry's request nor the scheduler is touched."""
    lib: Any = core()
    cost = _native_prefill_cost(load_cost_model(model="llama-3.1-8b"))
    pool = lib.Pool(64, 1)
    run = lib.PrefillRun(pool, lambda: 0, 64, lambda r, n: pytest.fail("checkpointed"))
    req = SimpleNamespace(
        rid="a",
        sampling=SamplingParams(max_new_tokens=4),
        scripted_output=None,
        output_ids=[],
        kv_len=8,
    )
    plain = SimpleNamespace(
        req=req, prefix_len=0, new_token_ids=[1] * 8, produces_token=True, host_load_len=0
    )
    hosted = SimpleNamespace(**{**vars(plain), "host_load_len": 4})
    sched = SimpleNamespace()
    assert run.run([plain, hosted], cost, {"a": 1}, 100, sched, 0.0) is None
    assert req.output_ids == [] and vars(sched) == {}


# ---- fused middle chunks of a chunked prefill -----------------------------------------------------
def _long_reqs(tenants: bool) -> list[Req]:
    """A prompt of six 64-token chunks and more (five middle chunks), and two short ones."""
    rng = np.random.default_rng(11)
    out = []
    for i, n in enumerate([400, 40, 70]):
        out.append(
            Req(
                f"c{i}",
                rng.integers(0, 1000, n).astype(np.int32),
                SamplingParams(max_new_tokens=3),
                extra_key=None,
                tenant=f"t{i % 2}" if tenants else None,
            )
        )
    return out


def _drive_chunks(accelerate: bool, policy: str, reqs: list[Req]) -> tuple[Scheduler, int]:
    """Every step given a far horizon, so that fused middle chunks run back to back; returns
    the scheduler and the most chunks one step ran."""
    cfg = SchedulerConfig(schedule_policy=policy, chunked_prefill_size=64, page_size=1)
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=7)
    s = build_scheduler(cfg, runner, accelerate=accelerate, kv_slots=4096)
    for r in reqs:
        s.add_request(r, now=0.0)
    most = 0
    for _ in range(200):
        if s.is_idle:
            break
        out = s.step(horizon=5.0)
        most = max(most, out.num_steps if out is not None else 0)
        if isinstance(s, NativeScheduler):
            s.check_integrity()
    assert s.is_idle
    return s, most


def _compare_chunks(policy: str, tenants: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """Both cores; returns how often the fast one asked the runner's Python ``forward``."""
    ref_reqs = _long_reqs(tenants)
    ref, _ = _drive_chunks(False, policy, ref_reqs)
    calls: list[int] = []
    orig = CostModelRunner.forward

    def counting(self: CostModelRunner, batch: Any) -> Any:
        calls.append(len(batch.extend))
        return orig(self, batch)

    monkeypatch.setattr(CostModelRunner, "forward", counting)
    fast_reqs = _long_reqs(tenants)
    fast, most = _drive_chunks(True, policy, fast_reqs)
    assert _state(fast, fast_reqs) == _state(ref, ref_reqs)
    assert most >= 4  # the middle chunks of the long prompt ran in one step
    return len(calls)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_fused_middle_chunks_run_natively(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _compare_chunks(policy, False, monkeypatch) == 0


def test_middle_chunks_charging_tenants_run_natively_and_charge_as_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fair's middle chunks run in the native call too; each chunk's tokens are charged to
    its tenant after it (the same counters and schedule as the reference's)."""
    assert _compare_chunks("fair", True, monkeypatch) == 0


# ---- the native attribute access (_native/py_attr.hpp): slots read and written in place ----------
def test_native_attribute_access_reads_and_writes_slots_as_python_does() -> None:
    """A __slots__ field is read and written in place (its member descriptor's offset, kept per
    type and version tag); an unset one, a dict attribute, a property and a frozen class go
    through Python's own access, and a change to the class is seen at once."""
    c: Any = core()

    @dataclasses.dataclass(slots=True)
    class S:
        a: Any
        b: Any = None

    class Sub(S):
        @property
        def a(self) -> int:  # shadows the slot: read through the property
            return 7

    @dataclasses.dataclass(frozen=True, slots=True)
    class F:
        a: Any

    s = S(1)
    assert c._get_attr(s, "a") == 1 and c._get_attr(s, "a") == 1  # the second from the table
    c._set_attr(s, "b", "x")
    assert s.b == "x" and c._get_attr(s, "b") == "x"
    c._set_attr(s, "b", 2.5)  # the old value let go of, the new one held
    assert s.b == 2.5
    del s.b
    with pytest.raises(AttributeError):
        c._get_attr(s, "b")  # an unset slot raises as Python's access does
    c._set_attr(s, "b", "y")
    sub = Sub.__new__(Sub)  # (its __init__ would set the property)
    assert c._get_attr(sub, "a") == 7
    with pytest.raises(AttributeError):
        c._set_attr(sub, "a", 1)  # a property without a setter
    S.b = property(lambda self: "p")  # type: ignore[assignment,method-assign]
    assert c._get_attr(s, "b") == "p"  # the class changed: its slot ("y") is no longer read
    ns = SimpleNamespace(a=1)
    c._set_attr(ns, "a", 5)
    assert c._get_attr(ns, "a") == 5
    f = F(1)
    assert c._get_attr(f, "a") == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        c._set_attr(f, "a", 2)  # its __setattr__ refuses
    assert f.a == 1
