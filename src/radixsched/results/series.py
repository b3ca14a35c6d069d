"""Time series sampled while a run steps: queue length, running requests, KV usage, tokens."""

from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np

from radixsched.results.stats import FloatArray

# Points a report chart gets per series; more would only bloat the HTML.
REPORT_MAX_POINTS = 2000


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

    Columns are ``array('d')`` buffers: O(1) append, 8 bytes a value (a million samples take
    48 MB, not the ~200 MB of lists of floats); ``arrays()`` copies them into numpy once.
    """

    __slots__ = ("_cached", "_kv", "_prompt", "_queue", "_running", "_t")

    def __init__(self) -> None:
        self._t = array("d")
        self._queue = array("d")
        self._running = array("d")
        self._kv = array("d")
        self._cached = array("d")
        self._prompt = array("d")

    def append(
        self,
        t: float,
        queue_len: int,
        running: int,
        kv_usage: float,
        cumulative_cached_tokens: int,
        cumulative_prompt_tokens: int,
    ) -> None:
        if self._t and t < self._t[-1]:
            raise ValueError(f"time series must not go back in time: {t} after {self._t[-1]}")
        self._t.append(t)
        self._queue.append(queue_len)
        self._running.append(running)
        self._kv.append(kv_usage)
        self._cached.append(cumulative_cached_tokens)
        self._prompt.append(cumulative_prompt_tokens)

    def __len__(self) -> int:
        return len(self._t)

    def arrays(self) -> SeriesArrays:
        # Copies, never views: a live view would pin the buffer and make the next append fail.
        return SeriesArrays(
            *(
                np.array(col, dtype=np.float64)
                for col in (
                    self._t,
                    self._queue,
                    self._running,
                    self._kv,
                    self._cached,
                    self._prompt,
                )
            )
        )

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
