"""The simulator's per-request work outside the scheduler: a run taking the workload's own
requests instead of copies (``client_requests(reuse=True)``, the last run of a process), deferred
prompts built without copies of their drafts (``deferred.build_prompts``), and the open loop's
series sampled without a per-sample time check (``TimeSeries.unchecked``/``checked``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.results.reqarrays import _times
from radixsched.results.series import TimeSeries
from radixsched.results.stats import _QUANTILES, percentiles
from radixsched.sim.deploy.run import client_requests
from radixsched.sim.policy_runs import PolicyRuns
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads import deferred
from radixsched.sim.workloads.load import Workload, load_workload
from radixsched.sim.workloads.tokens import _NO_TOKENS, _Draft

SAMPLE = Path(__file__).resolve().parent / "data" / "mooncake_sample.jsonl"
SPEC = f"mooncake:{SAMPLE}"


def _workload() -> Workload:
    """Four requests sharing a prefix, listed out of arrival order."""
    shared = list(range(1, 40))
    reqs = [
        Req(f"r{i}", [*shared, 100 + i], SamplingParams(max_new_tokens=3), arrival_time=t)
        for i, t in enumerate([0.3, 0.0, 0.2, 0.1])
    ]
    return Workload(name="t", params={}, requests=reqs, has_timestamps=True)


# ---- the run's requests ---------------------------------------------------------------------


def test_reuse_takes_the_workloads_own_requests_in_arrival_order() -> None:
    wl = _workload()
    own = client_requests(wl, reuse=True)
    copies = client_requests(wl)
    assert [r.rid for r in own] == [r.rid for r in copies] == ["r1", "r3", "r2", "r0"]
    assert all(any(r is w for w in wl.requests) for r in own)
    assert not any(c is w for c in copies for w in wl.requests)


def test_reuse_of_deferred_requests_takes_them_too(defer_all: None) -> None:
    wl = load_workload(SPEC, defer_prompts=True, num_requests=40)
    own = client_requests(wl, reuse=True)
    copies = client_requests(wl)
    assert isinstance(own, deferred.ArrivingRequests)
    assert [a is b for a, b in zip(own, wl.requests, strict=True)] == [True] * 40
    assert not any(c is w for c, w in zip(copies, wl.requests, strict=True))
    assert np.array_equal(own[3].prompt_ids, copies[3].prompt_ids)


def test_a_run_on_the_workloads_requests_is_the_run_on_copies() -> None:
    cfg, sim = SchedulerConfig(schedule_policy="lpm"), SimConfig(max_total_tokens=4_000)
    base = simulate(load_workload(SPEC), cfg, sim, optimal_hit_rate=0.5)
    wl = load_workload(SPEC)
    run = simulate(wl, cfg, sim, optimal_hit_rate=0.5, reuse_requests=True)
    assert dataclasses.replace(base.result, wall_s=0.0) == dataclasses.replace(
        run.result, wall_s=0.0
    )
    assert {id(r) for r in run.requests} == {id(r) for r in wl.requests}
    assert [r.times.token_times for r in base.requests] == [
        r.times.token_times for r in run.requests
    ]


def test_only_a_run_that_leaves_its_objects_to_the_exit_reuses_them() -> None:
    wl = _workload()
    runs = PolicyRuns(wl, optimal_hit_rate=0.0)
    runs.run("fcfs", None)
    assert all(r.times.first_scheduled is None for r in wl.requests)  # copies ran
    left: list[object] = []
    out = runs.run("fcfs", None, left)
    assert [r.times.first_scheduled is not None for r in wl.requests] == [True] * 4
    assert out.result.num_completed == 4


# ---- deferred prompts -------------------------------------------------------------------------


def test_build_prompts_leaves_the_drafts_as_they_were(defer_all: None) -> None:
    drafts = load_workload(SPEC, defer_prompts=True, num_requests=5).drafts
    assert drafts is not None
    lent = np.full(drafts[0].length, -1, dtype=np.int32)  # a buffer of the prompt's length
    drafts[0].prompt = lent
    held = [d.prompt for d in drafts]
    first = deferred.build_prompts(drafts)
    second = deferred.build_prompts(drafts)
    assert [d.prompt is p for d, p in zip(drafts, held, strict=True)] == [True] * 5
    assert (lent == -1).all()  # never written: each build allocates its own
    eager = load_workload(SPEC, num_requests=5).requests
    for a, b, r in zip(first, second, eager, strict=True):
        assert a is not b and np.array_equal(a, r.prompt_ids) and np.array_equal(b, a)
        assert not a.flags.writeable


def test_build_prompts_puts_the_drafts_back_when_a_build_fails() -> None:
    seen: list[bool] = []

    def fail(group: Sequence[_Draft]) -> None:
        seen.extend(d.prompt is _NO_TOKENS for d in group)
        raise RuntimeError("no prompt")

    own = np.zeros(4, dtype=np.int32)
    drafts = [_Draft(own, 1, 0, fill=fail, length=4), _Draft(_NO_TOKENS, 1, 1, fill=fail, length=2)]
    with pytest.raises(RuntimeError, match="no prompt"):
        deferred.build_prompts(drafts)
    assert seen == [True, True]
    assert drafts[0].prompt is own and drafts[1].prompt is _NO_TOKENS


# ---- the series -------------------------------------------------------------------------------


def _row(t: float, q: int = 0) -> tuple[float, int, int, float, int, int]:
    return (t, q, 0, 0.0, 0, 0)


def test_unchecked_samples_are_the_appended_ones_once_checked() -> None:
    ts = TimeSeries()
    ts.append(*_row(1.0))
    since, put = len(ts), ts.unchecked()
    put(_row(2.0, 5))
    put(_row(2.0, 7))
    ts.checked(since)
    ref = TimeSeries()
    for row in (_row(1.0), _row(2.0, 5), _row(2.0, 7)):
        ref.append(*row)
    assert [a.tolist() for a in ts.arrays()] == [a.tolist() for a in ref.arrays()]
    with pytest.raises(ValueError, match=r"1\.5 after 2\.0"):
        ts.append(*_row(1.5))  # the check's last sample is the latest written
    ts.append(*_row(2.0))


def test_checked_names_the_first_sample_back_in_time() -> None:
    ts = TimeSeries()
    ts.append(*_row(3.0))
    put = ts.unchecked()
    put(_row(2.5))
    with pytest.raises(ValueError, match=r"2\.5 after 3\.0"):
        ts.checked(1)  # against the sample before the unchecked ones
    other = TimeSeries()
    put = other.unchecked()
    for t in (1.0, 4.0, 3.0, 2.0):
        put(_row(t))
    with pytest.raises(ValueError, match=r"3\.0 after 4\.0"):
        other.checked(0)


def test_checked_without_new_samples_changes_nothing() -> None:
    ts = TimeSeries()
    ts.checked(0)
    ts.append(*_row(1.0))
    ts.checked(1)
    with pytest.raises(ValueError, match=r"0\.5 after 1\.0"):
        ts.append(*_row(0.5))


# ---- the summary's columns --------------------------------------------------------------------


def test_times_mark_none_absent_and_a_nan_time_present() -> None:
    arr, present = _times([1.5, None, math.nan, 2.0, None])
    assert present.tolist() == [True, False, True, True, False]
    assert arr[0] == 1.5 and arr[3] == 2.0 and np.isnan(arr[[1, 2, 4]]).all()
    arr, present = _times([])
    assert arr.size == 0 and present.size == 0 and present.dtype == np.bool_


@pytest.mark.parametrize(
    "values",
    [
        [0.0, 0.0, -0.0, -0.0, -0.0, -1.0, -0.0],  # a partition without the first position
        [1.0, -0.0, 0.0, -0.0, 0.7, 0.0, 0.0, -0.0],  # puts the other zero at a percentile's
        [3.0, 1.0, 2.5, 0.5, 7.0],  # no zero: the first position left out
    ],
)
def test_percentiles_keep_numpys_zero_signs(values: list[float]) -> None:
    got = percentiles(np.array(values), _QUANTILES)
    want = np.percentile(np.array(values), 100 * _QUANTILES)
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist()
