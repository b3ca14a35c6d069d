"""The run summary's arrays (``results.reqarrays``) against the per-request computations they
replace: every sample, total and median the same float, bit for bit, on every kind of request
(completed with 0, 1 or more tokens, aborted after a start, rejected, still running)."""

from __future__ import annotations

import dataclasses
import itertools
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.native import core as native_core
from radixsched.request import FinishReason, FinishState, Req
from radixsched.results import reqarrays
from radixsched.results import requests as requests_module
from radixsched.results.metrics import summarize
from radixsched.results.reqarrays import RequestArrays
from radixsched.results.requests import (
    SloTargets,
    _completed,
    _queue_wait,
    _ttft,
    hit_rates,
    request_rows,
    token_gaps,
)
from radixsched.results.service import fairness_horizon, load_check, load_check_of
from samples import _tpot, itl_samples


def _req(
    rid: str,
    arrival: float,
    scheduled: float | None,
    token_times: list[float],
    finish: float | None,
    reason: FinishReason | None,
    *,
    prompt_len: int = 8,
    cached: int = 0,
    host: int = 0,
    tenant: str | None = None,
) -> Req:
    r = Req(rid, np.ones(prompt_len, dtype=np.int32), tenant=tenant, arrival_time=arrival)
    r.output_ids = [3] * len(token_times)
    r.times.first_scheduled = scheduled
    r.times.token_times = list(token_times)
    r.times.first_token = token_times[0] if token_times else None
    r.times.finish = finish
    r.finish = None if reason is None else FinishState(reason)
    r.cached_tokens, r.host_cached_tokens = cached, host
    r.computed_prefill_tokens = prompt_len - cached
    return r


def every_kind() -> list[Req]:
    """One request of each kind, with times whose differences round (0.1 + 0.2 ...)."""
    return [
        _req("many", 0.1, 0.3, [0.7, 0.9, 1.3, 2.1], 2.1, FinishReason.LENGTH, cached=4, host=1),
        _req("one", 0.2, 0.2, [1.1], 1.1, FinishReason.STOP, prompt_len=5),
        _req("none", 0.3, 0.5, [], 0.5, FinishReason.LENGTH),  # no output token
        _req("aborted", 0.4, 0.6, [0.9, 1.7], 1.7, FinishReason.ABORT, cached=2),
        _req("rejected", 0.5, None, [], 0.5, FinishReason.ABORT),  # never started
        _req("running", 0.6, 0.8, [1.0, 1.2], None, None),  # not finished
        _req("waiting", 0.7, None, [], None, None),  # never started, not finished
        _req("two", 1.3, 1.9, [2.3, 2.35], 2.35, FinishReason.LENGTH, tenant="b"),
    ]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float64 and a.tobytes() == b.tobytes()


def _naive_load(reqs: list[Req]) -> tuple[float, float, int, float]:
    """(last arrival, span, backlog, service median): the per-request computation."""
    arrivals = [r.times.arrival for r in reqs]
    last = max(arrivals)
    backlog = sum(
        1
        for r in reqs
        if (r.times.first_scheduled is not None and r.times.first_scheduled > last)
        or (
            r.times.first_scheduled is None
            and not (r.finish is not None and r.finish.reason is FinishReason.ABORT)
        )
    )
    service = [
        t.finish - t.first_scheduled
        for t in (r.times for r in _completed(reqs))
        if t.finish is not None and t.first_scheduled is not None
    ]
    return last, last - min(arrivals), backlog, float(np.median(service)) if service else 0.0


def _e2e(done: list[Req]) -> np.ndarray:
    return np.array(
        [r.times.finish - r.times.arrival for r in done if r.times.finish is not None],
        dtype=np.float64,
    )


