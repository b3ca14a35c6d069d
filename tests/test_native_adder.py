"""The native adder (``radixsched/_native/adder.cpp``) against the Python ``PrefillAdder`` on
the same inputs: budget verdicts, the admission's shape, the reservation and the charge, bit
for bit (the same floats). The native admission loop itself runs in every accelerated run of
tests/test_equivalence.py; here it is shown to fire, and to stand aside where it does not
cover the round."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import golden
from fakes import Room, put_fresh
from radixsched.adder import AddReqResult, PrefillAdder
from radixsched.config import SchedulerConfig
from radixsched.native import admit as admission
from radixsched.native import core
from radixsched.native import step as steps
from radixsched.native.build import build_scheduler
from radixsched.request import Req, SamplingParams
from radixsched.scheduler import Scheduler
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

VERDICTS = {0: AddReqResult.CONTINUE, 1: AddReqResult.NO_TOKEN, 2: AddReqResult.OTHER}


def _pair(
    *,
    page: int,
    room: int,
    chunk: int | None,
    ratio: float,
    clip: int,
    total: float,
    current: float,
    rem_input: int,
    admitted: int,
    new_chunked: bool,
    exclusive: bool,
) -> tuple[PrefillAdder, Any]:
    cfg = SchedulerConfig(page_size=page, chunked_prefill_size=chunk, clip_max_new_tokens=clip)
    room_ = Room(room)
    py = PrefillAdder(
        config=cfg,
        cache=room_,  # type: ignore[arg-type]
        allocator=room_,
        running=[],
        new_token_ratio=ratio,
        exclusive_chunking=exclusive,
    )
    py.total_offset, py.current_offset, py.rem_input_tokens = total, current, rem_input
    py.can_run_list = [SimpleNamespace()] * admitted  # type: ignore[list-item]
    py.new_chunked_req = SimpleNamespace() if new_chunked else None  # type: ignore[assignment]
    mod = core()
    assert mod is not None
    na = mod.Adder()
    na.page, na.clip_max_new_tokens = page, clip
    na.begin(
        ratio, total, current, rem_input, py.rem_chunk_tokens, admitted, new_chunked, exclusive,
        64, False, False, False,
    )  # fmt: skip
    return py, na


def _req(fill: int, prefix: int, max_new: int, out: int, ignore_eos: bool) -> Req:
    r = Req(
        "r", list(range(fill - out)), SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    )
    r.output_ids = list(range(out))
    r.prefix_len = prefix
    return r


def _same(py: PrefillAdder, na: Any, room: int) -> None:
    assert VERDICTS[na.budget_state(room)] is py.budget_state()
    assert (na.total_offset, na.current_offset) == (py.total_offset, py.current_offset)
    assert (na.rem_input_tokens, na.rem_chunk_tokens) == (py.rem_input_tokens, py.rem_chunk_tokens)
    assert (na.log_hit_tokens, na.log_input_tokens) == (py.log_hit_tokens, py.log_input_tokens)


def _check(case: dict[str, Any], req: tuple[int, int, int, int, bool], has_chunked: bool) -> None:
    py, na = _pair(**case)
    fill, prefix, max_new, out, ignore_eos = req
    r = _req(fill, prefix, max_new, out, ignore_eos)
    resv = py.running_reservation(r)
    assert na.reservation(r.remaining_new_tokens, ignore_eos) == resv
    got = py._select(r, fill - prefix, resv, has_chunked)
    ok, verdict, extend_len, chunked = na.select(
        case["room"], fill - prefix, prefix, resv, has_chunked
    )
    if isinstance(got, AddReqResult):
        assert not ok and VERDICTS[verdict] is got
        return
    assert ok and (extend_len, chunked) == got
    py._charge(prefix, extend_len, 0.0 if chunked else resv)
    na.charge(prefix, extend_len, 0.0 if chunked else resv)
    _same(py, na, case["room"])


BASE: dict[str, Any] = dict(
    page=1, room=10_000, chunk=None, ratio=0.7, clip=4096, total=0.0, current=0.0,
    rem_input=16384, admitted=0, new_chunked=False, exclusive=False,
)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "req", "want"),
    [
        ({}, (500, 100, 128, 0, False), (True, 400, False)),  # fits whole
        ({"room": 491}, (500, 100, 128, 0, False), (True, 400, False)),  # 400 + 89.6 + 1 < 491
        ({"room": 490}, (500, 100, 128, 0, False), (False, 1, 0)),  # not < 490: no token
        ({"admitted": 1, "rem_input": 300}, (500, 100, 128, 0, False), (False, 2, 0)),
        # The input budget counts whole pages: 404 tokens take 416 of the 416 left.
        ({"page": 16, "admitted": 1, "rem_input": 416}, (500, 96, 128, 0, False), (False, 2, 0)),
        ({"chunk": 256, "page": 16}, (500, 100, 128, 0, False), (True, 252, True)),  # page cut
        ({"chunk": 256, "new_chunked": True}, (500, 100, 128, 0, False), (False, 2, 0)),
        ({"chunk": 256, "exclusive": True}, (500, 100, 128, 0, False), (True, 256, True)),
        ({"chunk": 256, "exclusive": True, "has": 1}, (500, 100, 128, 0, False), (False, 2, 0)),
        ({"chunk": 256}, (500, 100, 128, 0, True), (True, 256, True)),  # ignore_eos: ratio 1
        ({"total": 9000.25}, (500, 100, 128, 0, False), (True, 400, False)),
        ({"total": 9510.0}, (500, 100, 128, 0, False), (False, 1, 0)),  # 490.6 vs 490.0
    ],
)
def test_native_adder_verdicts_equal_the_python_adder(
    change: dict[str, Any], req: tuple[int, int, int, int, bool], want: tuple[bool, int, Any]
) -> None:
    case = {**BASE, **change}
    has = bool(case.pop("has", 0))  # a chunked request continues this round
    _check(case, req, has_chunked=has)
    _, na = _pair(**case)
    got = na.select(case["room"], req[0] - req[1], req[1], na.reservation(req[2], req[4]), has)
    assert (got[0], got[1] if not got[0] else got[2], got[3] if got[0] else 0) == want


@settings(max_examples=300, deadline=None)
@given(
    page=st.sampled_from([1, 4, 16]),
    room=st.integers(0, 40_000),
    chunk_pages=st.one_of(st.none(), st.integers(1, 128)),
    ratio=st.floats(0.05, 1.0),
    clip=st.integers(1, 8192),
    total=st.floats(-500.0, 40_000.0),
    current=st.floats(-500.0, 40_000.0),
    rem_input=st.integers(-64, 20_000),
    admitted=st.integers(0, 3),
    new_chunked=st.booleans(),
    exclusive=st.booleans(),
    has_chunked=st.booleans(),
    fill=st.integers(1, 9000),
    prefix_frac=st.floats(0.0, 1.0),
    max_new=st.integers(1, 5000),
    out_frac=st.floats(0.0, 1.0),
    ignore_eos=st.booleans(),
)
def test_native_adder_equals_the_python_adder_hypothesis(
    page: int, chunk_pages: int | None, fill: int, prefix_frac: float, max_new: int,
    out_frac: float, ignore_eos: bool, has_chunked: bool, **case: Any,
) -> None:  # fmt: skip
    chunk = None if chunk_pages is None else chunk_pages * page
    prefix = int((fill - 1) * prefix_frac) // page * page
    out = min(int(fill * out_frac), max_new, fill - 1)
    _check(
        {**case, "page": page, "chunk": chunk},
        (fill, prefix, max_new, out, ignore_eos),
        has_chunked,
    )


def _run(policy: str, **sched: Any) -> int:
    """Rounds the native loop ran in a small accelerated simulation: through ``admit``, or
    in a prefill step's one native call (``native/step.py``: one that ran a step)."""
    calls = 0
    real, outcome = admission.admit, steps._outcome

    def counting(*a: Any) -> list[int]:
        nonlocal calls
        calls += 1
        return real(*a)

    def counting_steps(s: Any, got: Any, horizon: Any, charges: Any) -> Any:
        nonlocal calls
        calls += got is not None
        return outcome(s, got, horizon, charges)

    w = load_workload(
        "shared-prefix:groups=3,prompts=6,system_len=256,question_len=32,output_len=16",
        request_rate=50.0,
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(admission, "admit", counting)
    mp.setattr(steps, "_outcome", counting_steps)
    try:
        cfg = SchedulerConfig(schedule_policy=policy, **sched)
        run = simulate(
            w, cfg, SimConfig(max_total_tokens=6000), accelerate=True, check_integrity=True
        )
    finally:
        mp.undo()
    assert sum(r.finish is not None for r in run.requests) == len(w.requests)
    return calls


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight"])
def test_the_native_loop_runs_the_common_case(policy: str) -> None:
    assert _run(policy) > 0


def test_the_reference_loop_runs_what_the_native_one_does_not_cover() -> None:
    assert _run("fcfs", cache_block_size=16) == 0  # hits in 16-token blocks over 1-token pages


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_native_loop_equals_the_reference_across_namespaces(policy: str) -> None:
    """Requests in three namespaces over the same prompts: the guard compares members of the
    request's own namespace only, and a walk matches in its namespace."""
    w = load_workload(
        "shared-prefix:groups=2,prompts=8,system_len=300,question_len=24,output_len=12",
        request_rate=80.0,
    )
    keys = [None, "a", "b"]
    reqs = [dataclasses.replace(r, extra_key=keys[i % 3]) for i, r in enumerate(w.requests)]
    w = dataclasses.replace(w, requests=reqs)
    sched = SchedulerConfig(schedule_policy=policy, chunked_prefill_size=128)
    sim = SimConfig(max_total_tokens=4000)
    fast = simulate(w, sched, sim, accelerate=True, check_integrity=True)
    ref = simulate(w, sched, sim, accelerate=False)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(w.requests)
    assert golden.comparable(a) == golden.comparable(b)
    assert a["trace"] == b["trace"]


def _same_on_both_cores(reqs: list[Req], sched: SchedulerConfig) -> Any:
    """``reqs`` simulated on the native core (integrity checked each step) and on the
    reference: every request finishes, with the same schedule; the native run."""
    w = Workload("explicit", {}, reqs, has_timestamps=True)
    sim = SimConfig(max_total_tokens=4000)
    fast = simulate(w, sched, sim, accelerate=True, check_integrity=True)
    ref = simulate(copy.deepcopy(w), sched, sim, accelerate=False)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(reqs)
    assert a["trace"] == b["trace"]
    assert golden.comparable(a) == golden.comparable(b)
    return fast


def test_a_chunk_is_cut_at_the_input_budget_once_a_request_is_in() -> None:
    """With ``--max-prefill-tokens`` below ``--chunked-prefill-size``, a second admission's
    chunk ends where the round's input budget does (the adder cuts the chunk budget to it)."""
    case = {**BASE, "chunk": 2048, "admitted": 1, "rem_input": 100}
    _check(case, (500, 0, 128, 0, False), has_chunked=False)
    _, na = _pair(**case)
    ok, _, extend_len, chunked = na.select(case["room"], 500, 0, na.reservation(128, False), False)
    assert (ok, extend_len, chunked) == (True, 100, True)


def test_the_guard_counts_only_what_the_cache_lacks() -> None:
    """A (the prompt X, cached whole: its last token computed again) and B (X + Y) arrive in
    one round behind a finished X + Z. A recomputes a token B has cached, so B is admitted
    beside A, not held back a round: on both cores, with the guard at 1 token."""
    x = np.arange(100, dtype=np.int32)

    def req(rid: str, tokens: np.ndarray, at: float) -> Req:
        return Req(rid, tokens, SamplingParams(max_new_tokens=4), arrival_time=at)

    reqs = [
        req("xz", np.concatenate([x, np.arange(500, 540, dtype=np.int32)]), 0.0),
        req("a", x.copy(), 5.0),
        req("b", np.concatenate([x, np.arange(900, 950, dtype=np.int32)]), 5.0),
    ]
    sched = SchedulerConfig(schedule_policy="fcfs", in_batch_prefix_deprioritize_threshold=1)
    fast = _same_on_both_cores(reqs, sched)
    starts = {r.rid: r.times.first_scheduled for r in fast.requests}
    assert starts["a"] == starts["b"]  # admitted in the same round


def _behind_a_chunk(accelerate: bool) -> tuple[Scheduler, list[Req]]:
    """A (P + V, 120 tokens) prefills in 64-token chunks. After its first chunk the cache gains
    Y = P + Q (as if a request computed elsewhere had finished), and R = P + Q[:10] + U arrives:
    R's cache holds 90 of its tokens, more than A has computed (64) and more than R shares with
    A (80). Then A's last chunk runs with R beside it: nothing R would compute is in flight."""
    p, v, q, u = (
        np.arange(a, a + n, dtype=np.int32)
        for a, n in ((1000, 80), (2000, 40), (3000, 50), (4000, 30))
    )
    cfg = SchedulerConfig(
        schedule_policy="fcfs", chunked_prefill_size=64, in_batch_prefix_deprioritize_threshold=4
    )
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=3)
    s = build_scheduler(cfg, runner, accelerate=accelerate, kv_slots=2048)
    a = Req("a", np.concatenate([p, v]), SamplingParams(max_new_tokens=2))
    r = Req("r", np.concatenate([p, q[:10], u]), SamplingParams(max_new_tokens=2))
    s.add_request(a, now=0.0)
    s.step()
    assert s.chunked_req is a and a.extend_end == 64
    put_fresh(s.cache, s.allocator, np.concatenate([p, q]))  # P[:64]: A's chunk holds it
    s.add_request(r, now=s.clock.now())
    for _ in range(50):
        if s.is_idle:
            break
        s.step()
        s.check_integrity()
    return s, [a, r]


