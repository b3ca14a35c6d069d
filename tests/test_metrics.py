"""Metrics on tiny hand-made requests; every expected number is worked out by hand."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.request import FinishReason, FinishState, Req
from radixsched.results.metrics import ADDITIONAL_KEYS, REQUIRED_KEYS, THROUGHPUT_KEYS, summarize
from radixsched.results.requests import (
    REQUEST_COLUMNS,
    SloTargets,
    failure_reasons,
    failure_summary,
    hit_rates,
    request_rows,
)
from radixsched.results.series import TimeSeries
from radixsched.results.service import fairness_horizon, load_check, slo_result, tenant_results
from radixsched.results.stats import STATS_KEYS, Stats, jain_index
from samples import itl_samples, queue_wait_samples, tpot_samples, ttft_samples


def make_req(
    rid: str,
    *,
    arrival: float,
    token_times: list[float],
    scheduled: float | None = None,
    prompt_len: int = 10,
    cached: int = 0,
    host: int = 0,
    computed: int | None = None,
    tenant: str | None = None,
    reason: FinishReason = FinishReason.LENGTH,
) -> Req:
    """A finished request: first token and finish come from ``token_times``."""
    r = Req(rid, np.ones(prompt_len, dtype=np.int32), tenant=tenant, arrival_time=arrival)
    r.output_ids = [7] * len(token_times)
    r.times.first_scheduled = arrival if scheduled is None else scheduled
    r.times.token_times = list(token_times)
    r.times.first_token = token_times[0] if token_times else None
    r.times.finish = token_times[-1] if token_times else arrival
    r.cached_tokens = cached
    r.host_cached_tokens = host
    r.computed_prefill_tokens = prompt_len - cached if computed is None else computed
    r.finish = FinishState(reason)
    return r


def three_reqs() -> list[Req]:
    # A: waits 1 s, tokens at 2, 2.5, 3.5 -> TTFT 2, TPOT 1.5/2 = 0.75, ITL 0.5 and 1.0.
    a = make_req(
        "a", arrival=0.0, scheduled=1.0, token_times=[2.0, 2.5, 3.5], prompt_len=100, cached=50
    )
    # B: one token -> TTFT 3, no TPOT, no ITL.
    b = make_req("b", arrival=1.0, scheduled=1.5, token_times=[4.0], prompt_len=300, cached=0)
    # C: tokens at 3, 3.25 -> TTFT 1, TPOT 0.25, ITL 0.25. Its first token is earlier than A's
    # last one, so a naive diff over the concatenation would yield -0.5 across the boundary.
    c = make_req(
        "c", arrival=2.0, scheduled=2.0, token_times=[3.0, 3.25], prompt_len=100, cached=30
    )
    return [a, b, c]


# ---- Stats -----------------------------------------------------------------------------------


def test_stats_percentiles_by_hand() -> None:
    s = Stats.of([4.0, 1.0, 3.0, 2.0])
    # Linear interpolation on sorted [1,2,3,4]: rank q*(n-1) -> p50 at 1.5, p90 at 2.7, p99 at 2.97.
    assert (s.mean, s.p50, s.max, s.n) == (2.5, 2.5, 4.0, 4)
    assert s.p90 == pytest.approx(3.7) and s.p99 == pytest.approx(3.97)
    assert s.p95 == pytest.approx(3.85)  # rank 0.95 * 3 = 2.85: 3 + 0.85
    # Population standard deviation: deviations -1.5, -0.5, 0.5, 1.5 -> sqrt(5/4).
    assert s.std == pytest.approx(math.sqrt(1.25))
    assert Stats.of([5.0]) == Stats(5.0, 0.0, 5.0, 5.0, 5.0, 5.0, 5.0, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_stats_are_ordered(values: list[float]) -> None:
    s = Stats.of(values)
    assert min(values) <= s.p50 <= s.p90 <= s.p95 <= s.p99 <= s.max == max(values)
    assert s.std == pytest.approx(float(np.std(values)), abs=1e-6)
    assert min(values) - 1e-6 <= s.mean <= max(values) + 1e-6  # float rounding of the sum
    assert s.n == len(values)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e9, 1e9, allow_nan=False, width=64), min_size=1, max_size=300))
def test_stats_consuming_its_values_gives_the_same_numbers(values: list[float]) -> None:
    """``consume=True`` reorders the array in place for the percentiles: every field must be
    the copying path's, bit for bit (mean and std summed in the original order)."""
    arr = np.asarray(values, dtype=np.float64)
    assert Stats.of(arr.copy(), consume=True) == Stats.of(arr)