def check_against_naive(reqs: list[Req]) -> None:
    a = RequestArrays.of(reqs)
    done = _completed(reqs)
    assert _same(a.ttft(), _ttft(done))
    assert _same(a.tpot(), _tpot(done))
    assert _same(a.e2e(), _e2e(done))
    assert _same(a.queue_wait(), _queue_wait(done))
    naive_gaps = [b - x for r in done for x, b in itertools.pairwise(r.times.token_times)]
    assert a.itl().tolist() == naive_gaps and _same(a.itl(), itl_samples(reqs))
    assert a.hit_rates() == hit_rates(reqs)
    assert a.num_requests == len(reqs) and a.num_completed == len(done)
    assert a.num_tenants == len({r.tenant_key for r in reqs})
    finishes = [r.times.finish for r in done]
    arrivals = [r.times.arrival for r in reqs]
    makespan = max(finishes) - min(arrivals) if finishes and arrivals else 0.0
    assert a.makespan() == makespan and type(a.makespan()) is float
    if reqs:
        last, span, backlog, service_s = _naive_load(reqs)
        got = load_check_of(a, 1.5)
        assert (got.arrival_span_s, got.backlog, got.service_s) == (span, backlog, service_s)
        assert a.backlog(last) == backlog
        assert got == load_check(reqs, 1.5)
    result = summarize("p", reqs, optimal_hit_rate=0.0, wall_s=1.0, retractions=0, preemptions=0)
    assert result.num_aborted == sum(
        r.finish is not None and r.finish.reason is FinishReason.ABORT for r in reqs
    )
    assert result.prefill_tokens_computed == sum(r.computed_prefill_tokens for r in reqs)
    assert result.output_tokens == sum(r.output_len for r in done)
    assert result.fairness_horizon_s == fairness_horizon(reqs)
    assert result.itl_s.n == len(naive_gaps)


def test_every_kind_of_request_matches_the_per_request_samples() -> None:
    reqs = every_kind()
    check_against_naive(reqs)
    a = RequestArrays.of(reqs)
    # By hand: completed are many, one, none, two; aborted are aborted and rejected.
    assert a.num_completed == 4 and int(a.aborted.sum()) == 2
    assert a.tpot().size == 2  # "one" and "none" have no TPOT
    assert a.token_times == [[0.7, 0.9, 1.3, 2.1], [1.1], [], [2.3, 2.35]]
    assert a.backlog(1.3) == 2  # "two" started after the last arrival; "waiting" never did


def test_no_requests() -> None:
    a = RequestArrays.of([])
    assert a.num_requests == 0 and a.makespan() == 0.0 and a.itl().size == 0
    assert a.ttft().dtype == np.float64 and a.ttft().size == 0
    check_against_naive([])


@st.composite
def runs(draw: st.DrawFn) -> list[Req]:
    reqs = []
    times = st.floats(0.0, 50.0, allow_nan=False, allow_subnormal=False)
    for i in range(draw(st.integers(0, 9))):
        arrival = draw(times)
        kind = draw(st.sampled_from(["done", "aborted", "rejected", "running", "waiting"]))
        scheduled = None if kind in ("rejected", "waiting") else arrival + draw(times)
        gaps = draw(st.lists(times, max_size=5)) if scheduled is not None else []
        tokens = [float(t) for t in itertools.accumulate(gaps, initial=scheduled or 0.0)][1:]
        finish = None if kind in ("running", "waiting") else (tokens[-1] if tokens else arrival)
        reason = {"done": FinishReason.LENGTH, "aborted": FinishReason.ABORT}.get(kind)
        prompt = draw(st.integers(1, 50))
        reqs.append(
            _req(
                f"r{i}",
                arrival,
                scheduled,
                tokens,
                finish,
                FinishReason.ABORT if kind == "rejected" else reason,
                prompt_len=prompt,
                cached=draw(st.integers(0, prompt)),
                tenant=draw(st.sampled_from([None, "a", "b"])),
            )
        )
    return reqs


