"""Distributions as the results report them: mean, percentiles and spread of a sample, and Jain's
fairness index."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.float64]
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None

# Keys of ``Stats.to_json``, in order.
STATS_KEYS: tuple[str, ...] = ("mean", "std", "p50", "p90", "p95", "p99", "max")


def _as_float(x: float | np.floating[Any]) -> float:
    """Python float, with NaN/inf mapped to 0.0 so results stay strict JSON."""
    v = float(x)
    return v if math.isfinite(v) else 0.0


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def as_json(value: Any) -> JSONValue:
    """A result's field as JSON: a nested result by its ``to_json``, a tuple of them as a list."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [v.to_json() for v in value]
    return value


# ---- Distribution statistics ---------------------------------------------------------------------


class Stats(NamedTuple):
    """Summary of a sample. Percentiles use numpy's linear interpolation between order
    statistics (``np.percentile`` default): p50 of [1, 2, 3, 4] is 2.5. ``std`` is the
    population standard deviation (``np.std``, ddof=0), as SGLang's and vLLM's benchmarks
    report it."""

    mean: float
    std: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    n: int  # how many values are summarised (0: every field is 0.0)

    @classmethod
    def of(cls, values: npt.ArrayLike, *, consume: bool = False) -> Stats:
        """``consume``: ``values`` is the caller's to give up (a float64 array nobody reads
        again), so the percentiles reorder it in place instead of sorting a copy."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.size == 0:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        mean, std, top = arr.mean(), arr.std(), arr.max()  # before any reordering
        p50, p90, p95, p99 = np.percentile(arr, [50.0, 90.0, 95.0, 99.0], overwrite_input=consume)
        mean, std, p50, p90, p95, p99, top = map(_as_float, (mean, std, p50, p90, p95, p99, top))
        return cls(mean, std, p50, p90, p95, p99, top, int(arr.size))

    def to_json(self) -> dict[str, JSONValue]:
        return {k: getattr(self, k) for k in STATS_KEYS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], n: int = 0) -> Stats:
        values = {k: float(data[k]) for k in STATS_KEYS}
        return cls(**values, n=n)


def jain_index(values: npt.ArrayLike) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when all x are equal, 1/n when one
    party gets everything. Over no values, or all zeros (nobody got anything: equally), 1.0."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return 1.0
    sq = float(np.dot(arr, arr))
    if sq == 0.0:
        return 1.0
    return _as_float(float(arr.sum()) ** 2 / (arr.size * sq))