def test_the_guard_reads_the_cache_past_a_chunk_in_flight() -> None:
    """R shares 80 tokens with A's last chunk (tokens 64-120), but its own cache holds 90:
    admitting R recomputes none of A's tokens, so R starts beside A on both cores."""
    got = []
    for accelerate in (True, False):
        _, (a, r) = _behind_a_chunk(accelerate)
        assert r.cached_tokens == 90
        assert r.times.first_scheduled == r.times.arrival  # the first round after it arrived
        got.append(
            [(x.rid, list(x.output_ids), x.times.first_scheduled, list(x.times.token_times))
             for x in (a, r)]
        )  # fmt: skip
    assert got[0] == got[1]


@pytest.mark.parametrize("page", [1, 16])
def test_the_reference_loop_steps_back_from_a_prompt_cached_whole(page: int) -> None:
    """Rounds the native loop does not cover (here: hits counted in 16-token blocks) run the
    reference loop on the queue's memos: a prompt cached whole is matched to its cap (one token
    short, whole pages), where its memo is stepped back to. Same schedule as the reference."""
    prompt = np.arange(65, dtype=np.int32)  # its cap, 64 tokens, is whole blocks

    def req(rid: str, at: float) -> Req:
        return Req(rid, prompt.copy(), SamplingParams(max_new_tokens=4), arrival_time=at)

    reqs = [req("a", 0.0), req("b", 5.0), req("c", 5.0)]
    sched = SchedulerConfig(schedule_policy="lpm", cache_block_size=16, page_size=page)
    fast = _same_on_both_cores(reqs, sched)
    cached = {r.rid: r.cached_tokens for r in fast.requests}
    assert cached["b"] == 64  # the whole prompt but its last token