def test_stats_empty_is_zero_not_nan() -> None:
    s = Stats.of([])
    assert s == Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    assert tuple(s.to_json()) == STATS_KEYS


# ---- per-request samples ---------------------------------------------------------------------


def test_ttft_tpot_itl_queue_wait() -> None:
    reqs = three_reqs()
    assert ttft_samples(reqs).tolist() == [2.0, 3.0, 1.0]
    assert tpot_samples(reqs).tolist() == [0.75, 0.25]
    assert sorted(itl_samples(reqs).tolist()) == [0.25, 0.5, 1.0]
    assert queue_wait_samples(reqs).tolist() == [1.0, 0.5, 0.0]


def test_itl_of_single_token_requests_is_empty() -> None:
    reqs = [
        make_req("x", arrival=0.0, token_times=[1.0]),
        make_req("y", arrival=0.0, token_times=[2.0]),
    ]
    assert itl_samples(reqs).size == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=0, max_size=6),
        min_size=0,
        max_size=6,
    )
)
def test_itl_matches_naive_loop(gap_lists: list[list[float]]) -> None:
    reqs = []
    naive: list[float] = []
    for i, gaps in enumerate(gap_lists):
        times = list(np.cumsum([float(i), *gaps]))
        reqs.append(make_req(f"r{i}", arrival=0.0, token_times=times))
        naive.extend(b - a for a, b in itertools.pairwise(times))
    got = itl_samples(reqs)
    assert got.size == len(naive)
    # Request by request, in order, each gap exactly ``later - earlier``.
    assert got.tolist() == naive
    assert (got >= 0).all()


def test_aborted_requests_are_left_out_of_latency() -> None:
    ok = make_req("ok", arrival=0.0, token_times=[1.0])
    aborted = make_req("ab", arrival=0.0, token_times=[5.0], reason=FinishReason.ABORT)
    assert ttft_samples([ok, aborted]).tolist() == [1.0]
    res = summarize(
        "p", [ok, aborted], None, optimal_hit_rate=0.0, wall_s=1.0, retractions=0, preemptions=0
    )
    assert (res.num_requests, res.num_completed, res.num_aborted) == (2, 1, 1)


# ---- hit rate --------------------------------------------------------------------------------


def test_hit_rate_is_token_weighted() -> None:
    reqs = three_reqs()
    h = hit_rates(reqs)
    # (50 + 0 + 30) / (100 + 300 + 100); the mean of per-request ratios would be 0.26.
    assert h.total == pytest.approx(80 / 500)
    assert (h.cached_tokens, h.prompt_tokens) == (80, 500)


def test_hit_rate_device_host_split() -> None:
    r = make_req("h", arrival=0.0, token_times=[1.0], prompt_len=200, cached=150, host=50)
    h = hit_rates([r])
    assert (h.total, h.device, h.host) == (0.75, 0.5, 0.25)


def test_hit_rate_ignores_requests_never_scheduled() -> None:
    served = make_req("s", arrival=0.0, token_times=[1.0], prompt_len=100, cached=40)
    starved = make_req("q", arrival=0.0, token_times=[], prompt_len=900, reason=FinishReason.ABORT)
    starved.times.first_scheduled = None
    assert hit_rates([served, starved]).total == pytest.approx(0.4)
    assert hit_rates([]).total == 0.0


# ---- fairness --------------------------------------------------------------------------------


def test_jain_index_by_hand() -> None:
    assert jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    # (1+2+3)^2 / (3 * (1+4+9)) = 36 / 42
    assert jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert jain_index([]) == 1.0
    assert jain_index([0.0, 0.0]) == 1.0


def test_tenant_service_shares_and_jain() -> None:
    # Tenant a: prompt 10, four tokens at 1..4. Tenant b: prompt 10, tokens at 5, 6.
    a = make_req("a", arrival=0.0, token_times=[1.0, 2.0, 3.0, 4.0], tenant="a")
    b = make_req("b", arrival=0.0, token_times=[5.0, 6.0], tenant="b")
    late = make_req("late", arrival=3.0, token_times=[9.0], tenant="b")
    tenants, jain = tenant_results([a, b, late], horizon=2.5)
    by = {t.tenant: t for t in tenants}
    # At 2.5 s: a was served its prompt and 2 tokens of 14; b nothing of 12 ("late" arrives later).
    assert (by["a"].demand_tokens, by["a"].served_tokens) == (14, 12)
    assert (by["b"].demand_tokens, by["b"].served_tokens) == (12, 0)
    assert by["b"].num_requests == 2
    assert jain == pytest.approx(0.5)
    # At the end everyone has everything: perfectly fair.
    _, jain_end = tenant_results([a, b, late], horizon=100.0)
    assert jain_end == pytest.approx(1.0)


