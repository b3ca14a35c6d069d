"""``NativeScheduler``'s prefill step in few calls (``radixsched/native/step.py``): a fresh round's
admission without a ``PrefillAdder`` (``Adder.round``), the admitted requests' slots and the
step in one native call (``PrefillRun.extend_run``); where it applies, and that the schedule
is the reference's wherever it runs or stands aside."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import golden
from fakes import continued_chunk
from radixsched.adder import AddReqResult
from radixsched.config import SchedulerConfig
from radixsched.native import admit as admission
from radixsched.native import core
from radixsched.native import step as steps
from radixsched.native.build import build_scheduler
from radixsched.native.scheduler import NativeScheduler
from radixsched.request import Req, SamplingParams
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.runner import CostModelRunner, _native_prefill_cost
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

_SHARED = "shared-prefix:groups=3,prompts=6,system_len=256,question_len=32,output_len=16"


def _same(w: Workload, sched: SchedulerConfig, slots: int = 6000) -> Any:
    """``w`` on the accelerated scheduler (integrity checked each step) and the reference:
    the same schedule; the accelerated run."""
    sim = SimConfig(max_total_tokens=slots)
    fast = simulate(copy.deepcopy(w), sched, sim, accelerate=True, check_integrity=True)
    ref = simulate(copy.deepcopy(w), sched, sim, accelerate=False)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(w.requests)
    assert a["trace"] == b["trace"]
    assert golden.comparable(a) == golden.comparable(b)
    return fast


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight"])
@pytest.mark.parametrize("chunk", [None, 128])
def test_fresh_and_continued_rounds_take_the_few_call_step(
    policy: str, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = golden.count_calls(monkeypatch, steps, "fresh")
    continued = golden.count_calls(monkeypatch, steps, "continued")
    w = load_workload(_SHARED, request_rate=50.0)
    _same(w, SchedulerConfig(schedule_policy=policy, chunked_prefill_size=chunk))
    assert fresh["calls"] > 0
    assert (continued["calls"] > 0) == (chunk is not None)  # only a chunked prompt continues


def test_a_round_covers_refuses_runs_the_reference_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``covers`` says no, a fresh round builds the reference's adder and loop."""
    monkeypatch.setattr(admission, "covers", lambda s, adder: False)
    native = golden.count_calls(monkeypatch, admission, "admit")
    fresh = golden.count_calls(monkeypatch, steps, "fresh")
    _same(load_workload(_SHARED, request_rate=50.0), SchedulerConfig(schedule_policy="lpm"))
    assert fresh["calls"] > 0 and native["calls"] == 0


