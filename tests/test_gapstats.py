"""``results.gapstats``: the inter-token gaps' ``Stats`` made a batch at a time, against the array
of every gap (``Stats.of(token_gaps(...), consume=True)``), bit for bit."""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Sequence

import numpy as np
import pytest

from radixsched.results import gapstats
from radixsched.results.gapstats import _leaves, _tree_sum, gap_stats
from radixsched.results.requests import token_gaps
from radixsched.results.stats import Stats


def _bits(s: Stats) -> list[bytes]:
    """Each field's float64 bits, NaN as one pattern (its payload never reaches the results)."""
    return [
        b"nan" if isinstance(v, float) and math.isnan(v) else np.float64(v).tobytes() for v in s
    ]


def _times(seed: int, count: int = 1500, quantum: float = 1e-4) -> list[list[float]]:
    """Token times of ``count`` requests, on a grid of ``quantum`` (repeated gaps: ties at the
    ranks), 1 to 300 tokens each: about 220k gaps, several leaves and batches. Each request
    starts after the one before ends, so a gap made across two of them would be positive too
    (and not one of theirs)."""
    rng = np.random.default_rng(seed)
    out = []
    end = 0.0
    for n in rng.integers(1, 300, count).tolist():
        steps = np.round(rng.exponential(0.004, n) / quantum) * quantum + quantum
        out.append((end + rng.random() + np.cumsum(steps)).tolist())
        end = out[-1][-1]
    return out


def _packed(times: list[list[float]]) -> list[array[float]]:
    return [array("d", t) for t in times]


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gapstats, "STREAM_MIN_GAPS", 1)
    monkeypatch.setattr(gapstats, "_BATCH_GAPS", 1 << 16)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("packed", [True, False])
def test_the_streamed_stats_are_the_array_s(seed: int, packed: bool) -> None:
    times = _times(seed)
    seqs = _packed(times) if packed else times
    want = Stats.of(token_gaps(seqs), consume=True)
    assert want.n > 3 * (1 << 16)
    assert _bits(gap_stats(seqs)) == _bits(want)


def test_arrays_with_lists_among_them_are_the_array_s() -> None:
    # A deferred run's requests that finished after its last compaction hold lists.
    times = _times(5)
    seqs: list[Sequence[float]] = [
        *_packed(times[:1000]),
        *times[1000:1100],
        *_packed(times[1100:]),
    ]
    want = Stats.of(token_gaps(seqs), consume=True)
    assert _bits(gap_stats(seqs)) == _bits(want)


@pytest.mark.parametrize(
    "odd",
    [math.nan, math.inf, -1e-3, -10.0, -0.0, 0.0],
    ids=["nan", "inf", "neg", "neg-large", "-0", "+0"],
)
def test_a_gap_below_zero_or_not_finite_is_the_array_s(odd: float) -> None:
    times = _times(3, count=800)
    if odd == 0.0:  # +0.0 (a time repeated), or -0.0 (a time of -0.0 after one of 0.0)
        times[400][:2] = [0.0, math.copysign(0.0, odd)]
    else:
        times[400][5] = times[400][4] + odd
    for seqs in (times, _packed(times)):
        with np.errstate(invalid="ignore"):
            want = Stats.of(token_gaps(seqs), consume=True)
            assert _bits(gap_stats(seqs)) == _bits(want)


def test_a_short_sample_is_summed_in_one_array(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gapstats, "STREAM_MIN_GAPS", 1 << 22)

    def refused(*args: object) -> None:
        raise AssertionError("streamed")

    monkeypatch.setattr(gapstats, "_first_pass", refused)
    times = _times(4, count=50)
    assert _bits(gap_stats(times)) == _bits(Stats.of(token_gaps(times), consume=True))


def test_no_gaps_at_all() -> None:
    assert gap_stats([[1.0], [], [2.0]]) == Stats.of([])


@pytest.mark.parametrize("n", [1, 65536, 65537, 200_003, 1 << 18])
def test_the_leaves_sums_combine_as_numpy_s_pairwise_sum(n: int) -> None:
    values = np.random.default_rng(n).standard_normal(n) * 1e3
    sizes = _leaves(n)
    assert sum(sizes) == n and max(sizes) <= 65536
    bounds = np.cumsum([0, *sizes])
    sums = iter(float(np.add.reduce(values[a:b])) for a, b in itertools.pairwise(bounds))
    assert np.float64(_tree_sum(n, sums)).tobytes() == np.add.reduce(values).tobytes()


def _naive_gaps(seqs: Sequence[Sequence[float]]) -> bytes:
    gaps = [float(b) - float(a) for s in seqs if len(s) > 1 for a, b in itertools.pairwise(s)]
    return np.array(gaps, dtype=np.float64).tobytes()


