"""Clocks for the scheduler loop: virtual time for the simulator, wall time for real engines."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, dt: float) -> None:
        """Account for a step that took ``dt`` seconds (a wall clock has already moved)."""


class VirtualClock:
    """Simulated time: moves only when the loop says a step took time or jumps to an event."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> None:
        assert dt >= 0, dt
        self._t += dt

    def jump_to(self, t: float) -> None:
        """Idle until ``t`` (never backwards): ``max(_t, t)`` without its call (``t`` replaces
        ``_t`` only when greater, as ``max`` keeps its first argument on ties and NaNs)."""
        if t > self._t:
            self._t = t


class WallClock:
    """Seconds since ``epoch`` (a ``time.perf_counter()`` value; default: now). On Linux that
    counter is the system-wide monotonic clock, so processes given one epoch share one clock."""

    def __init__(self, epoch: float | None = None) -> None:
        self._t0 = time.perf_counter() if epoch is None else epoch

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, dt: float) -> None:
        return None
