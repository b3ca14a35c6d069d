"""The accelerators' parts against naive references: the incremental matcher against a fresh
``match_end`` after every cache operation, kept orders against a full stable sort, the
incremental dedup against the reference queue's dedup."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.config import SchedulerConfig
from radixsched.fast.dedup import DedupIndex
from radixsched.fast.matching import IncrementalMatcher
from radixsched.fast.orders import StableOrder
from radixsched.fast.queue import FastWaitingQueue
from radixsched.policies import Round, policy_names
from radixsched.queue import WaitingQueue
from radixsched.request import Req

VOCAB = 4  # a tiny vocabulary: many shared prefixes, splits and partial matches


def _req(i: int, tokens: list[int], ns: str | None = None) -> Req:
    return Req(f"r{i}", np.asarray(tokens, dtype=np.int32), extra_key=ns)


seqs = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs, st.booleans()),
        st.tuples(st.just("evict"), st.integers(1, 30), st.booleans()),
        st.tuples(st.just("match"), seqs, st.booleans()),  # match_prefix: splits, recency
        st.tuples(st.just("track"), seqs, st.booleans()),
        st.tuples(st.just("untrack"), st.integers(0, 50), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, page=st.sampled_from([1, 2, 4]))
def test_matcher_memos_equal_a_fresh_match_after_every_operation(ops: list[Any], page: int) -> None:
    alloc = TokenAllocator(4096, page)
    cache = RadixCache(alloc, page_size=page)
    matcher = IncrementalMatcher(cache)
    tracked: list[Req] = []
    n = 0
    for op, arg, flag in ops:
        ns = ("x", None) if flag else None
        if op == "insert":
            tokens = np.asarray(arg, dtype=np.int32)[: len(arg) // page * page]
            slots = alloc.alloc(len(tokens))
            if slots is None:
                continue
            res = cache.insert(CacheKey(tokens, ns), slots)
            alloc.free(slots[: res.prefix_len])
        elif op == "evict":
            cache.evict(arg * page)
        elif op == "match":
            cache.match_prefix(CacheKey(np.asarray(arg, dtype=np.int32), ns))
        elif op == "track":
            r = _req(n, arg, "x" if flag else None)
            n += 1
            matcher.track(r)
            tracked.append(r)
        elif tracked:
            matcher.untrack(tracked.pop(arg % len(tracked)))
        matcher.refresh()
        for r in tracked:
            m = matcher.memo[id(r)]
            want = cache.match_end(CacheKey(r.fill_ids(), r.namespace))
            assert m.n == want.length, (op, r.rid)
            assert m.node is want.node, (op, r.rid)
            assert (len(m.node.key) if m.full else m.offset) == want.offset, (op, r.rid)


def test_matcher_dirties_only_the_branch_a_new_child_continues() -> None:
    """Under one shared prefix, inserting a new branch re-matches only the requests whose next
    page is that branch's first page."""
    cache = RadixCache(None, page_size=1)
    shared = list(range(100, 164))
    cache.insert(CacheKey(np.asarray(shared, dtype=np.int32)), np.arange(1, 65))
    matcher = IncrementalMatcher(cache)
    reqs = [_req(i, [*shared, 1000 + i, 7, 7]) for i in range(50)]
    for r in reqs:
        matcher.track(r)
    branch = np.asarray([*shared, 1003, 7], dtype=np.int32)
    cache.insert(CacheKey(branch), np.arange(1, 67))
    assert set(matcher.dirty) == {id(reqs[3])}
    assert matcher.refresh() == [reqs[3]]
    assert matcher.memo[id(reqs[3])].n == 66