def test_equal_service_is_fair() -> None:
    reqs = [make_req(f"r{t}", arrival=0.0, token_times=[1.0, 2.0], tenant=t) for t in "xyz"]
    _, jain = tenant_results(reqs, horizon=1.5)
    assert jain == pytest.approx(1.0)


def test_default_fairness_horizon_is_median_finish() -> None:
    reqs = three_reqs()  # finishes at 3.5, 4.0, 3.25
    assert fairness_horizon(reqs) == 3.5
    assert fairness_horizon([]) == 0.0


def test_single_tenant_reports_no_tenant_table() -> None:
    res = summarize(
        "p", three_reqs(), None, optimal_hit_rate=0.5, wall_s=1.0, retractions=0, preemptions=0
    )
    assert res.tenants == () and res.fairness_jain == 1.0


# ---- time series -----------------------------------------------------------------------------


def test_time_series_hit_rate_and_order() -> None:
    ts = TimeSeries()
    ts.append(0.0, 3, 0, 0.0, 0, 0)
    ts.append(1.0, 2, 1, 0.5, 10, 40)
    ts.append(2.0, 0, 2, 0.25, 30, 60)
    arr = ts.arrays()
    assert arr.hit_rate.tolist() == [0.0, 0.25, 0.5]
    assert len(ts) == 3
    with pytest.raises(ValueError, match="back in time"):
        ts.append(1.5, 0, 0, 0.0, 30, 60)
    assert len(ts) == 3  # the refused sample left nothing behind
    assert [c.tolist() for c in ts.arrays()] == [
        [0.0, 1.0, 2.0],
        [3.0, 2.0, 0.0],
        [0.0, 1.0, 2.0],
        [0.0, 0.5, 0.25],
        [0.0, 10.0, 30.0],
        [0.0, 40.0, 60.0],
    ]
    kept = ts.arrays()
    ts.append(2.0, 1, 1, 0.75, 31, 61)  # an equal time is fine; earlier arrays are copies
    assert kept.t.tolist() == [0.0, 1.0, 2.0] and ts.arrays().kv_usage[-1] == 0.75


@pytest.mark.parametrize("rows", [0, 1, 2])
def test_a_series_arrays_are_copies_at_any_length(rows: int) -> None:
    ts = TimeSeries()
    for i in range(rows):
        ts.append(float(i), i, 1, 0.5, 2 * i, 3 * i)
    kept = ts.arrays()  # (one row: each column's slice is contiguous, and still copied)
    assert all(c.base is None and c.size == rows for c in kept)
    ts.append(9.0, 1, 1, 0.75, 31, 61)
    assert kept.t.tolist() == [float(i) for i in range(rows)]
    assert ts.arrays().cumulative_prompt_tokens.tolist()[-1] == 61.0


def test_downsample_bounds_points_and_keeps_spikes() -> None:
    ts = TimeSeries()
    n = 10_000
    for i in range(n):
        queue = 500 if i == 4321 else 0 if i == 777 else 1 + i % 3
        ts.append(float(i), queue, 1, 0.5, i, 2 * i)
    d = ts.downsampled(100)
    assert d.t.size <= 100
    assert d.t[0] == 0.0 and d.t[-1] == n - 1
    assert d.queue_len.max() == 500  # the one spike survives
    assert d.queue_len.min() == 0  # and the one dip
    assert np.all(np.diff(d.t) > 0)
    np.testing.assert_allclose(d.hit_rate[1:], 0.5)
    small = TimeSeries()
    small.append(0.0, 1, 1, 0.1, 0, 0)
    assert small.downsampled(100).t.size == 1
    with pytest.raises(ValueError):
        ts.downsampled(3)


# ---- summarize / JSON ------------------------------------------------------------------------


