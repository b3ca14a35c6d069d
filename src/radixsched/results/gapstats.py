"""The inter-token latencies' ``Stats`` of a long run without the array of every gap.

``Stats.of(token_gaps(times), consume=True)`` holds every gap at once: 148M float64 (1.2 GB of
fresh pages, the command's peak memory) for a million Mooncake requests, then partitions them
all for four percentiles. ``gap_stats`` gives the same ``Stats``, bit for bit, from the gaps
made a batch at a time, twice:

- the mean, the maximum and the spread add the same numbers in the same tree as numpy's
  pairwise sum over the whole array: a sum of n > 65,536 values is the sum of its halves'
  (``stats._sum_of_squares``), so each batch of whole subtrees (leaves of at most 65,536
  values) is summed on its own and the leaves' sums are combined as the tree combines them;
- a percentile's order statistics are found by counting: the first pass counts the gaps by
  the top bits of their float64 patterns (for positive numbers, ordered as their values), the
  second keeps only the gaps of the buckets that hold the ranks asked for (about 1% of them),
  and the rank within a bucket is taken from those; a finite value of +0.0 or more has one
  bit pattern, so the k-th smallest is the same number whichever way it is found.

A gap below +0.0 or not finite (-0.0 beside 0.0, where numpy's own partition decides which
bits a rank gets; a NaN, which makes every percentile NaN) sends the sample back to the array
of every gap, as does a run too short to matter (``STREAM_MIN_GAPS``)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np

from radixsched.native import core
from radixsched.results.requests import token_gaps
from radixsched.results.stats import (
    _QUANTILES,
    _SQUARES_AT_ONCE,
    FloatArray,
    Stats,
    _as_float,
    interpolate,
    ranks,
)

STREAM_MIN_GAPS = 1 << 22  # fewer gaps: one array of them all (32 MB)
_BATCH_GAPS = 1 << 18  # gaps made at once (at least; whole leaves): 2 MB of float64
_BUCKET_SHIFT = 44  # a float64's bits >> 44: its sign, exponent and top 8 mantissa bits
_FINITE = 0x7FF00  # infinities' and NaNs' buckets start here (an exponent of all ones)


def gap_stats(token_times: Sequence[Sequence[float]]) -> Stats:
    """``Stats.of(token_gaps(token_times), consume=True)``, bit for bit."""
    seqs = [tt for tt in token_times if len(tt) > 1]
    gaps = _GapStream(seqs)
    n = gaps.total
    first = _first_pass(gaps) if n >= STREAM_MIN_GAPS else None
    if first is None:
        return Stats.of(token_gaps(seqs), consume=True)
    total, counts = first
    mean = np.float64(total) / n  # ``arr.mean()``: the sum's float64 over the count
    virtual, lo, hi = ranks(n, _QUANTILES)
    wanted = {int(r) % n for r in (*lo.tolist(), *hi.tolist(), -1)}  # (-1: the last)
    squares, values = _second_pass(gaps, mean, counts, wanted)
    top = values[n - 1]
    std = math.sqrt(squares / n)
    below = np.array([values[int(r) % n] for r in lo.tolist()], dtype=np.float64)
    above = np.array([values[int(r) % n] for r in hi.tolist()], dtype=np.float64)
    p50, p90, p95, p99 = map(_as_float, interpolate(virtual, lo, below, above))
    return Stats(_as_float(mean), _as_float(std), p50, p90, p95, p99, _as_float(top), n)


class _GapStream:
    """The gaps of ``seqs`` (each longer than one) as ``token_gaps`` orders them, made a range
    at a time from the sequences that hold it. Each gap is ``later - earlier`` in float64,
    whichever sequences are joined to make it: the same number ``token_gaps`` gives."""

    def __init__(self, seqs: Sequence[Sequence[float]]) -> None:
        self.seqs = seqs
        lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        self.ends = np.cumsum(lens - 1)  # each sequence's gaps end here
        self.lens = lens
        self.total = int(self.ends[-1]) if len(seqs) else 0
        # The native core writes a range's gaps from lists and arrays alike (``join_gaps``);
        # without it, or where it declines, ``_loose`` decides.
        self.join = getattr(core(), "join_gaps", None)
        self.listed = seqs if type(seqs) is list else list(seqs)
        self._loose: np.ndarray | None = None
        self._out = np.empty(0, dtype=np.float64)  # join's output, reused (``batches``)

    @property
    def loose(self) -> np.ndarray:
        """A deferred run's finished requests hold ``array('d')``s (``deferred.compact``; those
        that finished after its last compaction, lists): a range of arrays only is joined as
        bytes, any other through ``token_gaps``. ``loose[i]``: the others before seqs[i]."""
        if self._loose is None:
            others = (not (type(s) is array and s.typecode == "d") for s in self.seqs)
            self._loose = np.zeros(len(self.seqs) + 1, dtype=np.int64)
            np.cumsum(
                np.fromiter(others, dtype=np.bool_, count=len(self.seqs)), out=self._loose[1:]
            )
        return self._loose

    def gaps(self, a: int, b: int) -> FloatArray:
        """Gaps ``a`` to ``b`` (0 <= a < b <= total)."""
        first = int(np.searchsorted(self.ends, a, side="right"))
        last = int(np.searchsorted(self.ends, b - 1, side="right")) + 1
        start = int(self.ends[first - 1]) if first else 0
        if self.join is not None:
            if self._out.size < (m := int(self.ends[last - 1]) - start):
                self._out = np.empty(m, dtype=np.float64)
            out = self._out[:m]
            if self.join(self.listed, first, last, out):
                return out[a - start : b - start]
        if self.loose[last] != self.loose[first]:
            return token_gaps(self.seqs[first:last])[a - start : b - start]
        flat = np.frombuffer(b"".join(cast("list[array[float]]", self.seqs[first:last])))
        # flat[k + 1] - flat[k] at a sequence's last time runs into the next: dropped
        joined = np.delete(flat[1:] - flat[:-1], np.cumsum(self.lens[first : last - 1]) - 1)
        return joined[a - start : b - start]

    def batches(self) -> Iterator[tuple[FloatArray, list[int]]]:
        """Every gap once, in order: (a batch, its leaves' sizes), each batch whole leaves,
        valid until the next is asked for (the joined gaps' buffer is reused: fresh pages
        for each batch cost more than the join)."""
        a, b, sizes = 0, 0, []
        for size in _leaves(self.total):
            sizes.append(size)
            b += size
            if b - a >= _BATCH_GAPS:
                yield self.gaps(a, b), sizes
                a, sizes = b, []
        if sizes:
            yield self.gaps(a, b), sizes


def _leaves(n: int) -> list[int]:
    """The sizes of numpy's pairwise-sum subtrees of at most ``_SQUARES_AT_ONCE`` values that
    cover n values, in order (``stats._sum_of_squares``' slices)."""
    if n <= _SQUARES_AT_ONCE:
        return [n]
    half = n // 2
    half -= half % 8
    return _leaves(half) + _leaves(n - half)


def _tree_sum(n: int, leaf_sums: Iterator[float]) -> float:
    """The pairwise sum of n values from their leaves' sums, combined as numpy combines them
    (the left subtree's first)."""
    if n <= _SQUARES_AT_ONCE:
        return next(leaf_sums)
    half = n // 2
    half -= half % 8
    return _tree_sum(half, leaf_sums) + _tree_sum(n - half, leaf_sums)


def _buckets(g: FloatArray) -> np.ndarray:
    return g.view(np.int64) >> _BUCKET_SHIFT


def _first_pass(gaps: _GapStream) -> tuple[float, np.ndarray] | None:
    """The gaps' pairwise sum and their counts by bucket; None where a gap is not +0.0 or more
    and finite (a negative number's bucket, -0.0's too, is negative; infinities' and NaNs'
    are ``_FINITE`` or more). A batch is counted in one native pass (``count_buckets``), else
    by ``_count_buckets``."""
    sums: list[float] = []
    counts = np.zeros(_FINITE, dtype=np.int64)
    count = getattr(core(), "count_buckets", None)  # the counting in one native pass
    for g, sizes in gaps.batches():
        if count is not None and g.flags.c_contiguous:
            if not count(g, counts, _BUCKET_SHIFT):
                return None
        elif not _count_buckets(g, counts):
            return None
        at = 0
        for size in sizes:
            sums.append(float(np.add.reduce(g[at : at + size])))
            at += size
    return _tree_sum(gaps.total, iter(sums)), counts


def _count_buckets(g: FloatArray, counts: np.ndarray) -> bool:
    """``counts[bucket] += 1`` for each gap of ``g``, counting only the buckets between its
    lowest and highest; False (nothing counted) where one is negative or ``_FINITE`` or more."""
    b = _buckets(g)
    low, high = int(b.min()), int(b.max())
    if low < 0 or high >= _FINITE:
        return False
    counts[low : high + 1] += np.bincount(b - low, minlength=high - low + 1)
    return True


def _second_pass(
    gaps: _GapStream, mean: np.float64, counts: np.ndarray, wanted: set[int]
) -> tuple[float, dict[int, float]]:
    """The squares' sum about ``mean`` (``stats._sum_of_squares``) and the value at each
    ``wanted`` rank (0-based, ascending order)."""
    ends = np.cumsum(counts)
    where = {r: int(np.searchsorted(ends, r, side="right")) for r in wanted}  # rank's bucket
    keep = np.zeros(_FINITE, dtype=np.bool_)
    keep[list(where.values())] = True
    squares: list[float] = []
    kept: list[FloatArray] = []
    pick = getattr(core(), "keep_buckets", None)  # the kept gaps in one native pass
    scratch = np.empty(0, dtype=np.float64)
    for g, sizes in gaps.batches():
        at = 0
        for size in sizes:
            dev = np.subtract(g[at : at + size], mean)
            squares.append(float(np.add.reduce(np.square(dev, out=dev))))
            at += size
        if pick is not None and g.flags.c_contiguous:
            if scratch.size < g.size:
                scratch = np.empty(g.size, dtype=np.float64)
            kept.append(scratch[: pick(g, keep, _BUCKET_SHIFT, scratch)].copy())
        else:
            kept.append(g[keep[_buckets(g)]])
    pool = np.concatenate(kept)
    pool_buckets = _buckets(pool)
    values = {}
    for r, b in where.items():
        inside = pool[pool_buckets == b]  # the bucket's values; ranks before it: ends[b - 1]
        k = r - (int(ends[b - 1]) if b else 0)
        values[r] = float(np.partition(inside, k)[k])
    return _tree_sum(gaps.total, iter(squares)), values