keys = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=0, max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    initial=keys,
    rounds=st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3))),
            keys,
            st.lists(st.integers(0, 60), max_size=3),
        ),
        max_size=6,
    ),
)
def test_stable_order_equals_a_full_stable_sort(
    initial: list[tuple[int, int]], rounds: list[Any]
) -> None:
    """Re-keying members and appending arrivals gives exactly the stable sort of the list as
    the last round left it (minus leavers, plus arrivals at the back)."""
    reqs = [_req(i, [1]) for i in range(len(initial))]
    key_of = {id(r): k for r, k in zip(reqs, initial, strict=True)}
    order = StableOrder()
    order.reset(reqs, [key_of[id(r)] for r in reqs])
    listed = sorted(reqs, key=lambda r: key_of[id(r)])
    nxt = len(reqs)
    for changes, arrivals, leavers in rounds:
        for i in leavers:
            if listed:
                r = listed[i % len(listed)]
                order.remove(r)
                listed.remove(r)
        changed = {}
        for i, k in changes:
            if listed:
                r = listed[i % len(listed)]
                key_of[id(r)] = (k, k)
                changed[id(r)] = r
        new = [_req(nxt + j, [1]) for j in range(len(arrivals))]
        nxt += len(new)
        for r, k in zip(new, arrivals, strict=True):
            key_of[id(r)] = k
        mirror = [*listed, *new]
        order.update(
            [(r, key_of[id(r)]) for r in changed.values()],
            [(r, key_of[id(r)]) for r in new],
            mirror,
        )
        listed = sorted([*listed, *new], key=lambda r: key_of[id(r)])
        assert [r.rid for r in order.reqs] == [r.rid for r in listed]
        assert [r.rid for r in mirror] == [r.rid for r in listed]


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), max_size=25),
    device=st.lists(st.integers(0, 6), max_size=25),
    steps=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6), st.booleans()), max_size=15),
    check=st.integers(0, 5),
    width=st.integers(0, 4),
)
def test_dedup_index_equals_the_reference_dedup(
    prompts: list[list[int]], device: list[int], steps: list[Any], check: int, width: int
) -> None:
    cfg = SchedulerConfig(
        schedule_policy="lpm",
        in_batch_prefix_check_threshold=check,
        in_batch_prefix_deprioritize_threshold=width,
    )
    ref = WaitingQueue(cfg, RadixCache(None))
    reqs = [_req(i, p) for i, p in enumerate(prompts)]
    dev = {id(r): device[i % len(device)] if device else 0 for i, r in enumerate(reqs)}
    for r in reqs:
        r.num_matched_prefix_tokens = min(dev[id(r)], r.fill_len - 1)
    index = DedupIndex(check, width, lambda r: dev[id(r)])
    index.update(reqs, [])
    live = list(reqs)
    for i, d, leave in steps:
        if not live:
            break
        r = live[i % len(live)]
        if leave:
            live.remove(r)
            got = index.update([], [r])
        else:
            dev[id(r)] = d
            r.num_matched_prefix_tokens = min(d, r.fill_len - 1)
            got = index.update([r], [])
        ref.reqs = live
        want = ref.dedup([dev[id(q)] for q in live], Round(cfg))
        assert got == want


