"""The cold round's shortcuts: lpm's batch keys equal its key function's, the native round sets
what the reference round sets, and a re-match at an unchanged edge leaves the matcher's
registrations in the order a re-track gives (what a later cache change marks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.matching import NativeMatcher
from radixsched.native.orders import key_fn, keys_of
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import Round, get_policy
from radixsched.request import Req

native = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _req(i: int, tokens: list[int]) -> Req:
    return Req(f"r{i}", np.asarray(tokens, dtype=np.int32), arrival_time=float(i % 3))


def _queue() -> list[Req]:
    reqs = [_req(i, [1, 2, i % 4, i]) for i in range(8)]
    for i, r in enumerate(reqs):
        r.num_matched_prefix_tokens = (5 * i) % 3
        r.queue_entry_time = float(i % 2)
    reqs[-1].num_matched_prefix_tokens = reqs[-1].fill_len  # spf's work floored at 1
    return reqs


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"enable_priority_scheduling": True},
        {"lpm_max_wait_s": 0.5},
        {"lpm_max_wait_tokens": 3},
    ],
)
@pytest.mark.parametrize("name", ["lpm", "shortest-prefill-first"])
def test_batch_keys_equal_the_policy_key(name: str, extra: dict[str, object]) -> None:
    cfg = SchedulerConfig(schedule_policy=name, **extra)  # type: ignore[arg-type]
    pol = get_policy(name)
    queue = _queue()
    rnd = Round(cfg, deferred=frozenset({"r1", "r4"}), now=2.0, processed_tokens=7)
    got, want = keys_of(pol, queue, rnd), [key_fn(pol, rnd)(r) for r in queue]
    assert got == want
    assert [list(map(type, k)) for k in got] == [list(map(type, k)) for k in want]


def _tree(seqs: list[list[int]]) -> NativeRadixCache:
    cache = NativeRadixCache(None, page_size=1)
    for s in seqs:
        cache.insert(CacheKey(np.asarray(s, dtype=np.int32)), np.arange(1, len(s) + 1))
    return cache


SEQS = [[1, 2, 3, 4], [1, 2, 5], [7, 8]]
FILLS = [[1, 2, 3, 9], [1, 2, 3, 9, 9], [1, 2, 6], [1, 2, 3, 4, 5], [7, 8, 1], [1, 2, 3, 9]]


@native
def test_set_matched_sets_the_capped_memo_length() -> None:
    m = NativeMatcher(_tree(SEQS))
    reqs = [_req(i, f) for i, f in enumerate(FILLS)]
    for r in reqs:
        m.track(r)
    m.round(reqs, [], {}, {}, matched=False, dedup=False, order=None)  # the whole queue's
    assert [r.num_matched_prefix_tokens for r in reqs] == [
        min(m.memo[id(r)].n, r.fill_len - 1) for r in reqs
    ]


tokens = st.lists(st.integers(0, 3), min_size=1, max_size=6)


@native
@settings(max_examples=150, deadline=None)
@given(
    fills=st.lists(tokens, min_size=1, max_size=8),
    before=st.lists(st.tuples(tokens, st.integers(0, 4)), max_size=8),
    after=st.lists(tokens, min_size=1, max_size=4),
)
def test_a_cold_rematch_registers_as_a_retrack_does(
    fills: list[list[int]], before: list[tuple[list[int], int]], after: list[list[int]]
) -> None:
    """Inserts and evictions move matches between edges; then one matcher re-matches all after
    a memo drop and the other re-tracks each in tracking order (unregistered, registered);
    the same later inserts then mark the same requests dirty in the same order."""
    orders = []
    for cold in (True, False):
        cache = _tree([[0, 1]])
        m = NativeMatcher(cache)
        reqs = [_req(i, f) for i, f in enumerate(fills)]
        for r in reqs:
            m.track(r)
        for seq, evict in before:
            cache.insert(CacheKey(np.asarray(seq, dtype=np.int32)), np.arange(1, len(seq) + 1))
            cache.evict(evict)
            m.refresh()
        if cold:
            m.on_reset()
            m.refresh()
        else:
            for r in reqs:
                m.track(r)
        names = {id(r): r.rid for r in reqs}
        got = []
        for seq in after:
            cache.insert(CacheKey(np.asarray(seq, dtype=np.int32)), np.arange(1, len(seq) + 1))
            got.append([names[k] for k in m.dirty])
            m.refresh()
        orders.append(got)
    assert orders[0] == orders[1]


@native
@pytest.mark.parametrize("page", [1, 2])
def test_a_cold_refresh_of_many_requests_ends_where_a_fresh_match_does(page: int) -> None:
    """After a memo drop, the requests are re-matched together (lookups shared across them,
    the same first page under the root kept apart by namespace): each memo ends where a
    fresh match of its fill ends, and none moved over an unchanged tree."""
    cache = NativeRadixCache(None, page_size=page)
    head = [1, 2, 3, 4, 5, 6]
    for ns in (None, ("x", None)):
        for g in range(3):
            for i in range(2):
                seq = np.asarray(head + [20 + g] * 4 + [40 + i, 41], dtype=np.int32)
                cache.insert(CacheKey(seq, ns), np.arange(1, len(seq) + 1))
        cache.insert(CacheKey(np.asarray([9, 9, 9, 9], dtype=np.int32), ns), np.arange(1, 5))
    fills = [
        head + [20 + g] * 4 + tail
        for g in range(4)
        for tail in ([40, 41], [40, 42, 7], [], [41, 41, 41])
    ]
    fills += [[1], [1, 2], head[:3], [9, 9, 8, 8], [5, 5, 5, 5], [*head, 20, 20, 7]]
    m = NativeMatcher(cache)
    reqs = [
        Req(f"r{i}-{ns}", np.asarray(f, dtype=np.int32), extra_key=ns)
        for ns in (None, "x", "y")
        for i, f in enumerate(fills)
    ]
    for r in reqs:
        m.track(r)
    m.on_reset()
    assert m.refresh() == []
    for r in reqs:
        got = m.memo[id(r)]
        want = cache.match_end(CacheKey(r.fill_ids(), r.namespace))
        assert (got.n, got.node.id) == (want.length, want.node.id), r.rid
        assert (len(got.node) if got.full else got.offset) == want.offset, r.rid
