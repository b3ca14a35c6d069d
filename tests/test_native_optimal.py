"""The optimal bound's native trie (``_native/optimal.cpp``) finds, for each sequence in
order, the prefix already present among the earlier ones of its namespace: the same lengths
as the reference radix tree (``results.optimal._tree_prefixes``), for any sequences,
namespaces and order; and ``optimal_hits`` is the same with the native core as without."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.native import core
from radixsched.request import Req, SamplingParams
from radixsched.results import optimal

needs_native = pytest.mark.skipif(
    getattr(core(), "optimal_prefixes", None) is None, reason="no native optimal bound built"
)


def _naive(seqs: list[np.ndarray], namespaces: list[object]) -> list[int]:
    """Each sequence's longest common prefix with any earlier one of its namespace."""
    out = []
    for i, s in enumerate(seqs):
        best = 0
        for t, ns in zip(seqs[:i], namespaces[:i], strict=True):
            if ns != namespaces[i]:
                continue
            m = min(len(s), len(t))
            diff = np.nonzero(s[:m] != t[:m])[0]
            best = max(best, int(diff[0]) if len(diff) else m)
        out.append(best)
    return out


# Sequences over a tiny alphabet, built from a few shared stems: long shared prefixes, splits
# inside an edge, sequences that are prefixes of earlier ones and the reverse.
stems = st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=12), min_size=1, max_size=4)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    stems=stems,
    picks=st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 2), max_size=6), st.integers(0, 2)),
        min_size=1,
        max_size=14,
    ),
)
def test_the_trie_finds_what_the_tree_and_a_naive_scan_find(
    stems: list[list[int]], picks: list[tuple[int, list[int], int]]
) -> None:
    seqs = [np.array(stems[k % len(stems)] + tail, dtype=np.int32) for k, tail, _ in picks]
    namespaces: list[object] = [None if ns == 0 else ("t", str(ns)) for _, _, ns in picks]
    got = optimal._native_prefixes(seqs, namespaces)  # type: ignore[arg-type]
    assert got == optimal._tree_prefixes(seqs, namespaces)  # type: ignore[arg-type]
    assert got == _naive(seqs, namespaces)


@needs_native
def test_a_split_inside_an_edge_and_a_prefix_of_an_edge() -> None:
    a = np.array([1, 2, 3, 4, 5], dtype=np.int32)
    b = np.array([1, 2, 9], dtype=np.int32)  # splits a's edge after 2 tokens
    c = np.array([1, 2], dtype=np.int32)  # ends on the split
    d = np.array([1, 2, 3], dtype=np.int32)  # ends inside a's rest: nothing new
    e = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)  # extends a past its leaf
    f = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    lib = core()
    assert lib is not None
    assert lib.optimal_prefixes([a, b, c, d, e, f], [0] * 6) == [0, 2, 2, 3, 5, 6]
    assert lib.optimal_prefixes([a, a], [0, 1]) == [0, 0]  # namespaces never share
    assert lib.optimal_prefixes([], []) == []
    with pytest.raises(ValueError):
        lib.optimal_prefixes([a], [])


def _req(rid: str, tokens: list[int], t: float, scripted: list[int] | None = None) -> Req:
    r = Req(rid, np.array(tokens, dtype=np.int32), SamplingParams(max_new_tokens=3))
    r.arrival_time = t
    if scripted is not None:
        r.scripted_output = np.array(scripted, dtype=np.int32)
    return r


@needs_native
def test_optimal_hits_are_the_same_with_and_without_the_native_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Out of arrival order, a scripted output fed back (all but its last token), a non-int32
    # prompt (the tree then takes the whole list), and pages.
    reqs = [
        _req("b", [1, 2, 3, 7, 8, 9], 2.0),
        _req("a", [1, 2, 3], 1.0, scripted=[7, 8, 5]),
        _req("c", [1, 2, 3, 7, 8, 5, 4], 3.0),
    ]
    native = [optimal.optimal_hits(reqs, p) for p in (1, 2)]
    assert native == [[5, 0, 5], [4, 0, 4]]
    monkeypatch.setattr(optimal, "_native_prefixes", lambda seqs, ns: None)
    assert [optimal.optimal_hits(reqs, p) for p in (1, 2)] == native
    monkeypatch.undo()
    reqs[2].prompt_ids = reqs[2].prompt_ids.astype(np.int64)
    assert optimal._native_prefixes([r.prompt_ids for r in reqs], [None] * 3) is None
    assert optimal.optimal_hits(reqs, 1) == native[0]