def test_summarize_by_hand() -> None:
    reqs = three_reqs()
    ts = TimeSeries()
    ts.append(0.0, 2, 0, 0.1, 0, 0)
    ts.append(1.0, 5, 3, 0.9, 80, 500)
    res = summarize(
        "lpm",
        reqs,
        ts,
        optimal_hit_rate=0.3,
        wall_s=0.5,
        retractions=2,
        preemptions=1,
        extra={"steps": 12},
    )
    assert res.hit_rate == pytest.approx(0.16)
    assert res.hit_rate_gap == pytest.approx(0.14)
    assert res.prefill_tokens_computed == 50 + 300 + 70
    assert res.ttft_s.mean == pytest.approx(2.0) and res.ttft_s.max == 3.0
    assert res.tpot_s.mean == pytest.approx(0.5)
    assert res.e2e_s.max == 3.5  # A: 3.5 - 0; B: 4 - 1 = 3; C: 3.25 - 2 = 1.25
    assert res.queue_wait_s.p50 == 0.5
    assert res.makespan_s == 4.0  # last finish 4.0 - first arrival 0.0
    assert res.throughput.requests_per_s == pytest.approx(3 / 4)
    assert res.throughput.input_tokens_per_s == pytest.approx(500 / 4)
    assert res.throughput.output_tokens_per_s == pytest.approx(6 / 4)
    assert res.requests_per_wall_s == pytest.approx(6.0)
    assert (res.peak_queue_len, res.mean_running, res.peak_kv_usage) == (5, 1.5, 0.9)
    data = res.to_json()
    assert data["steps"] == 12 and data["retractions"] == 2 and data["preemptions"] == 1


def test_json_key_set_is_exact() -> None:
    res = summarize(
        "p", three_reqs(), None, optimal_hit_rate=0.5, wall_s=1.0, retractions=0, preemptions=0
    )
    data = res.to_json()
    assert list(data) == [*REQUIRED_KEYS, *ADDITIONAL_KEYS]
    assert set(REQUIRED_KEYS) == {
        "policy", "hit_rate", "optimal_hit_rate", "prefill_tokens_computed", "num_requests",
        "ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s", "throughput", "makespan_s",
        "retractions", "preemptions", "wall_s",
    }  # fmt: skip
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s"):
        assert set(data[key]) == {"mean", "std", "p50", "p90", "p95", "p99", "max"}  # type: ignore[arg-type]
    assert set(data["throughput"]) == set(THROUGHPUT_KEYS)  # type: ignore[arg-type]
    assert set(THROUGHPUT_KEYS) == {"requests_per_s", "input_tokens_per_s", "output_tokens_per_s"}
    assert isinstance(data["policy"], str) and isinstance(data["num_requests"], int)
    json.dumps(data, allow_nan=False)


def test_extra_may_not_shadow_result_keys() -> None:
    with pytest.raises(ValueError, match="hit_rate"):
        summarize(
            "p",
            [],
            None,
            optimal_hit_rate=0.0,
            wall_s=0.0,
            retractions=0,
            preemptions=0,
            extra={"hit_rate": 1.0},
        )


def test_empty_run_is_all_zero_and_nan_free() -> None:
    res = summarize(
        "p",
        [],
        TimeSeries(),
        optimal_hit_rate=float("nan"),
        wall_s=0.0,
        retractions=0,
        preemptions=0,
    )
    text = json.dumps(res.to_json(), allow_nan=False)  # raises on NaN/inf
    assert res.num_requests == 0 and res.makespan_s == 0.0 and res.hit_rate == 0.0
    assert res.throughput.requests_per_s == 0.0 and res.requests_per_wall_s == 0.0
    assert res.optimal_hit_rate == 0.0
    assert "NaN" not in text


def test_multi_tenant_summary_has_tenants() -> None:
    a = make_req("a", arrival=0.0, token_times=[1.0, 2.0], tenant="a")
    b = make_req("b", arrival=0.0, token_times=[3.0, 4.0], tenant="b")
    res = summarize(
        "p",
        [a, b],
        None,
        optimal_hit_rate=0.0,
        wall_s=1.0,
        retractions=0,
        preemptions=0,
        fairness_at=2.5,
    )
    assert [t.tenant for t in res.tenants] == ["a", "b"]
    # a: 10 + 2 of 12 served; b: 0 of 12 -> shares (1, 0) -> Jain 0.5.
    assert res.fairness_jain == pytest.approx(0.5)
    assert res.fairness_horizon_s == 2.5
    tenants = res.to_json()["tenants"]
    assert isinstance(tenants, list) and len(tenants) == 2
    assert not math.isnan(res.tenants[0].ttft_s.mean)


# ---- SLO goodput, load, per-request rows, failures -------------------------------------------


