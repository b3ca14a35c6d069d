"""SGLang compat's admission rounds in the native loop (``native/admit.py``,
``_native/adder.cpp``): the adder's compat budgets against the Python ``PrefillAdder`` (bit for
bit), compat rounds shown to go native, with the same schedule as the reference core, and the
rounds it must still leave to the reference loop."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import golden
from fakes import Room
from radixsched.adder import AddReqResult, PrefillAdder
from radixsched.config import SchedulerConfig
from radixsched.native import admit as admission
from radixsched.native import core
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

VERDICTS = {0: AddReqResult.CONTINUE, 1: AddReqResult.NO_TOKEN, 2: AddReqResult.OTHER}


def _compat_select(
    page: int, room: int, chunk: int | None, total: float, rem_input: int, admitted: int,
    fill: int, prefix: int, max_new: int, out: int,
) -> tuple[Any, tuple[bool, int, int, bool]]:  # fmt: skip
    """The Python adder's compat shape of a request, and the native one's (ok, verdict,
    extend_len, chunked), from the same budgets."""
    cfg = SchedulerConfig(
        page_size=page, chunked_prefill_size=chunk, clip_max_new_tokens=4096, compat="sglang"
    )
    room_ = Room(room)
    py = PrefillAdder(
        config=cfg,
        cache=room_,
        allocator=room_,
        running=[],
        new_token_ratio=0.5,  # type: ignore[arg-type]
    )
    assert py.compat
    py.total_offset, py.rem_input_tokens = total, rem_input
    py.can_run_list = [object()] * admitted  # type: ignore[list-item]
    r = Req("r", list(range(fill - out)), SamplingParams(max_new_tokens=max_new))
    r.output_ids, r.prefix_len = list(range(out)), prefix
    check = min(r.remaining_new_tokens, cfg.clip_max_new_tokens)
    got = py._select(r, fill - prefix, check, False)
    mod = core()
    assert mod is not None
    na = mod.Adder()
    na.page, na.clip_max_new_tokens, na.compat = page, 4096, True
    na.begin(0.5, total, 0.0, rem_input, py.rem_chunk_tokens, admitted, False, False, 64,
             False, False, False)  # fmt: skip
    return got, tuple(na.select(room, fill - prefix, prefix, float(check), False))


def _agree(got: Any, nat: tuple[bool, int, int, bool]) -> None:
    ok, verdict, extend_len, chunked = nat
    if isinstance(got, AddReqResult):
        assert not ok and VERDICTS[verdict] is got
    else:
        assert ok and (extend_len, chunked) == got


def test_compat_checks_the_whole_request_against_memory_even_where_it_chunks() -> None:
    """Chunked at 256 tokens, 900 to extend: SGLang checks 900 + 128 + 1 against memory (not
    the first chunk's 256), so 1000 tokens of room say no token; radixsched's would admit."""
    args = dict(page=1, room=1000, chunk=256, total=0.0, rem_input=16384, admitted=0)
    got, nat = _compat_select(**args, fill=1000, prefix=100, max_new=128, out=0)  # type: ignore[arg-type]
    assert got is AddReqResult.NO_TOKEN
    _agree(got, nat)


def test_compat_does_not_cut_the_chunk_at_the_input_budget() -> None:
    """A second admission with 100 input tokens left: SGLang's chunk is the chunk budget's
    (2048 > 500: not chunked), so the input budget's check (whole pages) says stop."""
    args = dict(page=1, room=100_000, chunk=2048, total=0.0, rem_input=100, admitted=1)
    got, nat = _compat_select(**args, fill=500, prefix=0, max_new=128, out=0)  # type: ignore[arg-type]
    assert got == (500, False)
    _agree(got, nat)


@settings(max_examples=300, deadline=None)
@given(
    page=st.sampled_from([1, 4, 16]),
    room=st.integers(0, 40_000),
    chunk_pages=st.one_of(st.none(), st.integers(1, 128)),
    total=st.floats(-500.0, 40_000.0),
    rem_input=st.integers(-64, 20_000),
    admitted=st.integers(0, 3),
    fill=st.integers(1, 9000),
    prefix_frac=st.floats(0.0, 1.0),
    max_new=st.integers(1, 5000),
    out_frac=st.floats(0.0, 1.0),
)
def test_compat_select_equals_the_python_adder(
    page: int, chunk_pages: int | None, fill: int, prefix_frac: float, max_new: int,
    out_frac: float, **case: Any,
) -> None:  # fmt: skip
    chunk = None if chunk_pages is None else chunk_pages * page
    prefix = int((fill - 1) * prefix_frac) // page * page
    out = min(int(fill * out_frac), max_new, fill - 1)
    got, nat = _compat_select(
        page=page, chunk=chunk, fill=fill, prefix=prefix, max_new=max_new, out=out, **case
    )
    _agree(got, nat)


def _count(mp: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the rounds ``covers`` hands to the native loop and those it does not."""
    seen = {"native": 0, "reference": 0}
    real = admission.covers

    def counting(s: Any, adder: PrefillAdder) -> bool:
        ok = real(s, adder)
        seen["native" if ok else "reference"] += 1
        return ok

    mp.setattr(admission, "covers", counting)
    return seen


def _both(w: Workload, sched: SchedulerConfig, sim: SimConfig) -> dict[str, int]:
    """``w`` on the native core (integrity checked) and the reference: the same schedule.
    Returns the native core's rounds by loop."""
    mp = pytest.MonkeyPatch()
    seen = _count(mp)
    try:
        fast = simulate(w, sched, sim, accelerate=True, check_integrity=True)
    finally:
        mp.undo()
    ref = simulate(copy.deepcopy(w), sched, sim, accelerate=False)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(w.requests)
    assert a["trace"] == b["trace"]
    assert golden.comparable(a) == golden.comparable(b)
    return seen


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight", "shortest-prefill-first"])
@pytest.mark.parametrize("chunk", [None, 128])
def test_compat_rounds_go_native_with_the_reference_schedule(
    policy: str, chunk: int | None
) -> None:
    w = load_workload(
        "shared-prefix:groups=3,prompts=8,system_len=300,question_len=40,output_len=16",
        request_rate=60.0,
    )
    sched = SchedulerConfig(schedule_policy=policy, compat="sglang", chunked_prefill_size=chunk)
    seen = _both(w, sched, SimConfig(max_total_tokens=3000))
    assert seen["native"] > 0 and seen["reference"] == 0


def test_compat_admits_an_in_flight_prefix_twice_as_sglang_does() -> None:
    """Two requests over one uncached 200-token prefix in one round: radixsched's guard holds
    the second back a round; SGLang's (compat: no guard, and fcfs is not cache-aware, so the
    queue dedups nothing) admits both at once. Both natively."""
    x = np.arange(200, dtype=np.int32)

    def req(rid: str, tail: int) -> Req:
        tokens = np.concatenate([x, np.arange(tail, tail + 20, dtype=np.int32)])
        return Req(rid, tokens, SamplingParams(max_new_tokens=4), arrival_time=0.0)

    reqs = [req("a", 1000), req("b", 2000)]
    w = Workload("explicit", {}, reqs, has_timestamps=True)
    sim = SimConfig(max_total_tokens=4000)
    starts = {}
    for compat in ("sglang", None):
        sched = SchedulerConfig(
            schedule_policy="fcfs", compat=compat, in_batch_prefix_deprioritize_threshold=32
        )
        seen = _both(copy.deepcopy(w), sched, sim)
        assert seen["native"] > 0 and seen["reference"] == 0
        run = simulate(copy.deepcopy(w), sched, sim, accelerate=True)
        starts[compat] = {r.rid: r.times.first_scheduled for r in run.requests}
    assert starts["sglang"]["a"] == starts["sglang"]["b"]
    assert starts[None]["a"] != starts[None]["b"]


def _stand_in(**queue: bool) -> Any:
    """What ``covers`` reads of a compat scheduler over the native tree (all else covered)."""
    hooks = {"native_nodes": True, "native_touch": True, "native_lens": True, **queue}
    return SimpleNamespace(
        config=SchedulerConfig(compat="sglang"),
        queue=SimpleNamespace(**hooks),
        cache=SimpleNamespace(disabled=False),
        kv=SimpleNamespace(host_tier=None, hit_unit=1),
        page_size=1,
        native_adder=SimpleNamespace(guard=False),
    )


def test_covers_a_compat_round_but_not_a_hooked_cache() -> None:
    """A compat round is covered; a cache subclass's touch or match (the reference loop would
    call it from the matcher's memo or for a walk) is not."""
    adder = SimpleNamespace(gate=None, compat=True)
    assert admission.covers(_stand_in(), adder)  # type: ignore[arg-type]
    assert not admission.covers(_stand_in(native_touch=False), adder)  # type: ignore[arg-type]
    assert not admission.covers(_stand_in(native_nodes=False), adder)  # type: ignore[arg-type]
    # The guard is off under compat: a hooked match_len is never called there.
    assert admission.covers(_stand_in(native_lens=False), adder)  # type: ignore[arg-type]


@pytest.mark.parametrize("compat", ["sglang", None])
def test_priority_preemption_goes_native_with_the_reference_schedule(compat: str | None) -> None:
    """Two running low-priority requests fill the batch (two slots); two high-priority ones
    arrive together and each preempts one of them, in one round of the native loop
    (``_preempter``; the full batch does not end the round there)."""

    def req(rid: str, n: int, prio: int, at: float, out: int) -> Req:
        tokens = np.arange(n, dtype=np.int32) + 1000 * len(rid) + ord(rid[0])
        sp = SamplingParams(max_new_tokens=out)
        return Req(rid, tokens, sp, arrival_time=at, priority=prio)

    reqs = [req("a", 300, 0, 0.0, 200), req("b", 280, 0, 0.0, 200), req("c", 150, 50, 0.05, 8)]
    reqs += [req("d", 120, 50, 0.05, 8), req("ee", 110, 5, 0.06, 8)]
    w = Workload("explicit", {}, reqs, has_timestamps=True)
    sched = SchedulerConfig(
        schedule_policy="fcfs",
        compat=compat,
        enable_priority_scheduling=True,
        max_running_requests=2,
    )
    seen = _both(w, sched, SimConfig(max_total_tokens=4000))
    assert seen["native"] > 0 and seen["reference"] == 0
    run = simulate(copy.deepcopy(w), sched, SimConfig(max_total_tokens=4000), accelerate=True)
    assert sum(r.preemption_count for r in run.requests) == 2
    starts = {r.rid: r.times.first_scheduled for r in run.requests}
    assert starts["c"] == starts["d"]  # both preempted for in one round


def test_compat_reserves_the_whole_clipped_output() -> None:
    """Eight requests of 100 prompt and 1,500 output tokens in 5,000 tokens of KV: SGLang's
    admission reserves all 1,500 of each (radixsched's, the ratio's share), so the first
    round admits fewer requests than radixsched's; natively as in the reference."""

    def req(i: int) -> Req:
        tokens = np.arange(100, dtype=np.int32) + 1000 * i
        return Req(f"r{i}", tokens, SamplingParams(max_new_tokens=1500), arrival_time=0.0)

    reqs = [req(i) for i in range(8)]
    w = Workload("explicit", {}, reqs, has_timestamps=True)
    sim = SimConfig(max_total_tokens=5000)
    first = {}
    for compat in ("sglang", None):
        sched = SchedulerConfig(schedule_policy="fcfs", compat=compat)
        seen = _both(copy.deepcopy(w), sched, sim)
        assert seen["native"] > 0 and seen["reference"] == 0
        run = simulate(copy.deepcopy(w), sched, sim, accelerate=True)
        t0 = min(r.times.first_scheduled for r in run.requests)
        first[compat] = sum(r.times.first_scheduled == t0 for r in run.requests)
    assert first["sglang"] < first[None]
