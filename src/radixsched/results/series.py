"""Time series sampled while a run steps: queue length, running requests, KV usage, tokens."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from radixsched.results.stats import FloatArray

# Points a report chart gets per series; more would only bloat the HTML.
REPORT_MAX_POINTS = 2000
# Values a sample holds (``SeriesArrays``' fields, in order).
_COLS = 6


# ---- Time series ---------------------------------------------------------------------------------


class SeriesArrays(NamedTuple):
    t: FloatArray
    queue_len: FloatArray
    running: FloatArray
    kv_usage: FloatArray
    cumulative_cached_tokens: FloatArray
    cumulative_prompt_tokens: FloatArray

    @property
    def hit_rate(self) -> FloatArray:
        """Cumulative token hit rate at each sample (0.0 before any prompt token)."""
        den = self.cumulative_prompt_tokens
        out = np.zeros_like(den)
        np.divide(self.cumulative_cached_tokens, den, out=out, where=den > 0)
        return out


class TimeSeries:
    """Scheduler state sampled by the driver; append-only, times non-decreasing.

    Samples are rows of ``_COLS`` values in one ``array('d')`` buffer: O(1) append in one call
    (it runs once per scheduler step), 8 bytes a value (a million samples take 48 MB, not the
    ~200 MB of lists of floats); ``arrays()`` copies the columns into numpy once.
    """

    __slots__ = ("_last", "_rows")

    def __init__(self) -> None:
        self._rows = array("d")
        self._last = -math.inf  # the latest sample's time (invariant: _rows[-_COLS] if any)

    def append(
        self,
        t: float,
        queue_len: int,
        running: int,
        kv_usage: float,
        cumulative_cached_tokens: int,
        cumulative_prompt_tokens: int,
    ) -> None:
        if t < self._last:
            raise ValueError(f"time series must not go back in time: {t} after {self._last}")
        self._last = t
        self._rows.extend(
            (t, queue_len, running, kv_usage, cumulative_cached_tokens, cumulative_prompt_tokens)
        )

    def unchecked(self) -> Callable[[Iterable[float]], None]:
        """``append`` of one tuple of the six values, without the time check, for a loop
        that samples once a step (one call, not two): ``checked`` must follow before any
        other use of the series."""
        return self._rows.extend

    def rows(self) -> array[float]:
        """The samples' buffer, for a native sampler that appends whole rows of ``_COLS``
        values without the time check (``_native/loop.cpp``): ``checked`` must follow, as
        after ``unchecked``."""
        return self._rows

    def checked(self, since: int) -> None:
        """Check the samples from ``since`` on (``len(self)`` before the first ``unchecked``
        one) as ``append`` checks each, against the one before; raises as it would for the
        first that goes back in time (the samples stay written)."""
        times = self._rows[since * _COLS :: _COLS]  # a copy: a view would pin the buffer
        if not times:
            return
        t = np.frombuffer(times, dtype=np.float64)
        before = np.concatenate(([self._last], t[:-1]))
        back = np.flatnonzero(t < before)
        if back.size:
            k = int(back[0])
            raise ValueError(
                f"time series must not go back in time: {float(t[k])} after {float(before[k])}"
            )
        self._last = times[-1]

    def __len__(self) -> int:
        return len(self._rows) // _COLS

    def arrays(self) -> SeriesArrays:
        # Copies, never views: a live view would pin the buffer and make the next append fail.
        # Each column copied from a view of the buffer (no copy of every row first), the view
        # gone on return.
        rows = np.frombuffer(self._rows, dtype=np.float64).reshape(-1, _COLS)
        return SeriesArrays(*(np.array(rows[:, j]) for j in range(_COLS)))  # (each a copy)

    def downsampled(self, max_points: int = REPORT_MAX_POINTS) -> SeriesArrays:
        """At most ``max_points`` real samples, first and last always kept.

        Min-max decimation on the queue length: the samples are cut into equal-count buckets
        and each bucket keeps its samples with the shortest and the longest queue, in time
        order. Queue spikes (starvation) and dips survive, the envelope a chart draws is the
        true one, and cumulative columns stay consistent because every kept point is real.
        """
        if max_points < 4:
            raise ValueError(f"max_points must be >= 4, got {max_points}")
        full = self.arrays()
        n = full.t.size
        if n <= max_points:
            return full
        picks: list[int] = [0]
        for b in np.array_split(np.arange(1, n - 1), (max_points - 2) // 2):
            if b.size:
                q = full.queue_len[b]
                lo, hi = int(b[np.argmin(q)]), int(b[np.argmax(q)])
                picks.extend(sorted({lo, hi}))
        picks.append(n - 1)
        idx = np.asarray(picks, dtype=np.int64)
        return SeriesArrays(*(col[idx] for col in full))
