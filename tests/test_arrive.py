"""The simulator's batched arrivals (``native/arrive.py``: ``add_arrivals``, the queue's
``add_many`` and the matcher's ``track_many``) and the native retirement of finished requests
(``native/retire.py``: ``DecodeBatch.retire``) against the one-at-a-time Python they stand for,
and each shown to fire."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import golden
from radixsched.config import SchedulerConfig
from radixsched.native import arrive, core, retire
from radixsched.native import scheduler as fast_scheduler
from radixsched.native.matching import NativeMatcher
from radixsched.request import Req, SamplingParams
from radixsched.sim.deploy import open_loop
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _replica(**cfg: Any) -> Any:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=20_000)
    return _build_replica(0, SchedulerConfig(**cfg), sim, build_cost_model(sim), 20_000)


def _warm(sched: Any) -> None:
    """A cache with content: two requests served."""
    for i in range(2):
        prompt = np.arange(200, dtype=np.int32) + 1000 * i
        sched.add_request(Req(f"w{i}", prompt, SamplingParams(max_new_tokens=3)), now=0.0)
    while not sched.is_idle:
        sched.step()


def _arrivals(n: int, t0: float) -> list[Req]:
    """``n`` arrivals at ``t0`` on: cached prefixes, a duplicate id, a bad max_new_tokens,
    a prompt that does not fit, one capped to fit, priorities and namespaces (an extra key, a
    salt)."""
    out = []
    for i in range(n):
        prompt = np.concatenate([np.arange(120 + i, dtype=np.int32) + 1000 * (i % 2), [7 + i]])
        if i == 3:
            prompt = np.zeros(30_000, dtype=np.int32)  # does not fit: rejected
        max_new = {4: 0, 6: 10**6}.get(i, 5 + i)  # 0: rejected; 10**6: capped
        sampling = SamplingParams(max_new_tokens=max_new)
        rid = "a1" if i == 2 else f"a{i}"  # a2 takes a1's id: rejected as a duplicate
        r = Req(rid, prompt.astype(np.int32), sampling, priority=i % 3 if i % 2 else None)
        if i == 5:
            r = dataclasses.replace(r, extra_key="ns")
        if i == 1:  # a salt alone: its own namespace (the warm prefix is not its)
            r = dataclasses.replace(r, cache_salt="salt")
        r.arrival_time = t0 + 0.001 * i
        out.append(r)
    return out


def _queue_state(sched: Any, reqs: list[Req]) -> Any:
    q = sched.queue
    memo = q.matcher.memo if q.matcher is not None else {}
    seq = {r.rid: q._seq_of.get(id(r)) for r in reqs}
    return (
        [r.rid for r in q.reqs],
        [
            (
                r.num_matched_prefix_tokens,
                r.queue_entry_time,
                r.arrival_time,
                r.times.arrival,
                r.queue_entry_processed_tokens,
                r.priority,
            )
            for r in reqs
        ],
        [(r.finish, r.sampling.max_new_tokens) for r in reqs],
        [(m.n, m.offset, m.full) if (m := memo.get(id(r))) else None for r in reqs],
        sorted(sched._by_rid),
        seq,
        sched.stats.rejected,
        q.entry_ordered,
        q._last_entry,
        [r.rid for r in q.added],
    )


def _served(sched: Any, reqs: list[Req]) -> list[Any]:
    while not sched.is_idle:
        sched.step()
    sched.sync_running()
    return [(r.rid, r.output_ids, r.times.token_times, r.times.finish, r.finish) for r in reqs]


@contextmanager
def _calls(obj: Any, name: str) -> Iterator[list[Any]]:
    """Each call's (arguments, result)."""
    got: list[Any] = []
    orig = getattr(obj, name)

    def counting(*a: Any, **kw: Any) -> Any:
        out = orig(*a, **kw)
        got.append((a, out))
        return out

    setattr(obj, name, counting)
    try:
        yield got
    finally:
        setattr(obj, name, orig)