def test_slo_attainment_counts_requests_meeting_every_target() -> None:
    # TTFTs 2, 3, 1; TPOTs 0.75, -, 0.25 (b has one token: no TPOT, it meets any TPOT target).
    reqs = three_reqs()
    aborted = make_req("d", arrival=0.0, token_times=[0.5], reason=FinishReason.ABORT)
    reqs.append(aborted)  # counts in the total, never meets
    res = slo_result(reqs, SloTargets(ttft_s=2.5, tpot_s=0.5), makespan_s=4.0)
    assert (res.met, res.total) == (1, 4)  # a: TPOT too slow; b: TTFT 3 > 2.5; c meets both
    assert res.attainment == 0.25 and res.goodput_requests_per_s == 0.25
    assert slo_result(reqs, SloTargets(ttft_s=10.0), 4.0).met == 3
    assert slo_result(reqs, SloTargets(tpot_s=0.8), 4.0).met == 3
    with pytest.raises(ValueError, match="positive"):
        SloTargets(ttft_s=0.0)
    full = summarize(
        "p", reqs, None, optimal_hit_rate=0.5, wall_s=1.0, retractions=0, preemptions=0,
        slo=SloTargets(ttft_s=2.5, tpot_s=0.5),
    )  # fmt: skip
    assert full.slo is not None and full.to_json()["slo"]["met"] == 1  # type: ignore[index]
    plain = summarize(
        "p", reqs, None, optimal_hit_rate=0.5, wall_s=1.0, retractions=0, preemptions=0
    )
    assert plain.slo is None and plain.to_json()["slo"] is None


def _queued(n: int, gap: float, service: float, servers: int) -> list[Req]:
    """Requests arriving every ``gap`` seconds served FIFO by ``servers`` parallel servers
    taking ``service`` seconds each."""
    free = [0.0] * servers
    reqs = []
    for i in range(n):
        arrival = i * gap
        k = min(range(servers), key=lambda j: free[j])
        start = max(arrival, free[k])
        free[k] = start + service
        reqs.append(
            make_req(f"r{i}", arrival=arrival, scheduled=start, token_times=[start + service])
        )
    return reqs


def test_load_check_flags_a_queue_that_keeps_growing() -> None:
    # 100 requests at 10/s, each served in 0.5 s by 2 servers: capacity 4/s, overloaded 2.5x.
    over = _queued(100, 0.1, 0.5, 2)
    lc = load_check(over, served_requests_per_s=len(over) / (over[-1].times.finish - 0.0))
    assert lc.overloaded and lc.offered_requests_per_s == pytest.approx(10.0)
    assert lc.load_ratio > 2 and lc.backlog >= 50
    # The same arrivals with 8 servers (16/s) keep up: no backlog, no verdict.
    calm = _queued(100, 0.1, 0.5, 8)
    served = len(calm) / calm[-1].times.finish
    assert not load_check(calm, served).overloaded
    # All at t=0 is a burst the user asked for, queued by design: never called overload.
    burst = _queued(100, 0.0, 0.5, 2)
    assert not load_check(burst, len(burst) / burst[-1].times.finish).overloaded
    assert not load_check(over[:5], 1.0).overloaded  # too few requests to tell
    assert load_check([], 0.0).offered_requests_per_s == 0.0


def test_request_rows_match_the_samples() -> None:
    reqs = three_reqs()
    rows = request_rows("lpm", reqs, {"a": 1}, SloTargets(ttft_s=2.5))
    assert [r["request_id"] for r in rows] == ["a", "b", "c"]
    assert all(set(r) == set(REQUEST_COLUMNS) for r in rows)
    assert [r["ttft_s"] for r in rows] == ttft_samples(reqs).tolist()
    assert [r["queue_wait_s"] for r in rows] == queue_wait_samples(reqs).tolist()
    assert [r["tpot_s"] for r in rows] == [0.75, None, 0.25]
    assert [r["slo_met"] for r in rows] == [True, False, True]
    assert rows[0]["replica"] == 1 and rows[1]["replica"] is None
    assert rows[0]["cached_tokens"] == 50 and rows[0]["finish_reason"] == "length"


def test_failure_summary_groups_messages_by_shape() -> None:
    reqs = []
    for i, n in enumerate((100, 200, 300)):
        r = Req(f"x{i}", np.ones(3, dtype=np.int32))
        r.finish = FinishState(FinishReason.ABORT, f"prompt of {n} tokens does not fit")
        reqs.append(r)
    full = Req("q", np.ones(3, dtype=np.int32))
    full.finish = FinishState(FinishReason.ABORT, "The request queue is full.")
    reqs.append(full)
    assert failure_reasons(reqs) == [
        ("prompt of 100 tokens does not fit", 3),
        ("The request queue is full.", 1),
    ]
    text = failure_summary(reqs)
    assert text.startswith("4 rejected at admission") and "100 tokens" in text
    assert failure_summary(three_reqs()) == ""