def test_stop_ids_run_the_step_on_built_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request with stop ids: ``extend_run`` declines and the entries are built."""
    built = golden.count_calls(monkeypatch, NativeScheduler, "_extend_entries")
    w = load_workload(_SHARED, request_rate=50.0)
    reqs = [
        Req(r.rid, r.prompt_ids, SamplingParams(max_new_tokens=8, stop_token_ids=(3,)))
        for r in w.requests
    ]
    w = Workload("explicit", {}, reqs, has_timestamps=False)
    _same(w, SchedulerConfig(schedule_policy="lpm"))
    assert built["calls"] > 0


def _sched(cfg: SchedulerConfig) -> Any:
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=3)
    return build_scheduler(cfg, runner, accelerate=True, kv_slots=4096)


def test_the_few_call_step_only_where_the_setup_allows() -> None:
    assert _sched(SchedulerConfig())._direct
    assert not _sched(SchedulerConfig(compat="sglang"))._direct
    assert not _sched(SchedulerConfig(enable_mixed_chunk=True))._direct
    assert not _sched(SchedulerConfig(cache_block_size=16))._direct  # hits in blocks

    class Admits(NativeScheduler):
        def _admit(self, adder: Any, order: Any, slots: int) -> list[int]:
            return super()._admit(adder, order, slots)

    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=3)
    assert not Admits(SchedulerConfig(), runner, kv_slots=4096)._direct


def test_extend_run_declines_before_changing_anything() -> None:
    """A request with host hits to load after a plain one: None, nothing touched (not the
    KV, which would raise, nor a request, nor the scheduler)."""
    lib: Any = core()
    cost = _native_prefill_cost(load_cost_model(model="llama-3.1-8b"))
    pool = lib.Pool(64, 1)
    run = lib.PrefillRun(pool, lambda: 0, 64, lambda r, n: pytest.fail("checkpointed"))

    def req(rid: str, host: int) -> SimpleNamespace:
        return SimpleNamespace(
            rid=rid,
            prompt_ids=np.arange(8, dtype=np.int32),
            output_ids=[],
            extend_end=8,
            host_hit_len=host,
            sampling=SamplingParams(max_new_tokens=4),
            scripted_output=None,
            times=SimpleNamespace(first_scheduled=None),
        )

    plain, hosted = req("a", 0), req("b", 4)
    adm = [SimpleNamespace(req=r, prefix_len=0, extend_len=8) for r in (plain, hosted)]
    sched = SimpleNamespace()
    assert run.extend_run(object(), adm, cost, {"a": 1, "b": 2}, 100, sched, 0.0) is None
    assert plain.times.first_scheduled is None and not hasattr(plain, "kv_len")
    assert vars(sched) == {}


def test_extend_run_skips_admissions_that_extend_nothing() -> None:
    """Only admissions that extend make entries: none, and the call declines (nothing run)."""
    lib: Any = core()
    cost = _native_prefill_cost(load_cost_model(model="llama-3.1-8b"))
    run = lib.PrefillRun(lib.Pool(64, 1), lambda: 0, 64, lambda r, n: None)
    adm = [SimpleNamespace(req=None, prefix_len=0, extend_len=0)]
    assert run.extend_run(object(), adm, cost, {}, 100, SimpleNamespace(), 0.0) is None


@pytest.mark.parametrize("at", [0, 1, 127, 128, 129, 255, 256, 1000, 1024, 3000])
@pytest.mark.parametrize("tail", [0, 1, 130])
def test_native_common_prefix_equals_the_python_one(at: int, tail: int) -> None:
    """The in-flight guard's common prefix (whole blocks memcmp'd first, then a scan): the
    reference's ``longest_common_prefix`` at every block boundary, and past either end."""
    from radixsched.cache.radix import longest_common_prefix

    lib: Any = core()
    a = np.arange(at + tail, dtype=np.int32)
    b = a.copy()
    if tail:
        b[at] = -1  # the first difference at ``at``
    for x, y in ((a, b), (b, a), (a, b[:at]), (a[: at // 2], b)):
        assert lib.common_prefix(x, y) == longest_common_prefix(x, y)


@pytest.mark.parametrize("k", [-3, 0, 1, 5, 39, 40, 41, 60, 61, 99, 100, 101])
@pytest.mark.parametrize("start", [0, 1, 30])
def test_shares_at_least_is_the_common_prefix_reaching_k(k: int, start: int) -> None:
    """The in-flight guard's bounded test: ``common_prefix(a, b) >= k`` (comparing from a
    start known to agree), past the shorter one's end, at the first difference and before."""
    lib: Any = core()
    a = np.arange(100, dtype=np.int32)
    b = a.copy()
    b[40] = -1  # the common prefix: 40
    for x, y in ((a, b), (b, a), (a, a), (a, a[:60]), (a[:60], a)):
        want = lib.common_prefix(x, y) >= k
        assert lib.shares_at_least(x, y, start, k) == want, (len(x), len(y), k)
    with pytest.raises(ValueError):
        lib.shares_at_least(a, b, 41, 50)


# ---- the continuation in C++: the Python adder's, value for value --------------------------------
def _python_continuation(
    page: int,
    max_prefill: int,
    chunk: int,
    running: tuple[int, int],
    ratio: float,
    room: tuple[int, int],
    prefix: int,
    fill: int,
    left: int,
    ignore_eos: bool,
    limit: int | None = None,
) -> tuple[Any, ...]:
    """``_adder_plan`` on the Python adder, as ``_core.plan_continuation`` reports it (kind 0)
    or would decline it (kind 1: a middle chunk)."""
    plan, req = continued_chunk(
        page, max_prefill, chunk, running, ratio, room, prefix, fill, left, ignore_eos, limit
    )
    adder = plan.adder
    n = req.extend_end - prefix
    assert [(a.prefix_len, a.extend_len) for a in adder.can_run_list] == (
        [(prefix, n)] if n else []
    )
    return (
        1 if plan.is_middle else 0,
        n,
        plan.still_chunked is not None,
        adder.total_offset,
        adder.current_offset,
        adder.rem_input_tokens,
        adder.rem_chunk_tokens,
        adder.budget_state() is AddReqResult.OTHER,
    )


@settings(max_examples=2000, deadline=None)
@given(
    page=st.sampled_from([1, 4, 16]),
    max_prefill=st.integers(1, 300),
    pages=st.integers(1, 50),
    running=st.tuples(st.integers(0, 400), st.integers(0, 400)),
    ratio=st.sampled_from([0.0, 0.1, 0.7, 1.0, 0.333]),
    room=st.tuples(st.integers(0, 500), st.integers(0, 100)),
    prefix=st.integers(0, 300),
    extra=st.integers(1, 400),
    left=st.integers(0, 5000),
    clip=st.sampled_from([1, 64, 4096]),
    ignore_eos=st.booleans(),
    limit=st.none() | st.integers(-20, 600),
)
def test_the_native_continuation_is_the_python_adders(
    page: int,
    max_prefill: int,
    pages: int,
    running: tuple[int, int],
    ratio: float,
    room: tuple[int, int],
    prefix: int,
    extra: int,
    left: int,
    clip: int,
    ignore_eos: bool,
    limit: int | None,
) -> None:
    chunk = pages * page
    # admission_reservation, as PrefillRun.continuation computes it from the request
    resv = min(left, clip) * (1.0 if ignore_eos else ratio)
    want = _python_continuation(
        page,
        max_prefill,
        chunk,
        running,
        ratio,
        room,
        prefix,
        prefix + extra,
        min(left, clip),
        ignore_eos,
        limit,  # a chunk-limit policy's cap (spf's), or none
    )
    lib: Any = core()
    got = lib.plan_continuation(
        page, max_prefill, chunk, *running, ratio, sum(room), prefix, prefix + extra, resv, limit
    )
    assert got[0] != 2
    if got[0] == 1:  # a middle chunk: Python plans it (the rest is what it would find)
        assert want[0] == 1
    assert got == want


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ((1, 16384, 64, 0, 0, 0.5, 1000, 0, 64, 3.5), 0),  # the last chunk
        ((16, 16384, 64, 0, 0, 0.5, 15, 0, 500, 3.5), 0),  # a stall: no room for a page
        ((4, 16384, 16, 0, 0, 0.5, 1000, 6, 500, 3.5), 1),  # a middle chunk off the pages
        ((1, 16384, 64, 0, 1, float("nan"), 100, 0, 500, 3.5), 2),  # math.floor would raise
        ((1, 16384, 64, 0, 0, 0.5, 1000, 10, 10, 3.5), 2),  # nothing left to extend
    ],
)
def test_continuation_cases(args: tuple[Any, ...], kind: int) -> None:
    lib: Any = core()
    assert lib.plan_continuation(*args)[0] == kind


def test_the_continuation_runs_natively_for_a_chunked_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = {"native": 0, "python": 0}
    real = steps.continuation

    def counting(s: Any, req: Req) -> Any:
        got = real(s, req)
        seen["python" if got is None else "native"] += 1
        return got

    monkeypatch.setattr(steps, "continuation", counting)
    w = load_workload(_SHARED, request_rate=50.0)
    _same(w, SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=128), slots=3000)
    assert seen["native"] > 0