@pytest.mark.parametrize("n", [0, 1, 2, 7])
@pytest.mark.parametrize("priority", [False, True])
def test_batched_arrivals_equal_one_at_a_time(n: int, priority: bool) -> None:
    # lpm tracks matches natively; fcfs by priority matches at the door only
    cfg: dict[str, Any] = {"schedule_policy": "lpm"}
    if priority:
        cfg = {"enable_priority_scheduling": True, "default_priority_value": 9}
    one, many = _replica(**cfg).sched, _replica(**cfg).sched
    _warm(one)
    _warm(many)
    a, b = _arrivals(n, one.clock.now()), _arrivals(n, many.clock.now())
    for r in a:
        one.add_request(r, now=r.arrival_time)
    with _calls(NativeMatcher, "track_many") as batched:
        arrive.add_arrivals(many, b)
    assert len(batched) == (1 if n and not priority else 0)  # one call for several
    assert _queue_state(one, a) == _queue_state(many, b)
    assert _served(one, a) == _served(many, b)


@pytest.mark.parametrize(
    "order", [(0, 1, 2, 3), (2, 0, 1, 3), (3, 2, 1, 0), (1, 0, 2, 3), (0, 0, 1, 1), (1, 0, 0, 2)]
)
def test_batched_arrivals_keep_the_entry_order_flag(order: tuple[int, ...]) -> None:
    """Out-of-order entries in a batch: the queue's entry-order flag stays off once broken,
    as single adds leave it (a later ascending pair does not turn it back on); equal entries
    keep it on."""
    one, many = _replica(schedule_policy="lpm").sched, _replica(schedule_policy="lpm").sched

    def reqs() -> list[Req]:
        out = []
        for i, k in enumerate(order):
            prompt = np.arange(50 + i, dtype=np.int32) + 100 * i
            r = Req(f"e{i}", prompt, SamplingParams(max_new_tokens=4))
            r.arrival_time = 1.0 + 0.01 * k
            out.append(r)
        return out

    a, b = reqs(), reqs()
    for r in a:
        one.add_request(r, now=r.arrival_time)
    arrive.add_arrivals(many, b)
    assert one.queue.entry_ordered == (list(order) == sorted(order))
    assert many.queue.entry_ordered == one.queue.entry_ordered
    assert _queue_state(one, a) == _queue_state(many, b)


@pytest.mark.parametrize("max_new", [19_870, 19_871, 19_872, 19_886, 19_887, 19_888, 2**63, 10**30])
def test_batched_arrivals_cap_as_the_door_does_on_pages(max_new: int) -> None:
    """Pages of 16: a 100-token prompt's cap is what its whole pages and one more leave
    (20,000 - 112 - 16 - 1 = 19,871), not what the prompt's pages alone leave."""
    one, many = _replica(page_size=16).sched, _replica(page_size=16).sched

    def req() -> Req:
        prompt = np.arange(100, dtype=np.int32)
        r = Req("p", prompt, SamplingParams(max_new_tokens=max_new))
        r.arrival_time = 0.0
        return r

    a, b = req(), req()
    one.add_request(a, now=0.0)
    arrive.add_arrivals(many, [b])
    assert a.sampling.max_new_tokens == b.sampling.max_new_tokens == min(max_new, 19_871)


def test_batched_arrivals_fall_back_under_a_queue_limit() -> None:
    cfg = {"schedule_policy": "lpm", "max_queued_requests": 2}
    one, many = _replica(**cfg).sched, _replica(**cfg).sched
    a, b = _arrivals(6, 0.0), _arrivals(6, 0.0)
    for r in a:
        one.add_request(r, now=r.arrival_time)
    with _calls(NativeMatcher, "track_many") as batched:
        arrive.add_arrivals(many, b)
    assert not batched
    assert _queue_state(one, a) == _queue_state(many, b)


def _burst() -> Workload:
    """Bursts of arrivals while the replica is busy: most are due when the loop delivers."""
    return load_workload(
        "shared-prefix:groups=6,prompts=6,system_len=300,question_len=40,output_len=30",
        request_rate=200.0,
    )


def _with_stops(w: Workload) -> Workload:
    """Every other request may stop on id 7, which its script never reaches."""
    reqs = []
    for i, r in enumerate(w.requests):
        if i % 2 == 0:
            n = r.sampling.max_new_tokens
            sampling = dataclasses.replace(r.sampling, stop_token_ids=(7,))
            out = np.arange(100, 100 + n, dtype=np.int32)
            r = dataclasses.replace(r, sampling=sampling, scripted_output=out)
        reqs.append(r)
    return dataclasses.replace(w, requests=reqs)


def _both(w: Workload) -> tuple[Any, Any]:
    sched, sim = SchedulerConfig(schedule_policy="lpm"), SimConfig(max_total_tokens=8000)
    fast = simulate(w, sched, sim, accelerate=True, check_integrity=True)
    ref = simulate(w, sched, sim, accelerate=False)
    return golden.observe(fast), golden.observe(ref)


