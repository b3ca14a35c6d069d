"""Req helpers that the scheduler's hot paths rely on."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.request import Req


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 99), min_size=1, max_size=30),
    output=st.lists(st.integers(0, 99), max_size=30),
    bounds=st.tuples(st.integers(0, 60), st.integers(0, 60)),
    memo=st.booleans(),
)
def test_fill_slice_is_a_slice_of_fill_ids(
    prompt: list[int], output: list[int], bounds: tuple[int, int], memo: bool
) -> None:
    r = Req("r", np.asarray(prompt, dtype=np.int32))
    r.output_ids = list(output)
    if memo:
        r.fill_ids()  # the memo is current: the slice is a view of it
    n = len(prompt) + len(output)
    lo, hi = sorted(min(b, n) for b in bounds)
    got = r.fill_slice(lo, hi)
    assert got.dtype == np.int32
    assert got.tolist() == (prompt + output)[lo:hi]
