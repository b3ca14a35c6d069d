"""The prefill step's Python glue with fewer calls: the queue's reads of its frozen setup, the
round's refresh count without ``refresh``'s call, the requeue's arrival-order test, the arrivals
bound to a replica once, and the chunked step's early-out before ``_native_chunks``; each the
same as the reference (or the call it replaces) on tiny deterministic cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.config import SchedulerConfig
from radixsched.native import arrive, core
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.queue import REFRESH_INTERVAL, WaitingQueue
from radixsched.request import Req, SamplingParams

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _queue(policy: str, **cfg: Any) -> NativeWaitingQueue:
    config = SchedulerConfig(schedule_policy=policy, **cfg)
    return NativeWaitingQueue(config, NativeRadixCache(None))


def _fill(q: NativeWaitingQueue, n: int) -> None:
    for i in range(n):
        toks = np.asarray([i % 3, i % 5, i, i + 1], dtype=np.int32)
        q.add(Req(f"r{i}", toks, arrival_time=float(i)))


@pytest.mark.parametrize(
    ("policy", "prio"), [("lpm", False), ("fcfs", False), ("fcfs", True), ("dfs-weight", False)]
)
def test_the_frozen_reads_are_the_methods_answers(policy: str, prio: bool) -> None:
    q = _queue(policy, enable_priority_scheduling=prio)
    assert q._fcfs == q._plain_fcfs() == (policy == "fcfs" and not prio)
    assert q._capped == (q.policy.capped and q.cap is not None)
    assert q.active_policy() is q.policy  # not capped: the configured policy


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (1, 0, 2, 3), (0, 1, 3, 2), (3, 2, 1, 0)])
def test_the_arrival_order_test_is_the_references(order: tuple[int, ...]) -> None:
    q = _queue("lpm")
    _fill(q, 4)
    q.reqs[:] = [q.reqs[i] for i in order]
    want = WaitingQueue._in_arrival_order(q)
    q._arrival_known = False
    assert q._in_arrival_order() is want
    assert q._arrival_known is want  # known while the list keeps its order (either answer)


def test_a_requeue_asks_the_arrival_order_once_and_forgets_it() -> None:
    q = _queue("lpm")
    _fill(q, 4)
    taken = q.take([1])
    q.reqs.reverse()  # out of arrival order: the requeued request is appended
    q._arrival_known = False
    seen: list[bool] = []
    real = NativeWaitingQueue._in_arrival_order

    def counting(self: NativeWaitingQueue) -> bool:
        seen.append(self._arrival_settled)
        return real(self)

    NativeWaitingQueue._in_arrival_order = counting  # type: ignore[method-assign]
    try:
        q.requeue(taken, 10.0, 0)
    finally:
        NativeWaitingQueue._in_arrival_order = real  # type: ignore[method-assign]
    assert seen == [False, True]  # the reference's requeue got the known answer
    assert q.reqs[-1] is taken[0] and not q._arrival_settled


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_rounds_count_refreshes_as_refresh_does(policy: str) -> None:
    """A round that is not due is only counted: the count and the touches are ``refresh``'s."""
    q = _queue(policy)
    _fill(q, 3)
    calls: list[int] = []
    real = q.refresh

    def counting(order: Any, head: Any = None) -> None:
        calls.append(q._refresh_rounds)
        real(order, head)

    q.refresh = counting  # type: ignore[method-assign]
    for i in range(2 * REFRESH_INTERVAL + 1):
        q.begin_round([], 0, float(i))
    assert q._refresh_rounds == 2 * REFRESH_INTERVAL + 1
    assert calls == [0, REFRESH_INTERVAL, 2 * REFRESH_INTERVAL]  # only the due rounds call it
    q.reqs.clear()
    q.added.clear()
    q.synced = False
    q.begin_round([], 0, 99.0)  # an empty queue: ``refresh`` decides (it does not count)
    assert q._refresh_rounds == 2 * REFRESH_INTERVAL + 1


