"""Distributions as the results report them: mean, percentiles and spread of a sample, and Jain's
fairness index."""

from __future__ import annotations

import math
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
        mean, top = arr.mean(), arr.max()  # before any reordering
        std = math.sqrt(_sum_of_squares(arr, mean) / arr.size)  # np.std's (ddof=0)
        p50, p90, p95, p99 = percentiles(arr, _QUANTILES, overwrite_input=consume)
        mean, std, p50, p90, p95, p99, top = map(_as_float, (mean, std, p50, p90, p95, p99, top))
        return cls(mean, std, p50, p90, p95, p99, top, int(arr.size))

    def to_json(self) -> dict[str, JSONValue]:
        return {k: getattr(self, k) for k in STATS_KEYS}


# ---- Spread as numpy computes it, without its full-size temporary ------------------------------
# ``np.std`` squares every deviation into a temporary the size of the sample (hundreds of MB of
# a long trace's inter-token gaps: fresh pages the kernel zeroes), then sums it pairwise. The
# pairwise sum of n > 128 values is the sum of its halves' (the first half n // 2 rounded down
# to a multiple of 8, numpy's ``pairwise_sum``): summing the subtrees a cache-sized slice at a
# time adds the same squares in the same tree, bit for bit (tests/test_order_stats.py).

_SQUARES_AT_ONCE = 1 << 16  # values squared and summed in one slice (512 KB of float64)
_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: up to this many values are one block, never split


def _sum_of_squares(arr: FloatArray, center: float | np.floating[Any]) -> float:
    """``np.sum(np.square(arr - center))`` of a 1-D float64 array, as numpy's pairwise sum
    adds it (its slices' sums are never -0.0: squares are +0.0 or more, or NaN)."""
    n = arr.size
    if n <= _SQUARES_AT_ONCE or n <= _PAIRWISE_BLOCK:
        dev = np.subtract(arr, center)
        return float(np.add.reduce(np.square(dev, out=dev)))
    half = n // 2
    half -= half % 8
    return _sum_of_squares(arr[:half], center) + _sum_of_squares(arr[half:], center)


# ---- Order statistics as numpy computes them ---------------------------------------------------
# ``np.percentile`` and ``np.median`` import ``numpy.ma`` on their first call (8 ms of a short
# command: np.percentile's ``np.unique`` and np.median's NaN check ask whether an array is
# masked). These give the same floats on a 1-D float64 array: the same order statistics (a
# partition puts them in place whatever other positions it fixes), combined by the same
# operations in the same order (tests/test_order_stats.py compares them bit for bit).

# Stats' percentiles as fractions, divided as np.percentile divides them.
_QUANTILES = np.true_divide(np.array([50.0, 90.0, 95.0, 99.0]), 100)


def percentiles(
    arr: FloatArray, quantiles: FloatArray, *, overwrite_input: bool = False
) -> FloatArray:
    """``np.percentile(arr, 100 * quantiles, overwrite_input=...)`` of a non-empty 1-D float64
    array, method "linear": between the order statistics around ``(n - 1) * q``, weighted by
    its fraction. ``overwrite_input``: ``arr`` may be reordered (no copy)."""
    virtual, lo, hi = ranks(arr.size, quantiles)
    part = arr if overwrite_input else arr.copy()
    part.partition(sorted(_kth(part, lo, hi)))
    out = interpolate(virtual, lo, part[lo], part[hi])
    if np.isnan(part[-1]):  # NaNs partition last: any NaN makes every percentile NaN
        out[:] = part[-1]
    return out


def ranks(
    n: int, quantiles: FloatArray
) -> tuple[FloatArray, npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Where ``percentiles`` looks in n sorted values: each quantile's virtual index
    ``(n - 1) * q`` and the order statistics' ranks below and above it (-1: the last)."""
    virtual = (n - 1) * quantiles
    lower = np.floor(virtual)
    upper = lower + 1
    top = virtual >= n - 1  # at or past the last value: the last value
    lower[top] = -1
    upper[top] = -1
    return virtual, lower.astype(np.intp), upper.astype(np.intp)


def interpolate(
    virtual: FloatArray, lo: npt.NDArray[np.intp], below: FloatArray, above: FloatArray
) -> FloatArray:
    """numpy's "linear" percentiles from the order statistics at ``ranks``' ``lo``
    (``below``) and ``hi`` (``above``)."""
    gamma = virtual - lo  # past the end, lo is -1 as in numpy: gamma >= 1 takes ``above``
    diff = above - below
    out = np.add(below, diff * gamma)
    np.subtract(above, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def _kth(part: FloatArray, lo: npt.NDArray[np.intp], hi: npt.NDArray[np.intp]) -> set[int]:
    """The positions ``percentiles`` has a partition fix: ``lo``, ``hi`` and the last (its NaN
    check). numpy's set also has the first, which can change the value a position gets only
    between equal values that differ in bits, 0.0 and -0.0: asked for only with a zero
    (without one, the partition skips a pass over the low part: a third of its time)."""
    kth = {-1, *lo.tolist(), *hi.tolist()}
    if _may_hold_zero(part) and (part == 0).any():
        kth.add(0)
    return kth


def _may_hold_zero(part: FloatArray) -> bool:
    """False where every value is above zero or every one below (two reductions, no mask the
    size of the sample); True otherwise, a NaN among them included."""
    return not (part.min() > 0 or part.max() < 0)


def median(values: npt.ArrayLike) -> float:
    """``float(np.median(values))`` of a non-empty 1-D sample: the mean of its one or two
    middle order statistics (NaN if any value is NaN)."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    n = arr.size
    lo, hi = (n - 1) // 2, n // 2  # equal when n is odd
    part = np.partition(arr, sorted({lo, hi, n - 1}))
    if np.isnan(part[-1]):
        return float(part[-1])
    return float(part[lo : hi + 1].mean())  # np.median's mean: (a + b) / 2, or a / 1


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