@settings(max_examples=150, deadline=None)
@given(runs())
def test_random_runs_match_the_per_request_samples(reqs: list[Req]) -> None:
    check_against_naive(reqs)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.floats(0.0, 1e4, allow_subnormal=False), max_size=7), max_size=8),
    st.sampled_from([1, 2, 3, 5, 1 << 20]),
)
def test_token_gaps_in_batches_are_the_loops_gaps(lists: list[list[float]], batch: int) -> None:
    naive = [b - a for tt in lists for a, b in itertools.pairwise(tt)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(requests_module, "_JOIN_TOKENS", batch)  # joined a few tokens at a time
        got = token_gaps(lists)
    assert got.dtype == np.float64 and got.tolist() == naive
    assert got.tobytes() == np.array(naive, dtype=np.float64).tobytes()


def _naive_times(r: Req, slo: SloTargets | None) -> tuple[object, ...]:
    """A row's computed fields, request by request as the row's definition reads."""
    t = r.times
    done = r.finish is not None and r.finish.reason is not FinishReason.ABORT
    ttft = None if t.first_token is None else t.first_token - t.arrival
    tpot = None
    if done and r.output_len > 1 and t.finish is not None and t.first_token is not None:
        tpot = (t.finish - t.first_token) / (r.output_len - 1)
    met = None
    if slo is not None and slo.active:
        met = done and ttft is not None
        if met and slo.ttft_s is not None and ttft is not None:
            met = ttft <= slo.ttft_s
        if met and slo.tpot_s is not None and tpot is not None:
            met = tpot <= slo.tpot_s
    wait = None if t.first_scheduled is None else t.first_scheduled - t.arrival
    e2e = t.finish - t.arrival if done and t.finish is not None else None
    reason = None if r.finish is None else r.finish.reason.value
    error = r.finish.message if r.finish is not None and not done else None
    return wait, ttft, tpot, e2e, met, reason, error, r.output_len


ROW_FIELDS = (
    "queue_wait_s", "ttft_s", "tpot_s", "e2e_s", "slo_met", "finish_reason", "error",
    "output_tokens",
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(runs(), st.sampled_from([None, SloTargets(), SloTargets(0.5, None), SloTargets(1.0, 0.2)]))
def test_request_rows_are_the_per_request_values(reqs: list[Req], slo: SloTargets | None) -> None:
    rows = request_rows("p", reqs, {r.rid: 3 for r in reqs}, slo)
    ordered = sorted(reqs, key=lambda q: q.times.arrival)
    assert [row["request_id"] for row in rows] == [r.rid for r in ordered]
    for row, r in zip(rows, ordered, strict=True):
        assert repr(tuple(row[k] for k in ROW_FIELDS)) == repr(_naive_times(r, slo))
        assert row["replica"] == 3 and row["arrival_s"] == r.times.arrival


def test_token_gaps_take_lists_and_packed_arrays_alike() -> None:
    lists = [[0.1, 0.3, 0.7], [5.0], [], [0.2, 0.25], [1e-9, 3.0]]
    naive = [b - a for tt in lists for a, b in itertools.pairwise(tt)]
    assert token_gaps(lists).tolist() == naive
    packed = [array("d", tt) if i % 2 else tt for i, tt in enumerate(lists)]  # a deferred run
    assert token_gaps(packed).tobytes() == token_gaps(lists).tobytes()
    assert token_gaps([]).size == 0 and token_gaps([[1.0], []]).size == 0


def test_token_gaps_of_lists_that_are_not_all_floats_convert_as_numpy_does() -> None:
    """An int among the times (a clock that is not the simulator's): the native copy declines
    and the times convert one by one, as ``float()`` would."""
    lists = [[0.5, 2, 3.25], [1, 1.5]]
    assert token_gaps(lists).tolist() == [1.5, 1.25, 0.5]


def test_token_gaps_join_packed_arrays_as_bytes_and_others_by_value() -> None:
    """Every sequence an ``array('d')`` (a deferred run's): joined as bytes; an ``array('f')``
    among them is read by value, as numpy converts it."""
    lists = [[0.1, 0.3, 0.7], [5.0, -0.0, 2.5], [0.2, 0.25]]
    want = token_gaps(lists).tobytes()
    assert token_gaps([array("d", tt) for tt in lists]).tobytes() == want
    singles = [array("f", [0.5, 2.0, 3.25]), array("d", [1.0, 1.5])]
    assert token_gaps(singles).tolist() == [1.5, 1.25, 0.5]


def _same_columns(a: RequestArrays, b: RequestArrays) -> bool:
    """Every column the same dtype and bytes, and the same token time objects in order."""
    for f in dataclasses.fields(RequestArrays):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not (x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()):
                return False
        elif f.name == "token_times":
            if len(x) != len(y) or any(p is not q for p, q in zip(x, y, strict=True)):
                return False
        elif x != y:
            return False
    return True


def _native_of(reqs: list[Req]) -> RequestArrays:
    if getattr(native_core(), "request_columns", None) is None:
        pytest.skip("no native core with request_columns")
    got = reqarrays._native_of(reqs)
    assert got is not None
    return got


def test_native_columns_are_the_field_by_field_columns() -> None:
    reqs = every_kind()
    ended_untimed = _req("ended-untimed", 0.9, 1.0, [1.2], None, FinishReason.LENGTH)
    reqs.append(ended_untimed)  # finished, no finish time: not completed, its times not read
    got = _native_of(reqs)
    assert _same_columns(got, RequestArrays._of(reqs))
    assert got.num_tenants == 2 and len(got.token_times) == 4
    assert _same_columns(_native_of([]), RequestArrays._of([]))
    assert _same_columns(RequestArrays.of(reqs), got)


@settings(max_examples=100, deadline=None)
@given(runs())
def test_native_columns_of_random_runs(reqs: list[Req]) -> None:
    assert _same_columns(_native_of(reqs), RequestArrays._of(reqs))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("first_scheduled", 1),  # an int time: numpy converts it
        ("finish", np.float64(2.0)),  # a float subclass
        ("arrival", None),  # no arrival: the field-by-field read raises
        ("cached_tokens", True),  # a bool counter
        ("computed_prefill_tokens", 1 << 70),  # past int64: numpy raises
        ("host_cached_tokens", 2.0),  # a float counter
    ],
)
def test_native_columns_decline_what_numpy_converts(field: str, value: object) -> None:
    reqs = every_kind()
    _native_of(reqs)  # (skips without the core)
    r = reqs[1]
    setattr(r.times if hasattr(r.times, field) else r, field, value)
    assert reqarrays._native_of(reqs) is None
    try:
        want = RequestArrays._of(reqs)
    except (TypeError, OverflowError):
        with pytest.raises((TypeError, OverflowError)):
            RequestArrays.of(reqs)
        return
    assert _same_columns(RequestArrays.of(reqs), want)