def test_a_replica_binds_its_arrivals_once() -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica, deliver_batch
    from radixsched.sim.simulate import SimConfig

    sim = SimConfig(max_total_tokens=20_000)
    rep = _build_replica(0, SchedulerConfig(), sim, build_cost_model(sim), 20_000)
    assert rep.arrive is None
    reqs = [
        Req(f"a{i}", np.arange(50, dtype=np.int32) + i, SamplingParams(max_new_tokens=4))
        for i in range(3)
    ]
    deliver_batch(reqs[:2], rep)
    bound = rep.arrive
    deliver_batch(reqs[2:], rep)
    assert bound is not None and rep.arrive is bound
    assert [r.rid for r in rep.sched.waiting] == ["a0", "a1", "a2"] and rep.reqs == reqs


def test_arrivals_fall_back_one_by_one_under_a_queue_limit() -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica
    from radixsched.sim.simulate import SimConfig

    sim = SimConfig(max_total_tokens=20_000)
    cfg = SchedulerConfig(max_queued_requests=1)
    sched = _build_replica(0, cfg, sim, build_cost_model(sim), 20_000).sched
    reqs = [
        Req(f"q{i}", np.arange(50, dtype=np.int32) + i, SamplingParams(max_new_tokens=4))
        for i in range(3)
    ]
    arrive.arrivals(sched)(reqs)
    assert [r.rid for r in sched.waiting] == ["q0"]  # the door refused the others


