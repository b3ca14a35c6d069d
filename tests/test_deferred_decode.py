"""Deferred decode state (``Scheduler(defer_decode_state=True)``, what ``simulate`` uses).

A decode jump then advances only the running batch's columns and reserves KV; each request's
tokens, token times, KV slots and ``kv_len`` are written when it leaves the batch or someone
reads it (``sync_running``). It must change nothing observable: every test here compares
deferred runs with eager ones, bit for bit, or checks that the integrity check sees the
deferred state (and its corruption) while it is pending.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cache import IntegrityError, TokenAllocator
from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.scheduler import Scheduler
from radixsched.sim.costmodel import CostModelRunner, load_cost_model
from radixsched.sim.simulate import SimConfig, SimRun, simulate
from radixsched.sim.workloads import Workload, load_workload
from simcases import JUMP_WORKLOADS

# The Mooncake sample in a 60k pool retracts, so victims are settled one by one while the rest
# of the batch stays deferred.
WORKLOADS = JUMP_WORKLOADS


@cache
def _workload(name: str) -> Workload:
    spec, rate, n, _ = WORKLOADS[name]
    return load_workload(spec, request_rate=rate, num_requests=n)


def _trace(r: Req) -> tuple[Any, ...]:
    t = r.times
    return (
        r.rid,
        tuple(r.output_ids),
        tuple(t.token_times),
        t.first_scheduled,
        t.first_token,
        t.finish,
        None if r.finish is None else (r.finish.reason.value, r.finish.status_code),
        r.cached_tokens,
        r.computed_prefill_tokens,
        r.retraction_count,
    )


def _compare(w: Workload, cfg: SchedulerConfig, cap: int | None) -> tuple[SimRun, SimRun]:
    sim = SimConfig(max_total_tokens=cap)
    deferred = simulate(w, cfg, sim, check_integrity=True, defer_decode_state=True)
    eager = simulate(w, cfg, sim, check_integrity=True, defer_decode_state=False)
    a = sorted(map(_trace, deferred.requests))
    b = sorted(map(_trace, eager.requests))
    assert a == b
    ja, jb = deferred.result.to_json(), eager.result.to_json()
    for k in ("wall_s", "requests_per_wall_s"):
        ja.pop(k)
        jb.pop(k)
    assert ja == jb
    return deferred, eager


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight", "hrrn", "fair"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_deferred_runs_are_bit_identical(name: str, policy: str) -> None:
    deferred, _ = _compare(
        _workload(name), SchedulerConfig(schedule_policy=policy), WORKLOADS[name][3]
    )
    if name == "mooncake":
        assert deferred.result.retractions > 0, "the case must exercise retraction"


@pytest.mark.parametrize("page_size", [4, 16])
def test_deferred_paged_runs_are_bit_identical(page_size: int) -> None:
    _compare(
        _workload("mooncake"),
        SchedulerConfig(schedule_policy="lpm", page_size=page_size),
        WORKLOADS["mooncake"][3],
    )


def test_sglang_compat_deferred_is_bit_identical() -> None:
    _compare(
        _workload("mooncake"),
        SchedulerConfig(schedule_policy="lpm", compat="sglang"),
        WORKLOADS["mooncake"][3],
    )


def test_requests_that_may_stop_switch_the_batch_to_eager_and_back() -> None:
    """A request with stop tokens makes every step a single eager step while it runs; the
    deferred requests are settled first and deferral resumes once it has left."""
    rng = np.random.default_rng(3)
    reqs = []
    for i in range(12):
        stops = (5, 7) if i % 4 == 1 else ()
        reqs.append(
            Req(
                rid=f"r{i}",
                prompt_ids=rng.integers(10, 1000, size=200 + 17 * i).astype(np.int32),
                sampling=SamplingParams(
                    max_new_tokens=30 + 5 * i, ignore_eos=True, stop_token_ids=stops
                ),
                arrival_time=0.05 * i,
            )
        )
    w = Workload("manual", {}, reqs, has_timestamps=True)
    _compare(w, SchedulerConfig(schedule_policy="fcfs"), 4_000)


# ---- the scheduler's own view ----------------------------------------------------------------


def _scheduler(defer: bool) -> Scheduler:
    cost = load_cost_model(gpu="h100", model="llama-3.1-8b", max_total_tokens=20_000)
    return Scheduler(
        SchedulerConfig(schedule_policy="fcfs"),
        CostModelRunner(cost),
        kv_slots=20_000,
        defer_decode_state=defer,
    )


def _fill(s: Scheduler) -> None:
    rng = np.random.default_rng(0)
    for i in range(6):
        prompt = rng.integers(10, 1000, size=100 + 10 * i).astype(np.int32)
        s.add_request(
            Req(f"q{i}", prompt, SamplingParams(max_new_tokens=40 + 20 * i, ignore_eos=True))
        )


def test_pending_state_is_checked_and_synced_on_demand() -> None:
    deferred, eager = _scheduler(True), _scheduler(False)
    _fill(deferred)
    _fill(eager)
    jumped = False
    while not deferred.is_idle:
        a, b = deferred.step(), eager.step()
        assert a is not None and b is not None
        assert (a.mode, a.num_steps, a.duration_s) == (b.mode, b.num_steps, b.duration_s)
        assert [(r.rid, t) for r, t in a.new_tokens] == [(r.rid, t) for r, t in b.new_tokens]
        assert deferred.remaining_decode_tokens() == eager.remaining_decode_tokens()
        assert deferred.kv_usage() == eager.kv_usage()
        deferred.check_integrity()  # with the decode state still pending
        cols = deferred._running_cols()
        ahead = cols.out_len - np.array([r.output_len for r in deferred.running], dtype=np.int64)
        if deferred.running and a.mode == "decode":
            # Synced after the last step: every survivor is behind by exactly the steps run.
            assert (ahead == a.num_steps).all()
            jumped = True
        deferred.sync_running()
        deferred.check_integrity()
        for r, e in zip(deferred.running, eager.running, strict=True):
            assert (r.rid, r.output_ids, r.times.token_times, r.kv_len, len(r.kv_row)) == (
                e.rid,
                e.output_ids,
                e.times.token_times,
                e.kv_len,
                len(e.kv_row),
            )
    assert jumped
    assert deferred.allocator.reserved_size() == 0


def test_integrity_check_catches_a_wrong_reservation() -> None:
    s = _scheduler(True)
    _fill(s)
    while not s._unsettled:
        assert s.step() is not None
    s.check_integrity()
    assert s.allocator.reserve(s.page_size)  # one slot that nobody is owed
    with pytest.raises(IntegrityError, match="reserved"):
        s.check_integrity()


def test_allocator_reserve_and_claim() -> None:
    a = TokenAllocator(16, 2)
    assert a.reserve(6)
    assert (a.available_size(), a.reserved_size()) == (10, 6)
    assert a.alloc(12) is None  # reserved slots are not available to others
    x = a.alloc(10)
    assert x is not None
    assert not a.reserve(2)  # nothing left to reserve
    y = a.claim(4)
    assert len(y) == 4 and not set(y.tolist()) & set(x.tolist())
    assert (a.available_size(), a.reserved_size()) == (0, 2)
    with pytest.raises(ValueError):
        a.claim(4)  # more than reserved
    with pytest.raises(ValueError):
        a.reserve(3)  # not whole pages
    a.check_integrity(request_slots=[x, y])  # the reserved pages are still on the stack


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 5000), st.integers(-3, 2)), min_size=1, max_size=40),
    limit=st.integers(1, 500),
    extra=st.integers(0, 20_000),
    page=st.sampled_from([1, 4]),
)
def test_max_steps_that_fit_matches_a_search(
    rows: list[tuple[int, int]], limit: int, extra: int, page: int
) -> None:
    """The closed form for page-1 rows equals the binary search over the need it replaces."""
    from radixsched.scheduler import _DecodeCols

    s = _scheduler(False)
    s.page_size = page
    fill = np.array([f for f, _ in rows], dtype=np.int64)
    have = np.maximum(fill - 1 - np.array([d for _, d in rows], dtype=np.int64), 0)
    zeros = np.zeros(len(rows), dtype=np.int64)
    cols = _DecodeCols([], fill, have, zeros, zeros, zeros != 0, zeros != 0)
    room = s._cols_need(cols, 1) + extra  # callers have checked that one step fits
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if s._cols_need(cols, mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    assert s._max_steps_that_fit(cols, limit, room) == lo
