"""The open loop between two arrivals natively (``_core.steps_until``, ``_native/loop.cpp``):
``sim.deploy.open_loop._run_lean``'s inner loop, its reads, calls and samples in its order.
The same series, progress reports and results as the Python loop on whole runs; on a scripted
scheduler, each branch: no work, the clock at or past the arrival, a chunked request alone, a
step that finished requests (with and without a progress callback), a step that comes back
None, a step that raises (the samples before it kept), a clock that reads ints."""

from __future__ import annotations

import copy
import dataclasses
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.sim.deploy import open_loop
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

_WORKLOAD = "shared-prefix:groups=3,prompts=10,system_len=300,question_len=40,output_len=30"


def _run(policy: str, native: bool, monkeypatch: pytest.MonkeyPatch, **sim: Any) -> Any:
    w = load_workload(_WORKLOAD, request_rate=40.0)
    calls: list[tuple[int, int]] = []
    with monkeypatch.context() as m:
        if not native:
            m.setattr(open_loop, "core", lambda: None)
        run = simulate(
            copy.deepcopy(w),
            SchedulerConfig(schedule_policy=policy, chunked_prefill_size=256),
            SimConfig(**sim),
            on_progress=lambda done, total: calls.append((done, total)),
        )
    return run, calls


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("tokens", [None, 2500])
def test_native_loop_gives_the_python_loops_run(
    policy: str, tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = {} if tokens is None else {"max_total_tokens": tokens}
    fast, fast_calls = _run(policy, True, monkeypatch, **sim)
    ref, ref_calls = _run(policy, False, monkeypatch, **sim)
    assert fast.series.rows().tobytes() == ref.series.rows().tobytes()
    assert len(fast.series) > 20
    assert fast_calls == ref_calls and fast_calls[-1] == (30, 30)
    assert len(fast_calls) > 2  # reported after steps, not only at the end
    got = [(r.rid, r.times.first_scheduled, r.times.token_times) for r in fast.requests]
    want = [(r.rid, r.times.first_scheduled, r.times.token_times) for r in ref.requests]
    assert got == want
    assert dataclasses.replace(fast.result, wall_s=0.0) == dataclasses.replace(
        ref.result, wall_s=0.0
    )


# ---- a scripted scheduler -----------------------------------------------------------------------


@dataclass
class _Out:
    finished: list[str] = field(default_factory=list)


@dataclass
class _Stats:
    cached_prompt_tokens: int = 0
    prompt_tokens: int = 0


class _Sched:
    """Each step takes the next scripted outcome: a number of requests it finishes, None
    (the step comes back None) or an exception (raised); a step moves the clock by 1 and
    adds 10 prompt tokens (3 cached)."""

    def __init__(self, script: list[Any], waiting: int, t0: float | int = 0.0) -> None:
        self.script = list(script)
        self.waiting: list[str] = [f"w{i}" for i in range(waiting)]
        self.running: list[str] = []
        self.chunked_req: str | None = None
        self.stats = _Stats()
        self.t = t0
        self.horizons: list[float | None] = []
        self.free_calls = 0

    def now(self) -> float | int:
        return self.t

    def step(self, horizon: float | None) -> _Out | None:
        self.horizons.append(horizon)
        what = self.script.pop(0)
        if isinstance(what, Exception):
            raise what
        self.t += 1
        self.stats.prompt_tokens += 10
        self.stats.cached_prompt_tokens += 3
        if what is None:
            return None
        if self.waiting:
            self.running.append(self.waiting.pop(0))
        gone = self.running[:what]
        del self.running[:what]
        return _Out(gone)

    def free(self) -> int:
        self.free_calls += 1
        return 60 - 7 * len(self.running)

    def evictable(self) -> int:
        return 5


def _until(
    s: _Sched,
    rows: array[float],
    ta: float,
    on_progress: Callable[[int, int], None] | None = None,
    done: int = 0,
    *,
    native: bool = True,
) -> tuple[bool, int]:
    """``_core.steps_until`` on the scripted scheduler, or (``native=False``) the loop as
    ``open_loop._steps_until``'s Python path writes it."""
    horizon = ta if ta != float("inf") else None
    if native:
        lib = core()
        assert lib is not None
        got: tuple[bool, int] = lib.steps_until(
            s.step, s.now, s, s.waiting, s.running, s.free, s.evictable, 100, s.stats, rows, ta,
            horizon, on_progress, done, 9,
        )  # fmt: skip
        return got
    while s.waiting or s.running or s.chunked_req is not None:
        start = s.now()
        if not start < ta:
            break
        out = s.step(horizon)
        if out is None:
            return True, done
        rows.extend((
            start,
            len(s.waiting),
            len(s.running) + (1 if s.chunked_req is not None else 0),
            (100 - (s.free() + s.evictable())) / 100,
            s.stats.cached_prompt_tokens,
            s.stats.prompt_tokens,
        ))  # fmt: skip
        if out.finished and on_progress is not None:
            done += len(out.finished)
            on_progress(done, 9)
    return False, done


def _both(make: Callable[[], _Sched], ta: float, progress: bool, done: int = 0) -> tuple[Any, Any]:
    results = []
    for native in (True, False):
        s, rows = make(), array("d", [7.0] * 6)  # a sample already there stays
        calls: list[tuple[int, int]] = []
        report = (lambda d, n, calls=calls: calls.append((d, n))) if progress else None
        try:
            got: Any = _until(s, rows, ta, report, done, native=native)
        except ValueError as e:
            got = ("raised", str(e))
        results.append((got, rows.tolist(), calls, s.horizons, s.t, s.script))
    return results[0], results[1]


@pytest.mark.parametrize("progress", [True, False])
def test_steps_until_the_arrival_and_progress(progress: bool) -> None:
    fast, ref = _both(lambda: _Sched([0, 1, 0, 2, 1, 0, 0], waiting=4), 4.5, progress, done=2)
    assert fast == ref
    got, rows, calls = fast[0], fast[1], fast[2]
    assert got == (False, 6 if progress else 2)  # five steps before 4.5 finish 1, 2 and 1
    assert len(rows) == 6 * 6 and rows[6:12] == [0.0, 3.0, 1.0, (100 - (53 + 5)) / 100, 3.0, 10.0]
    assert calls == ([(3, 9), (5, 9), (6, 9)] if progress else [])
    assert fast[3] == [4.5] * 5


def test_steps_until_no_work_and_a_clock_past_the_arrival() -> None:
    idle, ref = _both(lambda: _Sched([0], waiting=0), 10.0, True)
    assert idle == ref and idle[0] == (False, 0) and idle[3] == []  # no step
    late, ref = _both(lambda: _Sched([0], waiting=2, t0=3.0), 3.0, True)
    assert late == ref and late[3] == []  # 3.0 < 3.0 is false: no step


def test_steps_until_a_chunked_request_alone_is_work() -> None:
    def make() -> _Sched:
        s = _Sched([0, 0], waiting=0)
        s.chunked_req = "c"
        s.script = [0, 0]
        return s

    fast, ref = _both(make, 2.0, False)
    assert fast == ref and fast[3] == [2.0, 2.0]
    assert fast[1][6 + 2] == 1.0  # the chunked request counts as running


def test_steps_until_a_step_that_comes_back_none() -> None:
    fast, ref = _both(lambda: _Sched([0, None, 0], waiting=3), float("inf"), True)
    assert fast == ref
    assert fast[0] == (True, 0) and len(fast[1]) == 6 * 2  # the None step is not sampled


def test_steps_until_a_step_that_raises_keeps_the_samples_before_it() -> None:
    fast, ref = _both(lambda: _Sched([1, 0, ValueError("boom"), 0], waiting=3), 9.0, True)
    assert fast == ref
    assert fast[0] == ("raised", "boom") and len(fast[1]) == 6 * 3
    assert fast[2] == [(1, 9)]


def test_steps_until_an_int_clock_compares_and_samples_as_python() -> None:
    # 2**53 + 3 is no double: `<` on the int itself is True against 2**53 + 4.0, where the
    # int rounded to a double (2**53 + 4) would not be; its sample is the rounded value.
    t0, ta = 2**53 + 3, float(2**53 + 4)
    fast, ref = _both(lambda: _Sched([0, 0], waiting=2, t0=t0), ta, False)
    assert fast == ref
    assert fast[3] == [ta] and fast[1][6] == ta  # one step, sampled at the rounded start


def test_checking_integrity_runs_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's integrity check (``check_integrity``) is the Python loop's: once a step."""
    from radixsched.native.scheduler import NativeScheduler

    checks: list[int] = []
    check = NativeScheduler.check_integrity

    def counted(s: NativeScheduler) -> None:
        checks.append(1)
        check(s)

    monkeypatch.setattr(NativeScheduler, "check_integrity", counted)
    w = load_workload(_WORKLOAD, request_rate=40.0)
    run = simulate(w, SchedulerConfig(schedule_policy="lpm"), SimConfig(), check_integrity=True)
    assert len(checks) == len(run.series) > 20