@pytest.mark.parametrize("priority", [False, True])
def test_the_native_admission_preempts_only_where_configured(
    priority: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preempt callback is built for each round under priority preemption (a round of the
    Python adder), never for a fast step's budgets; the run is the reference's either way."""
    import copy

    import golden
    from radixsched.native import admit as admission
    from radixsched.sim.simulate import SimConfig, simulate
    from radixsched.sim.workloads.load import load_workload

    built = {"calls": 0}
    real = admission._preempter

    def counting(*a: Any) -> Any:
        built["calls"] += 1
        return real(*a)

    monkeypatch.setattr(admission, "_preempter", counting)
    w = load_workload("shared-prefix:groups=2,prompts=4,system_len=64,question_len=16,output_len=8")
    cfg = SchedulerConfig(schedule_policy="fcfs", enable_priority_scheduling=priority)
    sim = SimConfig(max_total_tokens=4000)
    fast = simulate(copy.deepcopy(w), cfg, sim, accelerate=True, check_integrity=True)
    ref = simulate(copy.deepcopy(w), cfg, sim, accelerate=False)
    assert golden.observe(fast)["trace"] == golden.observe(ref)["trace"]
    assert (built["calls"] > 0) == priority


@pytest.mark.parametrize("page", [1, 4])
def test_arrivals_without_a_matcher_match_at_the_door_as_add_does(page: int) -> None:
    """fcfs keeps no matcher: the batch's door match is ``add``'s, a whole cached fill capped
    at ``fill_len - 1`` and cut to whole pages, each in its own namespace."""
    from radixsched.cache import CacheKey

    def fill(q: NativeWaitingQueue) -> list[Req]:
        cached = np.arange(16, dtype=np.int32)
        q.cache.insert(CacheKey(cached), np.arange(1, 17, dtype=np.int64))
        return [
            Req("whole", cached.copy(), arrival_time=1.0),  # all cached: capped
            Req("part", np.concatenate([cached[:9], [99, 98]]).astype(np.int32), arrival_time=2.0),
            Req("other-ns", cached.copy(), arrival_time=3.0, extra_key="x"),
            Req("none", np.asarray([7, 7, 7], dtype=np.int32), arrival_time=4.0),
            Req("salted", cached.copy(), arrival_time=5.0, cache_salt="s"),  # its own namespace
        ]

    config = SchedulerConfig(schedule_policy="fcfs", page_size=page)
    one, many = (NativeWaitingQueue(config, NativeRadixCache(None, page)) for _ in range(2))
    assert one.matcher is None and many.matcher is None
    a, b = fill(one), fill(many)
    for r in a:
        one.add(r)
    many.add_many(b)
    got = [(r.rid, r.num_matched_prefix_tokens) for r in many.reqs]
    assert got == [(r.rid, r.num_matched_prefix_tokens) for r in one.reqs]
    assert got[0] == ("whole", 15 // page * page) and got[2][1] == 0 == got[3][1] == got[4][1]
    assert [many._seq_of[id(r)] for r in b] == [0, 1, 2, 3, 4] and many.added == b


@pytest.mark.parametrize(("ahead", "running"), [(0, False), (0, True), (8, False), (8, True)])
def test_the_continuation_checkpoints_first_as_continue_chunked_does(
    ahead: int, running: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``steps.continuation`` starts with ``_continue_chunked``'s setup (the last chunk
    checkpointed where it ran past the prefix; an empty batch is not full), whatever the
    native plan then says (here: a round ``covers`` leaves to Python, None)."""
    from types import SimpleNamespace

    from radixsched.native import admit as admission
    from radixsched.native import step as steps

    checkpoints: list[tuple[str, int]] = []
    monkeypatch.setattr(admission, "covers", lambda s, adder: False)
    req = Req("c", np.arange(64, dtype=np.int32))
    req.prefix_len, req.extend_end = 16, 16 + ahead
    batch = SimpleNamespace(reqs=[req] if running else [], decode_tokens=lambda clip: (0, 0))
    s = SimpleNamespace(
        config=SchedulerConfig(chunked_prefill_size=32),
        _chunk=32,
        ratio=SimpleNamespace(current=0.5),
        batch=batch,
        batch_is_full=True,
        kv=SimpleNamespace(checkpoint=lambda r, up_to: checkpoints.append((r.rid, up_to))),
    )
    assert steps.continuation(s, req) is None  # type: ignore[arg-type]
    assert checkpoints == ([("c", 16 + ahead)] if ahead else [])
    assert s.batch_is_full is running


@pytest.mark.parametrize(("ahead", "running"), [(0, False), (0, True), (8, False), (8, True)])
def test_the_limited_continuation_checkpoints_first_as_prefill_round_does(
    ahead: int, running: bool
) -> None:
    """``steps.limited`` starts with ``prefill_round``'s and ``_build_prefill``'s setup (the
    last chunk checkpointed where it ran past the prefix; an empty batch is not full) before
    it orders the queue (stopped there)."""
    from types import SimpleNamespace

    from radixsched.native import step as steps

    class Ordered(Exception):
        pass

    def order(*args: Any) -> None:
        raise Ordered

    checkpoints: list[tuple[str, int]] = []
    req = Req("c", np.arange(64, dtype=np.int32))
    req.prefix_len, req.extend_end = 16, 16 + ahead
    s = SimpleNamespace(
        config=SchedulerConfig(chunked_prefill_size=32),
        _chunk=32,
        ratio=SimpleNamespace(current=0.5),
        batch=SimpleNamespace(reqs=[req] if running else []),
        batch_is_full=True,
        kv=SimpleNamespace(checkpoint=lambda r, up_to: checkpoints.append((r.rid, up_to))),
        queue=SimpleNamespace(begin_round=order),
        processed_tokens=0,
        clock=SimpleNamespace(now=lambda: 0.0),
    )
    with pytest.raises(Ordered):
        steps.limited(s, req, None)  # type: ignore[arg-type]
    assert checkpoints == ([("c", 16 + ahead)] if ahead else [])
    assert s.batch_is_full is running


def test_the_limited_rounds_budgets_are_new_adders(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk-limit policy's continued round admits on budgets as ``new_adder`` starts them:
    exclusive chunking (no second chunked request beside a capped one)."""
    from radixsched.native import step as steps
    from radixsched.native.build import build_scheduler
    from radixsched.sim.cost.build import load_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    cfg = SchedulerConfig(schedule_policy="shortest-prefill-first", chunked_prefill_size=64)
    s = build_scheduler(
        cfg, CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=1), kv_slots=4096
    )
    seen: list[tuple[bool, bool]] = []
    orig = steps.continued

    def noting(sched: Any, adder: Any, *args: Any) -> Any:
        seen.append((adder.exclusive_chunking, s.new_adder().exclusive_chunking))
        return orig(sched, adder, *args)

    monkeypatch.setattr(steps, "continued", noting)
    rng = np.random.default_rng(2)
    s.add_request(Req("long", rng.integers(0, 999, 300).astype(np.int32)), now=0.0)
    s.step()  # chunked
    s.add_request(Req("short", rng.integers(0, 999, 20).astype(np.int32)), now=0.001)
    while not s.is_idle:
        s.step()
    assert seen and all(got == want is True for got, want in seen)


@pytest.mark.parametrize(
    ("policy", "prio", "want"),
    [
        ("fcfs", False, True),
        ("fcfs", True, False),
        ("lpm", False, False),
        ("lof", False, False),
        ("random", False, False),
    ],
)
def test_only_plain_fcfs_rounds_skip_the_round_object(policy: str, prio: bool, want: bool) -> None:
    assert _queue(policy, enable_priority_scheduling=prio)._fcfs_round is want


def test_a_plain_fcfs_round_is_the_references() -> None:
    """Out of entry order (a request moved to the front after a requeue): both sort it."""
    config = SchedulerConfig(schedule_policy="fcfs")
    fast, ref = _queue("fcfs"), WaitingQueue(config, NativeRadixCache(None))
    heads = []
    for q in (fast, ref):
        _fill(q, 5)  # type: ignore[arg-type]
        q.begin_round([], 0, 0.0)
        taken = q.take([1])
        q.requeue(taken, 10.0, 0)
        q.reqs.insert(0, q.reqs.pop())  # moved behind the queue's back: the round re-sorts
        if q is fast:
            fast.entry_ordered = False
        order = q.begin_round([], 0, 11.0)
        heads.append(([r.rid for r in order.head(9)], q.deferred, q._refresh_rounds))
    assert heads[0] == heads[1] and heads[0][0] == ["r0", "r1", "r2", "r3", "r4"]
    assert fast.entry_ordered and fast.added == [] and not fast.synced


def test_take_reads_its_fixed_arguments_once() -> None:
    q = _queue("lpm")
    m = q.matcher
    assert m is not None and q._take_fixed is not None
    assert q._take_fixed[:3] == (m._tree, m._fills, m.reqs)
    assert q._take_fixed[3:] == q._engine_removal
    plain = _queue("fcfs")
    assert plain.matcher is None and plain._take_fixed == (None, None, None, None, None)
    compat = _queue("shortest-prefill-first", compat="sglang")
    assert compat.matcher is not None and compat.matcher.keys is not None
    assert compat._take_fixed is None  # compat keys: the Python take


def test_the_decode_run_evicts_through_the_trees_call_unless_evict_is_someone_elses() -> None:
    import functools

    from radixsched.native.scheduler import _evictor
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica
    from radixsched.sim.simulate import SimConfig

    sim = SimConfig(max_total_tokens=20_000)
    cache = _build_replica(0, SchedulerConfig(), sim, build_cost_model(sim), 20_000).sched.cache
    got = _evictor(cache)
    assert isinstance(got, functools.partial) and got.args == (cache.allocator,)
    assert got(10) == cache.evict(10) == 0  # (nothing held)
    own = lambda n: 0  # noqa: E731  # an instance's own evict: kept
    cache.evict = own
    assert _evictor(cache) is own
    del cache.evict
    pool, cache.allocator = cache.allocator, object()  # not the native pool: evict's own test
    assert _evictor(cache) == cache.evict
    cache.allocator = pool


def test_a_native_scheduler_makes_its_native_pool_without_a_token_allocator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool is the native one of the same slots (the reference's ``TokenAllocator``, a
    B200's 40 MB of pages, is never built to be replaced)."""
    from radixsched.cache import allocator
    from radixsched.native.build import build_scheduler
    from radixsched.sim.cost.build import load_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    def refused(*args: Any) -> None:
        raise AssertionError("a TokenAllocator was built")

    monkeypatch.setattr(allocator.TokenAllocator, "__init__", refused)
    runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=1)
    s = build_scheduler(SchedulerConfig(page_size=16), runner, kv_slots=4100)
    assert type(s.allocator) is core().Pool
    assert s.capacity == s.allocator.total_size == 4096 == s.allocator.available_size()