def test_native_columns_read_any_sequence_once_and_count_it() -> None:
    reqs = every_kind()
    _native_of(reqs)
    mod = native_core()
    assert mod is not None
    arrays = (np.empty((4, 9)), np.empty((3, 9), dtype=np.bool_), np.empty(9, dtype=np.int8))
    with pytest.raises(ValueError, match="more requests"):
        mod.request_columns(
            reqs + reqs[:2], FinishReason.ABORT, *arrays, np.empty((5, 9), dtype=np.int64)
        )
    with pytest.raises(ValueError, match="fewer requests"):
        mod.request_columns(reqs[:7], FinishReason.ABORT, *arrays, np.empty((5, 9), dtype=np.int64))
    with pytest.raises(ValueError, match="rows"):
        mod.request_columns(reqs, FinishReason.ABORT, *arrays, np.empty((4, 9), dtype=np.int64))
    assert _same_columns(_native_of(tuple(reqs)), RequestArrays._of(reqs))  # type: ignore[arg-type]


def test_without_the_core_the_columns_are_read_field_by_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reqs = every_kind()
    want = RequestArrays._of(reqs)
    monkeypatch.setattr(reqarrays, "core", lambda: None)
    assert reqarrays._native_of(reqs) is None
    assert _same_columns(RequestArrays.of(reqs), want)