@pytest.mark.parametrize("page", [1, 16])
def test_match_end_agrees_with_match_len_and_match_node(page: int) -> None:
    rng = np.random.default_rng(page)
    alloc = TokenAllocator(1 << 16, page)
    cache = RadixCache(alloc, page_size=page)
    base = rng.integers(0, 5, 96).astype(np.int32)
    for _ in range(30):
        seq = np.concatenate([base[: rng.integers(0, 96)], rng.integers(0, 5, 40).astype(np.int32)])
        seq = seq[: len(seq) // page * page]
        slots = alloc.alloc(len(seq))
        assert slots is not None
        res = cache.insert(CacheKey(seq), slots)
        alloc.free(slots[: res.prefix_len])
    for _ in range(200):
        q = np.concatenate([base[: rng.integers(0, 96)], rng.integers(0, 5, 20).astype(np.int32)])
        end = cache.match_end(CacheKey(q))
        assert end.length == cache.match_len(CacheKey(q))
        assert 0 <= end.offset <= len(end.node.key)
        node = cache.match_node(CacheKey(q))  # splits at the end: the same point, named
        assert node.device_len == end.length


@pytest.mark.parametrize("page", [1, 2])
def test_matcher_follows_a_split_at_the_match_end_without_a_walk(page: int) -> None:
    """A request whose match ends inside a node is re-pointed when that node splits there, so
    the branch that then grows at the split point reaches it."""
    cache = RadixCache(None, page_size=page)
    seq = [1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(CacheKey(np.asarray(seq, dtype=np.int32)), np.arange(1, 9))
    matcher = IncrementalMatcher(cache)
    r = _req(0, [1, 2, 3, 4, 9, 9, 9, 9])
    matcher.track(r)
    assert matcher.memo[id(r)].n == 4 and not matcher.memo[id(r)].full
    cache.insert(CacheKey(np.asarray([1, 2, 3, 4, 7, 7], dtype=np.int32)), np.arange(10, 16))
    assert not matcher.dirty  # the new branch is 7, not r's next page: no re-match
    m = matcher.memo[id(r)]
    assert m.full and m.n == 4 and m.node is cache.match_end(CacheKey(r.prompt_ids)).node
    cache.insert(CacheKey(np.asarray([1, 2, 3, 4, 9, 9], dtype=np.int32)), np.arange(20, 26))
    assert matcher.refresh() == [r]
    assert matcher.memo[id(r)].n == 6


def test_matcher_rematches_what_an_eviction_cuts() -> None:
    alloc = TokenAllocator(64)
    cache = RadixCache(alloc)
    slots = alloc.alloc(8)
    assert slots is not None
    cache.insert(CacheKey(np.arange(1, 9, dtype=np.int32)), slots)
    matcher = IncrementalMatcher(cache)
    inside, whole, short = (
        _req(0, [1, 2, 3, 4, 5, 6, 0]),
        _req(1, [*range(1, 9), 0]),
        _req(2, [1, 2, 0]),
    )
    for r in (inside, whole, short):
        matcher.track(r)
    cache.evict(5)  # the leaf keeps its first 3 tokens
    assert set(matcher.refresh()) == {inside, whole}
    assert [matcher.memo[id(r)].n for r in (inside, whole, short)] == [3, 3, 2]


@pytest.mark.parametrize("page", [1, 2])
def test_touch_at_a_match_end_equals_touch_prefix(page: int) -> None:
    """The fast queue's refresh and admission touch where the memo says a match ends: the
    same clock, access times, splits and returned node as walking the key."""
    rng = np.random.default_rng(7 + page)
    caches = [RadixCache(None, page_size=page) for _ in range(2)]
    for i in range(40):
        seq = rng.integers(0, 3, int(rng.integers(1, 30)) // page * page + page).astype(np.int32)
        for c in caches:
            c.insert(CacheKey(seq), np.arange(1000 * i, 1000 * i + len(seq)))
    a, b = caches
    for _ in range(60):
        q = CacheKey(rng.integers(0, 3, int(rng.integers(1, 30))).astype(np.int32))
        want = a.match_node(q)
        end = b.match_end(q)
        got = b.touch_at(end.node, end.offset)
        assert got.id == want.last_node.id and end.length == want.device_len
        assert a._clock == b._clock
        assert [(n.id, n.last_access_time, len(n.key)) for n in a._iter_nodes()] == [
            (n.id, n.last_access_time, len(n.key)) for n in b._iter_nodes()
        ]


def _tree(cache: RadixCache) -> list[tuple[int, int, int]]:
    return [(n.id, n.last_access_time, len(n.key)) for n in cache._iter_nodes()]


@pytest.mark.parametrize("policy", policy_names())
def test_fast_queue_refresh_touches_what_the_reference_touches(policy: str) -> None:
    """The waiting-prefix refresh (spec 1.10, every 32nd round over the order's head) leaves
    the same clock, access times and splits whether it walks each key (the reference) or
    touches each request where its memo says its match ends (a policy that reads matches).
    Between rounds the caches grow and evict, requests arrive and the head is admitted."""
    rng = np.random.default_rng(11)
    caches = [RadixCache(None, page_size=1) for _ in range(2)]
    cfg = SchedulerConfig(schedule_policy=policy)
    ref, fast = WaitingQueue(cfg, caches[0]), FastWaitingQueue(cfg, caches[1])
    seq = 0

    def tokens() -> np.ndarray:
        return rng.integers(0, VOCAB, int(rng.integers(2, 40))).astype(np.int32)

    for rnd in range(100):
        for _ in range(int(rng.integers(0, 3))):
            t = tokens()
            for c in caches:
                c.insert(CacheKey(t), np.arange(1000 * seq, 1000 * seq + len(t)))
            seq += 1
        if rng.random() < 0.3:
            k = int(rng.integers(1, 20))
            for c in caches:
                c.evict(k)
        for _ in range(int(rng.integers(0, 3))):
            t = tokens()
            for q in (ref, fast):
                q.add(Req(f"w{seq}", t.copy(), arrival_time=float(seq), tenant=f"t{seq % 3}"))
            seq += 1
        orders = [q.begin_round([], 10 * rnd, float(rnd)) for q in (ref, fast)]
        heads = [[r.rid for r in o.head(len(ref) + 1)] for o in orders]
        assert heads[0] == heads[1], rnd
        assert caches[0]._clock == caches[1]._clock, rnd
        assert _tree(caches[0]) == _tree(caches[1]), rnd
        if len(ref) > 6 and rng.random() < 0.5:  # the head is admitted
            for q, o in zip((ref, fast), orders, strict=True):
                q.take([o.position(0)])
