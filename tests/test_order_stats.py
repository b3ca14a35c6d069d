"""``results.stats``' percentiles and median against numpy's, bit for bit: odd and even sizes,
one value, repeated values, infinities and NaNs, in place or on a copy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.results import stats as stats_module
from radixsched.results.stats import _QUANTILES, Stats, median, percentiles

VALUES = st.lists(
    st.floats(allow_nan=True, allow_infinity=True, width=64)
    | st.sampled_from([0.1, 0.2, 0.3, 1e-300, -0.0, 0.0]),
    min_size=1,
    max_size=40,
)


def _bits(x: float | np.ndarray) -> bytes:
    return np.asarray(x, dtype=np.float64).tobytes()


def _same(got: float | np.ndarray, want: float | np.ndarray) -> bool:
    """Equal bit for bit, a NaN matching any NaN (its payload never reaches the results)."""
    g, w = np.atleast_1d(np.asarray(got, dtype=np.float64)), np.atleast_1d(np.asarray(want))
    return g.shape == w.shape and all(
        (math.isnan(a) and math.isnan(b)) or _bits(a) == _bits(b) for a, b in zip(g, w, strict=True)
    )


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans())
def test_percentiles_are_numpys(values: list[float], in_place: bool) -> None:
    arr = np.array(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        want = np.percentile(arr.copy(), [50.0, 90.0, 95.0, 99.0])
        got = percentiles(arr, _QUANTILES, overwrite_input=in_place)
    assert _same(got, want)
    if not in_place:
        assert _bits(arr) == _bits(np.array(values, dtype=np.float64))  # left as it was


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_median_is_numpys(values: list[float]) -> None:
    with np.errstate(all="ignore"):
        assert _same(median(values), float(np.median(values)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300))
def test_stats_percentiles_are_numpys(values: list[float]) -> None:
    s = Stats.of(values)
    want = np.percentile(np.array(values), [50.0, 90.0, 95.0, 99.0])
    assert _same(np.array([s.p50, s.p90, s.p95, s.p99]), want)


def test_by_hand() -> None:
    assert median([3.0]) == 3.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([0.1, 0.2]) == (0.1 + 0.2) / 2
    assert math.isnan(median([1.0, float("nan"), 2.0]))
    arr = np.array([1.0, 2.0, 3.0, 4.0])
    assert percentiles(arr, np.array([0.5, 0.9, 1.0])).tolist() == [2.5, 3.7, 4.0]
    assert percentiles(np.array([7.0]), _QUANTILES).tolist() == [7.0] * 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6) | st.sampled_from([0.0, 3.0, 1e-300]), min_size=1, max_size=400),
    st.sampled_from([1, 130, 200, 1 << 16]),
)
def test_std_by_slices_is_numpys(values: list[float], at_once: int) -> None:
    """The spread's squares summed a slice at a time: numpy's pairwise sum of them, bit for bit
    (a slice of 1 value: every subtree of more than numpy's block of 128 is split)."""
    arr = np.array(values)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stats_module, "_SQUARES_AT_ONCE", at_once)
        got = Stats.of(arr)
    assert _same(got.std, stats_module._as_float(np.std(arr)))


def test_std_by_slices_of_a_long_sample() -> None:
    arr = np.random.default_rng(7).random(300_007) * 1e3
    assert Stats.of(arr).std == float(np.std(arr))
    assert Stats.of(arr[3:]).std == float(np.std(arr[3:]))


@pytest.mark.parametrize("at_once", [1, 1 << 16])
@pytest.mark.parametrize("n", [129, 200, 1000, 4099, 300_007])
def test_squares_by_slices_are_numpys_sum(at_once: int, n: int) -> None:
    """The sum itself (the spread's square root can hide its last bit): numpy's pairwise sum
    of the squared deviations, bit for bit, whatever the slices."""
    arr = np.random.default_rng(n).random(n) * 1e3
    center = arr.mean()
    want = float(np.add.reduce(np.square(arr - center)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stats_module, "_SQUARES_AT_ONCE", at_once)
        assert stats_module._sum_of_squares(arr, center) == want


def test_zeros_of_both_signs_among_positives_are_numpys() -> None:
    """The first position fixed whenever a zero may be there (``_may_hold_zero``): which of
    0.0 and -0.0 a percentile takes follows numpy's partition, for samples at or above zero."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        arr = rng.choice(np.array([-0.0, 0.0, 0.0, 1.5, 2.0]), size=int(rng.integers(2, 30)))
        want = np.percentile(arr, [50.0, 90.0, 95.0, 99.0])
        assert _same(percentiles(arr.copy(), _QUANTILES), want)
