"""The native core's clock calls (``_native/vclock.hpp``): a ``VirtualClock``'s ``now()`` and
``jump_to(t)`` done in place (its ``_t`` read, set when ``t > _t``) give the run the calls give,
and a class whose methods were replaced is called, not read past."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

_WORKLOAD = "shared-prefix:groups=3,prompts=8,system_len=300,question_len=40,output_len=20"


def _run(chunked: int | None) -> Any:
    w = load_workload(_WORKLOAD, request_rate=40.0)
    cfg = SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=chunked)
    return simulate(copy.deepcopy(w), cfg, SimConfig())


def _same(a: Any, b: Any) -> None:
    assert a.series.rows().tobytes() == b.series.rows().tobytes()
    got = [(r.rid, r.times.first_scheduled, r.times.token_times) for r in a.requests]
    assert got == [(r.rid, r.times.first_scheduled, r.times.token_times) for r in b.requests]
    assert dataclasses.replace(a.result, wall_s=0.0) == dataclasses.replace(b.result, wall_s=0.0)


@pytest.mark.parametrize("chunked", [None, 128])
def test_replaced_clock_methods_are_called_and_give_the_same_run(
    chunked: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _run(chunked)
    calls = {"now": 0, "jump_to": 0}
    now, jump_to = VirtualClock.now, VirtualClock.jump_to

    def counted_now(self: VirtualClock) -> float:
        calls["now"] += 1
        return now(self)

    def counted_jump_to(self: VirtualClock, t: float) -> None:
        calls["jump_to"] += 1
        jump_to(self, t)

    with monkeypatch.context() as m:
        m.setattr(VirtualClock, "now", counted_now)
        m.setattr(VirtualClock, "jump_to", counted_jump_to)
        replaced = _run(chunked)
    _same(replaced, plain)
    # Every step reads the clock and every prefill step jumps it: the native loop, its
    # prefill runs and its middle chunks called the replacements rather than reading past them.
    assert calls["now"] > len(plain.series) and calls["jump_to"] > 8
    assert VirtualClock.now is now and VirtualClock.jump_to is jump_to  # (restored)
    _same(_run(chunked), plain)  # and the in-place reads give the calls' run again


class _Steps:
    """A scheduler with `n` waiting requests whose steps each serve one and move `clock` by 1."""

    def __init__(self, clock: VirtualClock, n: int) -> None:
        self.clock, self.waiting = clock, list(range(n))
        self.running: list[int] = []
        self.chunked_req = None
        self.cached_prompt_tokens = self.prompt_tokens = 0

    def step(self, horizon: float | None) -> Any:
        self.waiting.pop()
        self.clock.advance(1.0)
        return _Finished()


class _Finished:
    def __init__(self) -> None:
        self.finished: list[int] = []


def _steps_until(clock: VirtualClock, n: int, ta: float) -> list[float]:
    """``_core.steps_until`` over `n` one-step requests with `clock.now` bound: the sampled
    starts."""
    from array import array

    lib = core()
    assert lib is not None
    s, rows = _Steps(clock, n), array("d")
    lib.steps_until(
        s.step, clock.now, s, s.waiting, s.running, lambda: 10, lambda: 0, 10, s, rows, ta,
        ta, None, 0, n,
    )  # fmt: skip
    return rows.tolist()[::6]


class _OwnNow(VirtualClock):
    def now(self) -> float:
        return super().now() + 0.5


def test_the_loop_reads_a_virtual_clock_and_calls_any_other_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _steps_until(VirtualClock(2.0), 5, 5.0) == [2.0, 3.0, 4.0]  # read in place
    assert _steps_until(_OwnNow(2.0), 5, 5.0) == [2.5, 3.5, 4.5]  # a subclass's own now
    calls: list[float] = []
    now = VirtualClock.now

    def counted(self: VirtualClock) -> float:
        calls.append(now(self))
        return now(self)

    monkeypatch.setattr(VirtualClock, "now", counted)
    assert _steps_until(VirtualClock(2.0), 5, 5.0) == [2.0, 3.0, 4.0]
    assert calls == [2.0, 3.0, 4.0, 5.0]  # each step's start, and the one at the arrival