def test_native_gaps_are_each_sequence_s_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixsched.native import core
    from radixsched.results import requests

    times = _times(6, count=300)
    mixed: list[Sequence[float]] = [
        *_packed(times[:100]),
        *times[100:200],
        *(np.array(t, dtype=np.float64) for t in times[200:250]),
        *times[250:],
    ]
    odd = [[0.5, 1.5], [1, 2.5], [3.0]]  # an int: converted as numpy converts it
    narrow = [array("f", [0.5, 1.75]), array("d", [2.0, 2.5])]  # float32: converted too
    strided = [np.arange(10.0)[::2], [1.0, 3.0]]  # not contiguous: converted
    cases = [times, _packed(times), mixed, odd, narrow, strided, []]
    for seqs in cases:
        assert token_gaps(seqs).tobytes() == _naive_gaps(seqs)
        assert _bits(gap_stats(seqs)) == _bits(Stats.of(token_gaps(seqs), consume=True))
    streamed = {id(s): _bits(gap_stats(s)) for s in cases}
    mod = core()
    if mod is not None and hasattr(mod, "join_gaps"):
        out = np.empty(3)
        assert mod.join_gaps([[1.0, 2.0], [4.0, 8.0, 9.5]], 0, 2, out) and out.tolist() == [
            1.0,
            4.0,
            1.5,
        ]
        assert mod.join_gaps([[1.0, 2.0], [0.0, 4.0, 8.0, 9.5]], 1, 2, out)
        assert out.tolist() == [4.0, 4.0, 1.5]
        assert not mod.join_gaps([[1.0, 2.0]], 0, 1, out)  # fewer gaps than out holds
        assert not mod.join_gaps([[1.0, 2.0, 3.0, 4.0, 5.0]], 0, 1, out)  # more
        assert not mod.join_gaps([[1.0], [1.0, 2.0, 3.0, 4.0]], 0, 2, out)  # one too short
        with pytest.raises(ValueError, match="first"):
            mod.join_gaps([[1.0, 2.0]], 1, 0, out)
        with pytest.raises(ValueError, match="first"):
            mod.join_gaps([[1.0, 2.0]], 0, 2, out)
    monkeypatch.setattr(requests, "core", lambda: None)
    monkeypatch.setattr(gapstats, "core", lambda: None)
    for seqs in cases:
        assert token_gaps(seqs).tobytes() == _naive_gaps(seqs)
        assert _bits(gap_stats(seqs)) == streamed[id(seqs)]


def test_native_bucket_passes_are_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixsched.native import core

    mod = core()
    if getattr(mod, "count_buckets", None) is None:
        pytest.skip("no native core with count_buckets")
    assert mod is not None
    rng = np.random.default_rng(7)
    g = np.concatenate([rng.exponential(0.01, 5000), [0.0, 5e-324, 1e300, 0.25, 0.25]])
    counts = np.zeros(gapstats._FINITE, dtype=np.int64)
    want = np.zeros(gapstats._FINITE, dtype=np.int64)
    assert mod.count_buckets(g, counts, gapstats._BUCKET_SHIFT)
    assert gapstats._count_buckets(g, want) and counts.tobytes() == want.tobytes()
    for odd in (-1.0, -0.0, math.inf, math.nan):  # a bucket out of range: declined
        bad = np.concatenate([g, [odd]])
        assert not mod.count_buckets(bad, counts.copy(), gapstats._BUCKET_SHIFT)
        assert not gapstats._count_buckets(bad, counts.copy())
    keep = np.zeros(gapstats._FINITE, dtype=np.bool_)
    keep[gapstats._buckets(g[::7])] = True
    out = np.empty(g.size + 3)
    k = mod.keep_buckets(g, keep, gapstats._BUCKET_SHIFT, out)
    assert out[:k].tobytes() == g[keep[gapstats._buckets(g)]].tobytes() and 0 < k < g.size
    with pytest.raises(ValueError, match="shorter"):
        mod.keep_buckets(g, keep, gapstats._BUCKET_SHIFT, np.empty(3))
    with pytest.raises(ValueError, match="range"):
        mod.keep_buckets(np.array([-1.0]), keep, gapstats._BUCKET_SHIFT, out)
    # The stats the same with the passes native or not, and with a batch not contiguous
    times = _times(8)
    native = _bits(gap_stats(times))
    monkeypatch.setattr(gapstats, "core", lambda: None)
    assert _bits(gap_stats(times)) == native
    monkeypatch.undo()
    real = gapstats._GapStream.gaps
    monkeypatch.setattr(
        gapstats._GapStream, "gaps", lambda s, a, b: np.repeat(real(s, a, b), 2)[::2]
    )
    assert _bits(gap_stats(times)) == native