def test_the_open_loop_delivers_due_arrivals_together() -> None:
    w = _burst()
    with _calls(open_loop, "deliver_batch") as batches:
        a, b = _both(w)
    assert batches and max(len(args[0]) for args, _ in batches) > 2
    assert a == b and a["finished"] == len(w.requests)


@pytest.mark.parametrize("stops", [False, True])
def test_native_retire_fires_and_declines_rows_that_can_stop(stops: bool) -> None:
    """Plain requests finish in the native call; a batch with a row that can stop falls back
    to the Python check (it declines, changing nothing); both give the reference's run."""
    w = _with_stops(_burst()) if stops else _burst()
    with _calls(fast_scheduler, "retire") as calls:
        a, b = _both(w)
    assert a == b and a["finished"] == len(w.requests)
    took = [out for _, out in calls]
    assert took and all(took) != stops  # plain: always native; with stop rows: some declined


def test_retire_declines_rows_past_their_max_and_changes_nothing() -> None:
    sched = _replica().sched
    for i in range(2):
        sampling = SamplingParams(max_new_tokens=4 + i, ignore_eos=True)
        sched.add_request(Req(f"r{i}", np.arange(64, dtype=np.int32) + i, sampling), now=0.0)
    while sched.waiting:
        sched.step()
    sched.sync_running()
    first = sched.running[0]
    first.output_ids.extend([1] * 10)  # past its max (columns built from it say so)
    sched.batch.cols = fast_scheduler.decode_batch(sched.running, False)
    before = [r.rid for r in sched.running]
    out = _Out()
    assert retire.retire(sched, [0, 1], out) is False  # type: ignore[arg-type]
    assert [r.rid for r in sched.running] == before and first.finish is None
    assert not out.finished and len(sched.batch.cols) == 2


@dataclasses.dataclass
class _Out:
    finished: list[Req] = dataclasses.field(default_factory=list)


def test_retire_drops_finished_rows_anywhere_keeping_the_others_order() -> None:
    """Rows 0, 2 and 5 finish in the same jump: the native call drops them from the running
    list and the columns in one pass, the survivors in their order, the state consistent; the
    jump's tokens (read lazily from the fills it returned) are the ones written."""
    sched = _replica().sched
    lens = [4, 9, 4, 9, 9, 4]
    for i, n in enumerate(lens):
        sampling = SamplingParams(max_new_tokens=n, ignore_eos=True)
        sched.add_request(Req(f"r{i}", np.arange(64, dtype=np.int32) + 100 * i, sampling), now=0.0)
    while sched.waiting:
        sched.step()
    assert [r.rid for r in sched.running] == [f"r{i}" for i in range(6)]
    reqs = list(sched.running)
    before = [len(r.output_ids) for r in reqs]
    with _calls(fast_scheduler, "retire") as calls:
        out = sched.decode_round()
    assert out is not None and calls and all(took for _, took in calls)
    assert [r.rid for r in out.finished] == ["r0", "r2", "r5"]
    assert [r.rid for r in sched.running] == ["r1", "r3", "r4"]
    assert len(sched.batch.cols) == 3
    sched.check_integrity()
    tokens = dict((r.rid, t) for r, t in out.new_tokens)
    sched.sync_running()
    for r, had in zip(reqs, before, strict=True):
        assert r.output_ids[had:] == tokens[r.rid]


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_batched_arrivals_cap_a_whole_cached_prompts_match(policy: str) -> None:
    """A prompt cached whole (matched to its last token) keeps one token to compute: the
    door's match is cut to fill_len - 1, batched as one at a time."""
    one, many = _replica(schedule_policy=policy).sched, _replica(schedule_policy=policy).sched
    _warm(one)
    _warm(many)

    def reqs(t0: float) -> list[Req]:
        out = [Req("whole", np.arange(200, dtype=np.int32), SamplingParams(max_new_tokens=3))]
        out.append(Req("part", np.arange(150, dtype=np.int32), SamplingParams(max_new_tokens=3)))
        for r in out:
            r.arrival_time = t0
        return out

    a, b = reqs(one.clock.now()), reqs(many.clock.now())
    for r in a:
        one.add_request(r, now=r.arrival_time)
    arrive.add_arrivals(many, b)
    assert [r.num_matched_prefix_tokens for r in b] == [199, 149]
    assert _queue_state(one, a) == _queue_state(many, b)
