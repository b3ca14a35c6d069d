"""The scheduler loop with the fake runner: tiny deterministic scenarios, one per branch, plus a
hypothesis test over random arrivals, pool sizes and policies. ``check_integrity`` runs after
every step (every KV slot free, cached or owned; locks released)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import FakeRunner, reference_output
from radixsched.adder import AddReqResult, PrefillAdder
from radixsched.cache import RadixCache, TokenAllocator
from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.engine.offline import Engine
from radixsched.policies import POLICIES
from radixsched.request import FinishReason, Req, SamplingParams
from radixsched.scheduler import Scheduler


def make_sched(kv: int = 4000, **cfg: object) -> Scheduler:
    config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
    return Scheduler(config, FakeRunner(kv + 64), kv_slots=kv, clock=VirtualClock())


def req(rid: str, prompt: list[int] | np.ndarray, n: int = 4, **kw: object) -> Req:
    return Req(rid, np.asarray(prompt), SamplingParams(max_new_tokens=n), **kw)  # type: ignore[arg-type]


def run_all(s: Scheduler, max_steps: int = 10_000) -> list[str]:
    """Step until idle, checking integrity after every step; returns the batch modes."""
    modes = []
    for _ in range(max_steps):
        if s.is_idle:
            break
        out = s.step()
        s.check_integrity()
        assert out is not None, "no progress with work pending"
        modes.append(out.mode)
    assert s.is_idle
    s.check_integrity()
    assert s.cache.protected_size() == 0
    return modes


def prompt(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n)


# ---- basic lifecycle -----------------------------------------------------------------------


def test_single_request_outputs_match_reference() -> None:
    s = make_sched()
    r = req("a", prompt(50), n=10)
    assert s.add_request(r).accepted
    modes = run_all(s)
    assert modes[0] == "extend" and set(modes[1:]) == {"decode"}
    assert r.output_ids == reference_output(r.prompt_ids, 10, s.runner)  # type: ignore[arg-type]
    assert r.finish is not None and r.finish.reason is FinishReason.LENGTH
    assert r.times.first_token is not None and r.times.finish is not None
    assert len(r.times.token_times) == 10


def test_second_request_hits_the_cache() -> None:
    s = make_sched()
    p = prompt(64)
    a = req("a", p, n=3)
    s.add_request(a)
    run_all(s)
    b = req("b", np.concatenate([p, prompt(8, 1)]), n=3)
    s.add_request(b)
    run_all(s)
    assert a.cached_tokens == 0
    # a's prompt and its first generated tokens with KV were cached at finish.
    assert b.cached_tokens == 64
    assert b.computed_prefill_tokens == 8


def test_identical_prompt_leaves_one_token_to_compute() -> None:
    s = make_sched()
    p = prompt(40)
    s.add_request(req("a", p, n=1))
    run_all(s)
    b = req("b", p, n=1)
    s.add_request(b)
    run_all(s)
    assert b.cached_tokens == 39 and b.computed_prefill_tokens == 1


@pytest.mark.parametrize(
    ("shared", "block", "hit"),
    [(64, 1, 64), (70, 16, 64), (70, 1, 70), (63, 16, 48), (15, 16, 0), (64, 16, 64)],
)
def test_a_hit_counts_whole_cache_blocks(shared: int, block: int, hit: int) -> None:
    """vLLM's prefix cache: only whole blocks hit; the rest of the shared prefix is computed
    again, and its duplicate KV is freed when the request is cached (integrity holds)."""
    s = make_sched(cache_block_size=block)
    p = prompt(shared)
    s.add_request(req("a", p, n=3))
    run_all(s)
    b = req("b", np.concatenate([p, prompt(8, 1)]), n=3)
    s.add_request(b)
    run_all(s)
    assert b.cached_tokens == hit and b.computed_prefill_tokens == shared + 8 - hit
    assert b.output_ids == reference_output(b.prompt_ids, 3, s.runner)  # type: ignore[arg-type]


def test_a_whole_prompt_hit_in_blocks_still_computes_its_last_token() -> None:
    """48 cached tokens of a 48-token prompt: capped at 47, then cut to whole 16-token blocks."""
    s = make_sched(cache_block_size=16)
    p = prompt(48)
    s.add_request(req("a", p, n=1))
    run_all(s)
    b = req("b", p, n=1)
    s.add_request(b)
    run_all(s)
    assert b.cached_tokens == 32 and b.computed_prefill_tokens == 16


def test_cache_block_size_must_be_whole_pages() -> None:
    with pytest.raises(ValueError, match="cache_block_size must be 1 or a multiple of page_size"):
        SchedulerConfig(page_size=16, cache_block_size=24)
    assert SchedulerConfig(page_size=16, cache_block_size=32).cache_block_size == 32


def test_stop_token_and_eos() -> None:
    runner = FakeRunner(1000)
    p = prompt(20)
    ref = reference_output(p, 5, runner)
    s = Scheduler(SchedulerConfig(), runner, kv_slots=900, clock=VirtualClock())
    r = Req("a", p, SamplingParams(max_new_tokens=5, stop_token_ids=(ref[2],)))
    s.add_request(r)
    run_all(s)
    assert r.output_ids == ref[:3]
    assert r.finish is not None and r.finish.reason is FinishReason.STOP
    runner2 = FakeRunner(1000, eos=ref[1])
    s2 = Scheduler(SchedulerConfig(), runner2, kv_slots=900, clock=VirtualClock())
    r2 = Req("b", p, SamplingParams(max_new_tokens=5))
    r3 = Req("c", p, SamplingParams(max_new_tokens=5, ignore_eos=True))
    s2.add_request(r2)
    s2.add_request(r3)
    run_all(s2)
    assert r2.output_ids == ref[:2]
    assert r3.output_ids == ref


# ---- chunked prefill -------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_spans_three_rounds(page_size: int) -> None:
    s = make_sched(chunked_prefill_size=64, page_size=page_size)
    r = req("long", prompt(150), n=3)
    s.add_request(r)
    seen = []
    for _ in range(3):
        out = s.step()
        s.check_integrity()
        assert out is not None and out.mode == "extend"
        seen.append(out.prefill_tokens)
    assert seen == [64, 64, 22]
    # Between chunks the computed KV was checkpointed into the cache (and locked).
    assert s.cache.protected_size() >= 128
    run_all(s)
    assert r.output_ids == reference_output(r.prompt_ids, 3, s.runner)  # type: ignore[arg-type]


def test_chunked_request_continues_before_new_ones() -> None:
    s = make_sched(chunked_prefill_size=32)
    a = req("a", prompt(80), n=2)
    s.add_request(a)
    s.step()
    b = req("b", prompt(10, 3), n=2)
    s.add_request(b)
    out = s.step()
    assert out is not None
    # The continuation (32) fills the chunk budget; b waits for the next round.
    assert out.prefill_tokens == 32 and b in s.waiting
    run_all(s)


# ---- admission results ----------------------------------------------------------------------


def _adder(
    cache: RadixCache, alloc: TokenAllocator, running: list[Req], **cfg: object
) -> PrefillAdder:
    config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
    return PrefillAdder(
        config=config, cache=cache, allocator=alloc, running=running, new_token_ratio=0.5
    )


def _fresh(r: Req, cache: RadixCache) -> Req:
    r.last_node = cache.root
    return r


def test_adder_no_token_when_memory_short() -> None:
    alloc = TokenAllocator(100)
    cache = RadixCache(alloc)
    adder = _adder(cache, alloc, [])
    big = _fresh(req("big", prompt(60), n=80), cache)
    # 60 + 80 x 0.5 (ratio) + one page >= 100: does not fit.
    assert adder.add_one_req(big, has_chunked_req=False) is AddReqResult.NO_TOKEN
    assert adder.can_run_list == []


def test_adder_other_when_input_budget_spent_without_chunking() -> None:
    alloc = TokenAllocator(10_000)
    cache = RadixCache(alloc)
    adder = _adder(cache, alloc, [], chunked_prefill_size=-1, max_prefill_tokens=100)
    a = _fresh(req("a", prompt(80), n=4), cache)
    b = _fresh(req("b", prompt(30, 1), n=4), cache)
    assert adder.add_one_req(a, has_chunked_req=False) is AddReqResult.CONTINUE
    assert adder.add_one_req(b, has_chunked_req=False) is AddReqResult.OTHER
    assert [x.req.rid for x in adder.can_run_list] == ["a"]
    cache.dec_lock_ref(a.lock_node)


def test_adder_first_request_always_admitted_without_chunking() -> None:
    alloc = TokenAllocator(10_000)
    cache = RadixCache(alloc)
    adder = _adder(cache, alloc, [], chunked_prefill_size=-1, max_prefill_tokens=50)
    a = _fresh(req("a", prompt(80), n=4), cache)
    # The first request exceeds max_prefill_tokens alone but is admitted (spec 2.6.1 item 4).
    assert adder.add_one_req(a, has_chunked_req=False) is AddReqResult.OTHER
    assert len(adder.can_run_list) == 1
    cache.dec_lock_ref(a.lock_node)


def test_adder_chunks_a_request_that_does_not_fit_the_chunk_budget() -> None:
    alloc = TokenAllocator(10_000)
    cache = RadixCache(alloc)
    adder = _adder(cache, alloc, [], chunked_prefill_size=64)
    a = _fresh(req("a", prompt(100), n=4), cache)
    assert adder.add_one_req(a, has_chunked_req=False) is AddReqResult.OTHER  # chunk spent
    assert adder.new_chunked_req is a and a.extend_end == 64
    cache.dec_lock_ref(a.lock_node)


def test_compat_chunked_admission_needs_whole_prompt_but_radixsched_only_the_chunk() -> None:
    for compat, expected in (("sglang", AddReqResult.NO_TOKEN), ("radixsched", AddReqResult.OTHER)):
        alloc = TokenAllocator(200)
        cache = RadixCache(alloc)
        adder = _adder(cache, alloc, [], chunked_prefill_size=64, compat=compat)
        a = _fresh(req("a", prompt(300), n=4), cache)
        assert adder.add_one_req(a, has_chunked_req=False) is expected
        if a.lock_node is not None:
            cache.dec_lock_ref(a.lock_node)


def test_prefill_max_requests_caps_the_batch() -> None:
    s = make_sched(prefill_max_requests=2)
    for i in range(5):
        s.add_request(req(f"r{i}", prompt(10, i), n=2))
    out = s.step()
    assert out is not None and out.batch_size == 2
    run_all(s)


def test_max_running_requests_limits_admission() -> None:
    s = make_sched(max_running_requests=2)
    rs = [req(f"r{i}", prompt(10, i), n=5) for i in range(4)]
    for r in rs:
        s.add_request(r)
    s.step()
    assert len(s.running) == 2 and len(s.waiting) == 2
    s.step()
    assert s.batch_is_full and len(s.running) == 2
    run_all(s)


# ---- retraction -----------------------------------------------------------------------------


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_retraction_under_a_tiny_pool_keeps_outputs_identical(compat: str) -> None:
    # Staggered arrivals: running requests reserve only ratio x remaining, so the pool is
    # overcommitted and decode runs out of memory.
    s = make_sched(kv=220, compat=compat, chunked_prefill_size=-1)
    rs = [req(f"r{i}", prompt(20, i), n=40) for i in range(4)]
    for r in rs:
        s.add_request(r)
        for _ in range(2):
            s.step()
            s.check_integrity()
    run_all(s)
    assert s.stats.retractions > 0
    assert any(r.retraction_count > 0 for r in rs)
    for r in rs:
        assert r.output_ids == reference_output(r.prompt_ids, 40, s.runner)  # type: ignore[arg-type]


def test_retracted_request_keeps_seniority_in_radixsched_mode() -> None:
    s = make_sched(kv=220, chunked_prefill_size=-1)
    rs = [req(f"r{i}", prompt(40, i), n=40) for i in range(4)]
    for i, r in enumerate(rs):
        s.add_request(r, now=float(i))
    for _ in range(200):
        out = s.step()
        s.check_integrity()
        if out is not None and out.retracted:
            victim = out.retracted[0]
            assert victim.queue_entry_time == float(rs.index(victim))
            late = req("late", prompt(5, 9), n=1)
            s.add_request(late)
            # The retracted request sits ahead of the later arrival.
            assert s.waiting.index(victim) < s.waiting.index(late)
            break
    else:
        pytest.fail("no retraction happened")
    run_all(s)


# ---- priority -------------------------------------------------------------------------------


def test_priority_preemption_frees_a_slot_for_an_important_request() -> None:
    s = make_sched(
        max_running_requests=2,
        enable_priority_scheduling=True,
        priority_scheduling_preemption_threshold=5,
    )
    low = [req(f"low{i}", prompt(10, i), n=30, priority=0) for i in range(2)]
    for r in low:
        s.add_request(r)
    s.step()
    assert len(s.running) == 2
    vip = req("vip", prompt(10, 7), n=3, priority=100)
    s.add_request(vip)
    out = s.step()
    assert out is not None and any(r is vip for r, _ in out.new_tokens)
    assert s.stats.preemptions == 1
    assert sum(r.preemption_count for r in low) == 1
    run_all(s)
    for r in [*low, vip]:
        assert r.output_ids == reference_output(r.prompt_ids, r.max_new_tokens, s.runner)  # type: ignore[arg-type]


def test_no_preemption_below_threshold() -> None:
    s = make_sched(max_running_requests=2, enable_priority_scheduling=True)
    for i in range(2):
        s.add_request(req(f"low{i}", prompt(10, i), n=30, priority=0))
    s.step()
    s.add_request(req("mid", prompt(10, 7), n=3, priority=10))  # diff 10 is not > 10
    s.step()
    assert s.stats.preemptions == 0
    run_all(s)


def test_priority_rejected_when_disabled_with_abort_flag() -> None:
    s = make_sched(abort_on_priority_when_disabled=True)
    res = s.add_request(req("a", prompt(10), priority=3))
    assert not res.accepted and res.status_code == 503 and "priority" in res.message.lower()
    assert s.add_request(req("b", prompt(10))).accepted


# ---- queue limit and abort --------------------------------------------------------------------


def test_queue_limit_rejects_at_the_door() -> None:
    s = make_sched(max_queued_requests=2)
    assert s.add_request(req("a", prompt(10))).accepted
    assert s.add_request(req("b", prompt(10, 1))).accepted
    res = s.add_request(req("c", prompt(10, 2)))
    assert not res.accepted and res.status_code == 503
    assert [r.rid for r in s.waiting] == ["a", "b"]
    run_all(s)


def test_queue_limit_displaces_less_important_with_priority_scheduling() -> None:
    s = make_sched(max_queued_requests=1, enable_priority_scheduling=True)
    a = req("a", prompt(10), priority=1)
    s.add_request(a)
    assert s.add_request(req("b", prompt(10, 1), priority=5)).accepted
    assert a.finish is not None and a.finish.reason is FinishReason.ABORT
    run_all(s)


def test_retracted_requests_never_hit_the_queue_limit() -> None:
    s = make_sched(kv=220, chunked_prefill_size=-1, max_queued_requests=4)
    rs = [req(f"r{i}", prompt(40, i), n=40) for i in range(4)]
    for r in rs:
        s.add_request(r)
    run_all(s)
    assert s.stats.retractions > 0
    assert all(r.finish is not None and r.finish.reason is FinishReason.LENGTH for r in rs)


@pytest.mark.parametrize("state", ["waiting", "chunked", "running"])
def test_abort_in_every_state_releases_everything(state: str) -> None:
    s = make_sched(chunked_prefill_size=32)
    r = req("a", prompt(100 if state == "chunked" else 20), n=50)
    other = req("b", prompt(20, 5), n=5)
    s.add_request(r)
    s.add_request(other)
    if state != "waiting":
        s.step()
        s.check_integrity()
    if state == "chunked":
        assert s.chunked_req is r
    if state == "running":
        s.step()
        assert r in s.running
    assert s.abort("a")
    s.check_integrity()
    assert r.finish is not None and r.finish.reason is FinishReason.ABORT
    assert r.lock_node is None and len(r.kv_row) == 0
    assert not s.abort("a")
    run_all(s)
    assert other.output_ids == reference_output(other.prompt_ids, 5, s.runner)  # type: ignore[arg-type]


def test_prompt_too_long_is_rejected_at_the_door() -> None:
    s = make_sched(kv=100)
    res = s.add_request(req("a", prompt(150)))
    assert not res.accepted and res.status_code == 400
    assert s.is_idle


def test_max_new_tokens_is_capped_by_capacity() -> None:
    s = make_sched(kv=100)
    r = req("a", prompt(50), n=1000)
    assert s.add_request(r).accepted
    assert r.max_new_tokens <= 100 - 50
    run_all(s)


# ---- scheduling never changes results --------------------------------------------------------

POLICY_NAMES = sorted(POLICIES)


def _workload(seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1000, 60) for _ in range(3)]
    out = []
    for i in range(16):
        p = np.concatenate([systems[i % 3], rng.integers(0, 1000, int(rng.integers(1, 30)))])
        out.append(
            req(f"r{i}", p, n=int(rng.integers(1, 25)), routing_key=f"k{i % 2}", tenant=f"t{i % 2}")
        )
    return out


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("cache_on", [True, False])
def test_every_policy_produces_the_same_tokens_as_fcfs(policy: str, cache_on: bool) -> None:
    if policy == "shortest-prefill-first" and not cache_on:
        pytest.skip("shortest-prefill-first requires prefix caching")
    runner = FakeRunner(2000)
    cfg = SchedulerConfig(
        schedule_policy=policy, disable_radix_cache=not cache_on, chunked_prefill_size=48
    )
    eng = Engine(runner, cfg, kv_slots=700, clock=VirtualClock())
    reqs = _workload(1)
    outs = eng.generate(reqs, check_integrity=True)
    for r, o in zip(reqs, outs, strict=True):
        assert o.output_ids == reference_output(r.prompt_ids, r.max_new_tokens, runner), r.rid


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICY_NAMES),
    kv=st.integers(min_value=150, max_value=1200),
    page=st.sampled_from([1, 4]),
    chunk=st.sampled_from([-1, 32, 64]),
    compat=st.sampled_from(["radixsched", "sglang"]),
    mixed=st.booleans(),
    arrivals=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(1, 20), st.integers(0, 3)),
        min_size=1,
        max_size=12,
    ),
)
def test_random_arrivals_keep_invariants_and_finish(
    policy: str,
    kv: int,
    page: int,
    chunk: int,
    compat: str,
    mixed: bool,
    arrivals: list[tuple[int, int, int, int]],
) -> None:
    systems = [prompt(48, s) for s in range(3)]
    cfg = SchedulerConfig(
        schedule_policy=policy,
        page_size=page,
        chunked_prefill_size=chunk,
        compat=compat,  # type: ignore[arg-type]
        enable_mixed_chunk=mixed and chunk > 0,
    )
    runner = FakeRunner(kv + 2 * page + 8)
    s = Scheduler(cfg, runner, kv_slots=kv, clock=VirtualClock())
    reqs: list[Req] = []
    pending = list(enumerate(arrivals))
    steps = 0
    while pending or not s.is_idle:
        # Deliver up to two arrivals between steps.
        for _ in range(2):
            if pending:
                i, (grp, extra, n, _unused) = pending.pop(0)
                r = req(f"r{i}", np.concatenate([systems[grp], prompt(extra, 100 + i)]), n=n)
                if s.add_request(r).accepted:
                    reqs.append(r)
        out = s.step()
        s.check_integrity()
        steps += 1
        assert steps < 5000
        if out is None:
            assert s.is_idle
    for r in reqs:
        assert r.finish is not None
        if r.finish.reason is FinishReason.LENGTH:
            assert r.output_ids == reference_output(r.prompt_ids, r.max_new_tokens, runner)
    assert s.cache.protected_size() == 0


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_request_sharing_an_in_flight_chunked_prefix_waits_for_it(compat: str) -> None:
    """B shares A's 170-token prompt head. While A's prefix is being computed chunk by chunk,
    radixsched keeps B waiting so B reuses it from the cache; SGLang admits B next to A's
    continuation and computes the shared tokens twice."""
    s = make_sched(chunked_prefill_size=64, compat=compat, schedule_policy="lpm")
    head = prompt(170)
    # A's chunks: [0, 64), [64, 128), [128, 174): the last leaves 18 tokens of budget for B.
    a = req("a", np.concatenate([head, prompt(4, 1)]), n=2)
    b = req("b", np.concatenate([head, prompt(10, 2)]), n=2)
    s.add_request(a)
    s.step()  # A's first chunk
    s.add_request(b)
    run_all(s)
    for r in (a, b):
        assert r.output_ids == reference_output(r.prompt_ids, 2, s.runner)  # type: ignore[arg-type]
    if compat == "radixsched":
        assert b.cached_tokens == 170 and b.computed_prefill_tokens == 10
    else:
        assert b.cached_tokens == 128 and b.computed_prefill_tokens == 52


@pytest.mark.parametrize("cache_on", [True, False])
@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_a_chunked_prefill_is_retracted_before_any_running_request_is_aborted(
    cache_on: bool, compat: str
) -> None:
    """Every request fits the pool alone, so none may be aborted: when decode runs out of
    memory while a chunked prefill holds KV, the chunked request is retracted first."""
    s = make_sched(
        kv=160,
        chunked_prefill_size=32,
        disable_radix_cache=not cache_on,
        compat=compat,
    )
    rs = [req(f"r{i}", prompt(60, i), n=35) for i in range(8)]
    for r in rs:
        s.add_request(r)
    run_all(s)
    assert s.stats.aborted == 0
    for r in rs:
        assert r.output_ids == reference_output(r.prompt_ids, 35, s.runner)  # type: ignore[arg-type]


@pytest.mark.parametrize("extra", [0, 1, 2, 3])
def test_prompts_at_the_edge_of_capacity_generate_or_are_rejected(extra: int) -> None:
    """A prompt right at the limit either gets room for at least one token or is rejected at
    the door; never admitted with a zero budget."""
    s = make_sched(kv=64)
    r = req("a", prompt(58 + extra), n=50)
    res = s.add_request(r)
    if res.accepted:
        assert r.max_new_tokens >= 1
        run_all(s)
        assert r.finish is not None and r.finish.reason is FinishReason.LENGTH
    else:
        assert res.status_code == 400


def test_fcfs_order_hint_changes_nothing() -> None:
    """radixsched fcfs skips its sort while the scheduler knows the queue is in entry order;
    the schedule must be identical to sorting every round."""

    def run(hint: bool) -> list[tuple[str, list[int], float | None]]:
        s = make_sched(kv=220, chunked_prefill_size=32)
        s._fcfs_keeps_order = hint
        rs = [req(f"r{i}", prompt(20 + 3 * i, i), n=30) for i in range(10)]
        for i, r in enumerate(rs):
            s.add_request(r, now=float(i // 3))
            s.step()
        run_all(s)
        assert s.stats.retractions > 0
        return [(r.rid, r.output_ids, r.times.first_token) for r in rs]

    assert run(True) == run(False)


def test_chunk_continuation_never_outgrows_memory_even_in_compat() -> None:
    """Found by the property test: SGLang's continuation ignores memory and its allocation can
    fail; both modes cap the continuation at the memory that is there."""
    test_random_arrivals_keep_invariants_and_finish.hypothesis.inner_test(  # type: ignore[attr-defined]
        policy="shortest-prefill-first",
        kv=205,
        page=1,
        chunk=32,
        compat="sglang",
        mixed=False,
        arrivals=[(0, 40, 1, 0), (2, 25, 2, 0), (2, 38, 2, 0), (0, 7, 2, 0)],
    )


@pytest.mark.parametrize("compat", ["sglang", "radixsched"])
def test_a_cut_continuation_leaves_no_room_for_a_second_chunked_request(compat: str) -> None:
    """Found by the equivalence fuzz: the disabled cache's ignore-eos admission chunked a new
    request beside a continuation that was cut to whole pages short of the chunk budget (a
    mixed decode token took one), leaving two chunked requests at once."""
    s = make_sched(
        kv=1500,
        compat=compat,
        page_size=4,
        chunked_prefill_size=64,
        disable_radix_cache=True,
        enable_mixed_chunk=True,
    )
    reqs = [Req(f"r{i}", prompt(96, i), SamplingParams(2, ignore_eos=True)) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    run_all(s)
    assert all(r.finished and len(r.output_ids) == 2 for r in reqs)


def test_retraction_orders_newest_pops_the_last_joined_length_the_fewest_outputs() -> None:
    from radixsched.running import RETRACTION_ORDERS, retraction_order

    reqs = [Req(f"r{i}", [1] * (10 + i), SamplingParams(max_new_tokens=50)) for i in range(3)]
    out = [5, 1, 9]  # r1 has the fewest output tokens, r2 joined last
    assert retraction_order(reqs, out, "newest", 1).pop().rid == "r2"
    assert retraction_order(reqs, out, "length", 1).pop().rid == "r1"
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(SchedulerConfig)}["retraction_policy"]
    assert field.metadata["choices"] == list(RETRACTION_ORDERS) == ["length", "priority", "newest"]


def test_the_optimal_bound_counts_hits_in_the_same_blocks() -> None:
    """With hits in whole blocks, the optimal hit rate (the bound a run is shown against) is
    cut to the same blocks."""
    from radixsched.results.optimal import optimal_hit_rate

    p = prompt(40)
    reqs = [req("a", p), req("b", np.concatenate([p, prompt(8, 1)]))]
    for i, r in enumerate(reqs):
        r.arrival_time = float(i)
    config = SchedulerConfig(cache_block_size=16)
    assert config.hit_unit == 16 and SchedulerConfig(page_size=4).hit_unit == 4
    assert optimal_hit_rate(reqs, SchedulerConfig().hit_unit) == 40 / 88
    assert optimal_hit_rate(reqs, config.hit_unit) == 32 / 88
