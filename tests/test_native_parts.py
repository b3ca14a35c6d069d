"""The accelerators' parts against naive references: the incremental matcher against a fresh
``match_end`` after every cache operation, kept orders against a full stable sort, the
native incremental dedup against the reference queue's dedup."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.config import SchedulerConfig
from radixsched.kv import KVManager
from radixsched.native import core
from radixsched.native.kv import NativeKVManager
from radixsched.native.matching import NativeMatcher
from radixsched.native.orders import stable_order
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache, make_pool
from radixsched.policies import Round, policy_names
from radixsched.queue import WaitingQueue
from radixsched.request import Req, SamplingParams

VOCAB = 4  # a tiny vocabulary: many shared prefixes, splits and partial matches
# The accelerated parts run over the native core only: their tests need it built.
native = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


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


@native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, page=st.sampled_from([1, 2, 4]))
def test_matcher_memos_equal_a_fresh_match_after_every_operation(ops: list[Any], page: int) -> None:
    alloc = TokenAllocator(4096, page)
    cache = NativeRadixCache(alloc, page_size=page)
    matcher = NativeMatcher(cache)
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
            assert m.node.id == want.node.id, (op, r.rid)
            assert (len(m.node) if m.full else m.offset) == want.offset, (op, r.rid)


@native
def test_matcher_dirties_only_the_branch_a_new_child_continues() -> None:
    """Under one shared prefix, inserting a new branch re-matches only the requests whose next
    page is that branch's first page."""
    cache = NativeRadixCache(None, page_size=1)
    shared = list(range(100, 164))
    cache.insert(CacheKey(np.asarray(shared, dtype=np.int32)), np.arange(1, 65))
    matcher = NativeMatcher(cache)
    reqs = [_req(i, [*shared, 1000 + i, 7, 7]) for i in range(50)]
    for r in reqs:
        matcher.track(r)
    branch = np.asarray([*shared, 1003, 7], dtype=np.int32)
    cache.insert(CacheKey(branch), np.arange(1, 67))
    assert set(matcher.dirty) == {id(reqs[3])}
    assert matcher.refresh() == [reqs[3]]
    assert matcher.memo[id(reqs[3])].n == 66


keys = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=0, max_size=30)


@native
@settings(max_examples=300, deadline=None)
@given(
    initial=keys,
    rounds=st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3))),
            keys,
            st.lists(st.integers(0, 60), max_size=3),
            st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3)), max_size=4),
        ),
        max_size=6,
    ),
)
def test_stable_order_equals_a_full_stable_sort(
    initial: list[tuple[int, int]], rounds: list[Any]
) -> None:
    """Re-keying members and appending arrivals gives exactly the stable sort of the list as
    the last round left it (minus leavers, plus arrivals at the back). A request put back at a
    place of its own between rounds (``place``: a requeue into a list in arrival order), then
    re-keyed, lands where the stable sort of the list with it at that place puts it."""
    reqs = [_req(i, [1]) for i in range(len(initial))]
    key_of = {id(r): k for r, k in zip(reqs, initial, strict=True)}
    order = stable_order()
    order.reset(reqs, [key_of[id(r)] for r in reqs])
    listed = sorted(reqs, key=lambda r: key_of[id(r)])
    nxt = len(reqs)
    for changes, arrivals, leavers, placed in rounds:
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
        for pos, k in placed:
            if not listed:
                break  # an empty order takes nothing by place (the queue appends instead)
            r = _req(nxt, [1])
            nxt += 1
            j = pos % (len(listed) + 1)
            assert order.place(r, j)
            listed.insert(j, r)
            key_of[id(r)] = (k, 2 * k)
            changed[id(r)] = r
        assert [r.rid for r in order.reqs] == [r.rid for r in listed]
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


dedup_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"), st.lists(st.integers(0, 2), min_size=1, max_size=8), st.just(0)
        ),
        st.tuples(st.just("cache"), st.integers(0, 40), st.integers(0, 8)),  # a fill's head
        st.tuples(st.just("evict"), st.integers(1, 12), st.just(0)),
        st.tuples(st.just("leave"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("requeue"), st.integers(0, 40), st.integers(0, 2)),  # new output
        st.tuples(st.just("round"), st.booleans(), st.just(0)),  # afresh?
    ),
    max_size=40,
)


def _dedup_round(
    matcher: NativeMatcher, live: list[Req], cfg: SchedulerConfig, afresh: bool, was: frozenset[str]
) -> frozenset[str]:
    """One round of the native dedup, checked against the reference queue's dedup of ``live``
    (on the same matches) and against the statuses of the last round ``was``."""
    matcher.refresh()
    device = [matcher.memo[id(r)].n for r in live]
    for r, n in zip(live, device, strict=True):  # as the queue sets them from the memos
        r.num_matched_prefix_tokens = min(n, r.fill_len - 1)
    got, flipped = matcher.dedup_round(afresh)
    ref = WaitingQueue(cfg, RadixCache(None))
    ref.reqs = list(live)
    assert got == ref.dedup(device, Round(cfg))
    width = max(cfg.in_batch_prefix_deprioritize_threshold, 0)
    check = cfg.in_batch_prefix_check_threshold
    grouped = {
        r.rid for r, n in zip(live, device, strict=True) if n <= check and r.fill_len >= width
    }
    before = frozenset() if afresh else was
    assert {r.rid for r in flipped} == {k for k in grouped if (k in got) != (k in before)}
    return got


@native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=dedup_ops,
    check=st.integers(0, 5),
    width=st.integers(-1, 4),
    times=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=6),
    ns=st.lists(st.sampled_from([None, "x", "y"]), min_size=1, max_size=4),
)
def test_native_dedup_equals_the_reference_dedup(
    ops: list[Any], check: int, width: int, times: list[Any], ns: list[Any]
) -> None:
    """Arrivals, cache growth and eviction (re-matches), departures and requeues with new
    output, in any order; at each round the deferred rids are the reference dedup's, and the
    flipped requests are the grouped ones whose status changed."""
    cfg = SchedulerConfig(
        schedule_policy="lpm",
        in_batch_prefix_check_threshold=check,
        in_batch_prefix_deprioritize_threshold=width,
    )
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(check, max(width, 0))
    live: list[Req] = []
    was: frozenset[str] = frozenset()
    for n, (op, a, b) in enumerate([*ops, ("round", False, 0)]):
        r = live[a % len(live)] if live and op in ("cache", "leave", "requeue") else None
        if op == "arrive":
            r = _req(n, a, ns[n % len(ns)])
            r.queue_entry_time, r.arrival_time = map(float, times[n % len(times)])
            matcher.track(r)
            live.append(r)
        elif op == "cache" and r is not None:
            head = r.fill_ids()[:b]
            cache.insert(CacheKey(head, r.namespace), np.arange(1, len(head) + 1))
        elif op == "evict":
            cache.evict(a)
        elif op == "leave" and r is not None:
            matcher.untrack(r)
            live.remove(r)
        elif op == "requeue" and r is not None:
            matcher.untrack(r)
            r.output_ids.extend([b] * (1 + b))
            matcher.track(r)
        elif op == "round":
            was = _dedup_round(matcher, live, cfg, bool(a), was)


@native
def test_native_dedup_keeps_a_requeued_members_status() -> None:
    """A request untracked and tracked again with new output (a requeue) before the round is the
    same member: deferred in both rounds, its status did not flip (Hypothesis' minimal case);
    the one whose requeue makes it the duplicate does flip, with the new representative."""
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(0, 0)  # every request is a member of one group
    r0, r1 = _req(0, [0]), _req(1, [0])
    for r in (r0, r1):
        matcher.track(r)
    matcher.refresh()
    assert matcher.dedup_round(False) == (frozenset({"r1"}), [r1])
    matcher.untrack(r1)
    r1.output_ids.append(0)
    matcher.track(r1)
    matcher.refresh()
    assert matcher.dedup_round(False) == (frozenset({"r1"}), [])
    matcher.untrack(r0)
    r0.output_ids.extend([0, 0])  # more uncached work than r1: r0 is deferred now
    matcher.track(r0)
    matcher.refresh()
    got, flipped = matcher.dedup_round(False)
    assert (got, {r.rid for r in flipped}) == (frozenset({"r0"}), {"r0", "r1"})


@native
def test_native_dedup_tells_apart_a_leaver_and_an_arrival_under_its_key() -> None:
    """The matcher's keys are ``id(req)``, which CPython gives again once a request is gone:
    a request that leaves and another tracked under the same key before the round are two
    members, so the round's verdict names the arrival, not the leaver."""
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(0, 2)
    tree, fill = matcher._tree, np.array([5, 6, 7], dtype=np.int32)
    tree.track(1, fill, 0, 0.0, 0.0, "a")
    tree.track(2, fill, 0, 0.0, 0.0, "b")
    assert tree.dedup_round(False) == ([], ["b"], [2])  # "a" represents the group
    tree.untrack(2)
    tree.track(2, fill, 0, 0.0, 0.0, "c")  # key 2 again, another request
    assert tree.dedup_round(False) == (["b"], ["c"], [2])  # "c" is deferred now: a flip
    tree.untrack(1)
    assert tree.dedup_round(False) == (["c"], [], [2])  # "c" alone: kept


def _tracked(matcher: NativeMatcher, reqs: list[Req]) -> list[Req]:
    for r in reqs:
        matcher.track(r)
    return reqs


@native
def test_native_dedup_picks_the_least_work_then_oldest_then_rid() -> None:
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(0, 2)
    a, b, c, d = (_req(i, [1, 2, 3]) for i in range(4))
    short = _req(9, [1, 2])  # least uncached work
    a.rid, b.rid, c.rid, d.rid = "z", "\u00e9", "\ud800", "\ue000"  # code point order
    for r in (a, b, c, d):
        r.queue_entry_time = r.arrival_time = 1.0
    c.arrival_time = 0.5  # the oldest of equal entry times
    _tracked(matcher, [a, b, c, d])
    got, flipped = matcher.dedup_round(False)
    assert got == {"z", "\u00e9", "\ue000"} and {r.rid for r in flipped} == set(got)
    matcher.untrack(c)  # the representative leaves: the least rid by code point takes over
    got, flipped = matcher.dedup_round(False)
    assert got == {"\u00e9", "\ue000"} and flipped == [a]
    matcher.track(short)
    got, flipped = matcher.dedup_round(False)
    assert got == {"z", "\u00e9", "\ue000"} and flipped == [a]
    assert matcher.dedup_round(False) == (got, [])  # nothing changed: the same answer


@native
def test_native_dedup_groups_by_namespace_and_width() -> None:
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(1, 0)  # width 0: one group per namespace
    reqs = _tracked(matcher, [_req(0, [1]), _req(1, [2, 2]), _req(2, [3], "x"), _req(3, [4], "x")])
    got, _ = matcher.dedup_round(False)
    assert got == {"r1", "r3"}
    cache.insert(CacheKey(np.asarray([2, 2], dtype=np.int32)), np.arange(1, 3))
    assert matcher.refresh() == [reqs[1]]
    got, flipped = matcher.dedup_round(False)  # r1 now matches 2 > check tokens: out
    assert (got, flipped) == (frozenset({"r3"}), [])
    matcher.untrack(reqs[2])
    got, flipped = matcher.dedup_round(True)  # afresh: every deferred one counts as flipped
    assert (got, flipped) == (frozenset(), [])
    wide = NativeMatcher(NativeRadixCache(None, page_size=1))
    wide.dedup_on(0, 3)  # requests shorter than the width share nothing
    _tracked(wide, [_req(0, [1, 1]), _req(1, [1, 1]), _req(2, [1, 1, 1]), _req(3, [1, 1, 1, 5])])
    assert wide.dedup_round(False)[0] == {"r3"}


@native
def test_native_dedup_follows_a_requeue_with_new_output() -> None:
    cache = NativeRadixCache(None, page_size=1)
    matcher = NativeMatcher(cache)
    matcher.dedup_on(0, 1)
    a, _ = _tracked(matcher, [_req(0, [1, 2]), _req(1, [1, 2])])
    assert matcher.dedup_round(False)[0] == {"r1"}
    matcher.untrack(a)  # taken for a prefill, retracted with one more token: more work
    a.output_ids.append(3)
    matcher.track(a)
    got, flipped = matcher.dedup_round(False)
    assert got == {"r0"} and {r.rid for r in flipped} == {"r0", "r1"}


@native
def test_native_dedup_is_off_when_the_check_is_negative() -> None:
    cfg = SchedulerConfig(schedule_policy="lpm", in_batch_prefix_check_threshold=-1)
    q = NativeWaitingQueue(cfg, NativeRadixCache(None, page_size=1))
    assert q.matcher is not None and not q.native_dedup
    for i in range(3):
        q.add(_req(i, [1, 2, 3]))
    q.begin_round([], 0, 0.0)
    assert q.deferred == frozenset()
    with pytest.raises(RuntimeError):
        q.matcher.dedup_round(False)
    with pytest.raises(RuntimeError):
        q.matcher.dedup_on(0, 1)  # only before any tracking


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


@native
@pytest.mark.parametrize("page", [1, 2])
def test_matcher_follows_a_split_at_the_match_end_without_a_walk(page: int) -> None:
    """A request whose match ends inside a node is re-pointed when that node splits there, so
    the branch that then grows at the split point reaches it."""
    cache = NativeRadixCache(None, page_size=page)
    seq = [1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(CacheKey(np.asarray(seq, dtype=np.int32)), np.arange(1, 9))
    matcher = NativeMatcher(cache)
    r = _req(0, [1, 2, 3, 4, 9, 9, 9, 9])
    matcher.track(r)
    assert matcher.memo[id(r)].n == 4 and not matcher.memo[id(r)].full
    cache.insert(CacheKey(np.asarray([1, 2, 3, 4, 7, 7], dtype=np.int32)), np.arange(10, 16))
    assert not matcher.dirty  # the new branch is 7, not r's next page: no re-match
    m = matcher.memo[id(r)]
    assert m.full and m.n == 4 and m.node.id == cache.match_end(CacheKey(r.prompt_ids)).node.id
    cache.insert(CacheKey(np.asarray([1, 2, 3, 4, 9, 9], dtype=np.int32)), np.arange(20, 26))
    assert matcher.refresh() == [r]
    assert matcher.memo[id(r)].n == 6


@native
@pytest.mark.parametrize("page", [1, 16])
def test_matcher_finds_a_mismatch_deep_inside_a_long_node(page: int) -> None:
    """A match ending past the first blocks of a 160-token node (compared a block at a time,
    then token by token): the length the tree's own match gives, from a track (one walk) and
    from a refresh (several walks together)."""
    alloc = TokenAllocator(4096, page)
    cache = NativeRadixCache(alloc, page_size=page)
    node = np.arange(1000, 1160, dtype=np.int32)

    def insert() -> None:
        slots = alloc.alloc(160)
        assert slots is not None
        alloc.free(slots[: cache.insert(CacheKey(node), slots).prefix_len])

    insert()
    matcher = NativeMatcher(cache)
    cuts = [0, 1, 31, 32, 33, 64, 70, 127, 159]
    reqs = [_req(i, [*node[:c].tolist(), 7, *node[c + 1 :].tolist()]) for i, c in enumerate(cuts)]
    want = [c // page * page for c in cuts]
    for r in reqs:
        matcher.track(r)
    assert [matcher.memo[id(r)].n for r in reqs] == want
    cache.evict(10_000)
    matcher.refresh()
    assert [matcher.memo[id(r)].n for r in reqs] == [0] * len(cuts)
    insert()  # a new root child where every request continues: all re-walked together
    assert len(matcher.refresh()) == len([c for c in want if c > 0])
    for r in reqs:
        assert matcher.memo[id(r)].n == cache.match_end(CacheKey(r.fill_ids())).length
    assert [matcher.memo[id(r)].n for r in reqs] == want


@native
def test_matcher_walks_forget_the_last_rounds_children() -> None:
    """The child lookups one refresh cached are not read by the next: a node the tree let go
    (still alive, held by the matcher's hints) is not found in place of the node now there."""
    alloc = TokenAllocator(256)
    cache = NativeRadixCache(alloc)
    first = list(range(1, 41))
    matcher = NativeMatcher(cache)
    reqs = [_req(i, [*first, 100 + i]) for i in range(3)]
    for r in reqs:
        matcher.track(r)
    for i in range(3):  # a child past each request's end: all three dirty, walked together
        slots = alloc.alloc(42)
        assert slots is not None
        res = cache.insert(CacheKey(np.asarray([*first, 100 + i, 5], dtype=np.int32)), slots)
        alloc.free(slots[: res.prefix_len])
    matcher.refresh()
    assert [matcher.memo[id(r)].n for r in reqs] == [41, 41, 41]
    gone = cache.match_end(CacheKey(np.asarray(first, dtype=np.int32))).node  # kept alive
    cache.evict(10_000)  # everything: each request dirty, hinted at the root
    slots = alloc.alloc(12)
    assert slots is not None
    cache.insert(CacheKey(np.asarray([*first[:10], 77, 78], dtype=np.int32)), slots)
    matcher.refresh()
    for r in reqs:
        want = cache.match_end(CacheKey(r.fill_ids(), r.namespace))
        assert (matcher.memo[id(r)].n, matcher.memo[id(r)].node.id) == (want.length, want.node.id)
    assert [matcher.memo[id(r)].n for r in reqs] == [10, 10, 10]
    assert gone.parent is None  # (the node the last round's walks found, now out of the tree)


@native
def test_matcher_rematches_what_an_eviction_cuts() -> None:
    alloc = TokenAllocator(64)
    cache = NativeRadixCache(alloc)
    slots = alloc.alloc(8)
    assert slots is not None
    cache.insert(CacheKey(np.arange(1, 9, dtype=np.int32)), slots)
    matcher = NativeMatcher(cache)
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


def _first(order: Any) -> int:
    pos = order.position(0)
    assert pos is not None
    return int(pos)


def _tree(cache: Any) -> list[tuple[int, int, int]]:
    return [(n.id, n.last_access_time, len(n.key)) for n in cache._iter_nodes()]


@pytest.mark.parametrize("policy", policy_names())
def test_fast_queue_refresh_touches_what_the_reference_touches(policy: str) -> None:
    """The waiting-prefix refresh (spec 1.10, every 32nd round over the order's head) leaves
    the same clock, access times and splits whether it walks each key (the reference) or
    touches each request where its memo says its match ends (a policy that reads matches).
    Between rounds the caches grow and evict, requests arrive and the head is admitted."""
    rng = np.random.default_rng(11)
    caches, ref, fast = _twins(policy)
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
                q.take([_first(o)])


@pytest.mark.parametrize(
    "policy", ["lpm", "lof", "shortest-prefill-first", "fcfs", "hrrn", "dfs-weight", "fair"]
)
def test_fast_queue_order_equals_the_reference_with_requeues_into_an_arrival_ordered_list(
    policy: str,
) -> None:
    """Retracted requests go back to their places in arrival order while the list is in it
    (most prompts share nothing, so the keys tie and the sorted list stays in arrival order);
    the kept order takes them at those places. Every round's whole order must be the
    reference's."""
    rng = np.random.default_rng(5)
    caches, ref, fast = _twins(policy)
    out: list[tuple[Req, Req]] = []  # admitted, in the reference and the fast queue
    seq = 0
    for rnd in range(120):
        for _ in range(int(rng.integers(0, 3))):
            shared = rng.random() < 0.2  # sometimes a prompt the cache holds a prefix of
            n = int(rng.integers(2, 30))
            t = rng.integers(0, VOCAB if shared else 1000, n).astype(np.int32)
            t += 0 if shared else VOCAB
            if shared:
                for c in caches:
                    c.insert(CacheKey(t[: len(t) // 2]), np.arange(len(t) // 2))
            pair = tuple(
                Req(
                    f"w{seq}",
                    t.copy(),
                    SamplingParams(max_new_tokens=int(seq % 7) + 1),
                    arrival_time=float(seq // 6),  # ties: only the list orders them
                )
                for _ in range(2)
            )
            for q, r in zip((ref, fast), pair, strict=True):
                q.add(r)
            seq += 1
        if out and rng.random() < 0.4:  # retraction: some admitted requests come back
            k = int(rng.integers(1, min(len(out), 3) + 1))
            back = [out.pop(int(rng.integers(0, len(out)))) for _ in range(k)]
            back.sort(key=lambda p: p[0].arrival_time)
            kept = fast.synced and fast.engine is not None and fast.engine.placeable
            for i, q in enumerate((ref, fast)):
                q.requeue([p[i] for p in back], float(rnd), 10 * rnd)
            if kept:  # placed in the kept order, which still describes the list
                assert fast.engine is not None and fast.synced, rnd
                assert fast._in_sync(fast.engine), rnd
                assert [r.rid for r in fast.reqs] == [r.rid for r in ref.reqs], rnd
        orders = [q.begin_round([], 10 * rnd, float(rnd)) for q in (ref, fast)]
        heads = [[r.rid for r in o.head(len(ref) + 1)] for o in orders]
        assert heads[0] == heads[1], rnd
        if len(ref) > 3 and rng.random() < 0.6:  # the head is admitted
            taken = [q.take([_first(o)])[0] for q, o in zip((ref, fast), orders, strict=True)]
            out.append((taken[0], taken[1]))


def _twins(policy: str, page: int = 1) -> tuple[list[Any], WaitingQueue, NativeWaitingQueue]:
    """The reference queue over the Python tree, the fast one over the native tree."""
    if core() is None:
        pytest.skip("the accelerated queue runs over the native core, which is not built or off")
    caches = [RadixCache(None, page_size=page), NativeRadixCache(None, page_size=page)]
    cfg = SchedulerConfig(schedule_policy=policy, page_size=page)
    return caches, WaitingQueue(cfg, caches[0]), NativeWaitingQueue(cfg, caches[1])


def _both(make: Any) -> tuple[Req, Req]:
    return make(), make()


def _order(q: WaitingQueue, rnd: int) -> list[str]:
    o = q.begin_round([], rnd, float(rnd))
    return [r.rid for r in o.head(len(q) + 1)]


def test_a_failed_admissions_matched_length_is_the_rounds_again_next_round() -> None:
    """An admission attempt rewrites the request's matched length with the admission's match
    (whole pages of ``fill_len - 1``: 48 for a 64-token prompt on 16-token pages, where the
    round's is 63); the next round reads the round's value again, so lpm puts it ahead of a
    request matching 48."""
    caches, ref, fast = _twins("lpm", page=16)
    cached = np.arange(64, dtype=np.int32)
    for c in caches:
        c.insert(CacheKey(cached), np.arange(64))
    early = np.concatenate([cached[:48], np.arange(1000, 1052, dtype=np.int32)])
    pairs = [
        _both(lambda: Req("s", early.copy(), arrival_time=0.0)),
        _both(lambda: Req("r", cached.copy(), arrival_time=1.0)),
    ]
    for ref_copy, fast_copy in pairs:
        ref.add(ref_copy)
        fast.add(fast_copy)
    assert _order(ref, 1) == _order(fast, 1) == ["r", "s"]
    for q in (ref, fast):
        q.reqs[[x.rid for x in q.reqs].index("r")].num_matched_prefix_tokens = 48
    fast.note_tried(next(x for x in fast.reqs if x.rid == "r"))
    assert _order(ref, 2) == _order(fast, 2) == ["r", "s"]
    assert [x.num_matched_prefix_tokens for x in ref.reqs] == [
        x.num_matched_prefix_tokens for x in fast.reqs
    ]


def test_fcfs_sorts_again_after_a_requeue_appended_out_of_entry_order() -> None:
    """Requests that joined out of arrival order leave the list out of arrival-number order
    once fcfs sorts it, so a requeue appends; an appended request that arrived earlier than
    the tail breaks the entry order, and the next round sorts again."""
    _, ref, fast = _twins("fcfs")
    for q in (ref, fast):
        for rid, t in (("a", 5.0), ("b", 1.0), ("c", 3.0)):
            q.add(Req(rid, np.arange(4, dtype=np.int32) + 10 * ord(rid), arrival_time=t))
    assert _order(ref, 1) == _order(fast, 1) == ["b", "c", "a"]
    taken = [q.take([0])[0] for q in (ref, fast)]
    for q, r in zip((ref, fast), taken, strict=True):
        q.requeue([r], 2.0, 0)
    assert [r.rid for r in ref.reqs] == [r.rid for r in fast.reqs] == ["c", "a", "b"]
    assert _order(ref, 2) == _order(fast, 2) == ["b", "c", "a"]


def test_a_second_requeue_appends_when_the_first_left_the_list_out_of_arrival_order() -> None:
    """lpm leaves the list in match order, not arrival order; a requeue then appends, and a
    second requeue before the next round must append too (the list is still out of arrival
    order), not place by arrival."""
    caches, ref, fast = _twins("lpm")
    hot = np.arange(40, dtype=np.int32)
    for c in caches:
        c.insert(CacheKey(hot), np.arange(40))
    prompts = {
        "a": np.arange(500, 520, dtype=np.int32),
        "b": np.concatenate([hot[:10], np.arange(600, 610, dtype=np.int32)]),
        "c": np.arange(700, 720, dtype=np.int32),
        "d": np.concatenate([hot[:20], np.arange(800, 810, dtype=np.int32)]),
        "e": np.concatenate([hot[:30], np.arange(900, 910, dtype=np.int32)]),
    }
    for q in (ref, fast):
        for i, (rid, p) in enumerate(prompts.items()):
            q.add(Req(rid, p.copy(), arrival_time=float(i)))
    assert _order(ref, 1) == _order(fast, 1) == ["e", "d", "b", "a", "c"]
    taken = [q.take([0, 1]) for q in (ref, fast)]  # e and d are admitted
    for k in (0, 1):  # e comes back, then d (which arrived before e: placing it would differ)
        for q, t in zip((ref, fast), taken, strict=True):
            q.requeue([t[k]], 2.0, 0)
        assert [r.rid for r in ref.reqs] == [r.rid for r in fast.reqs]
    assert [r.rid for r in ref.reqs] == ["b", "a", "c", "e", "d"]
    assert _order(ref, 2) == _order(fast, 2)


@pytest.mark.parametrize("policy", ["lpm", "hrrn", "shortest-prefill-first", "dfs-weight"])
def test_a_request_no_longer_deferred_moves_up_when_its_groups_representative_leaves(
    policy: str,
) -> None:
    """In-batch dedup defers all but one of the waiting requests sharing a prefix the cache
    lacks: the deferred one goes last. When the representative leaves the queue (aborted),
    the next one is no longer deferred: its key changes without its match changing, and the
    kept order moves it."""
    _, ref, fast = _twins(policy)
    common = np.arange(2000, 2064, dtype=np.int32)
    prompts = {
        "x": np.concatenate([common, [1, 2]]).astype(np.int32),
        "y": np.concatenate([common, [3, 4]]).astype(np.int32),
        "z": np.arange(5000, 5066, dtype=np.int32),
    }
    for q in (ref, fast):
        for i, (rid, p) in enumerate(prompts.items()):
            q.add(Req(rid, p.copy(), arrival_time=float(i)))
    first = _order(ref, 1)
    assert first == _order(fast, 1) and first[-1] == "y"
    for q in (ref, fast):
        q.remove(next(r for r in q.reqs if r.rid == "x"))
    assert _order(ref, 2) == _order(fast, 2)


def _kv_twins(page: int, size: int) -> list[KVManager]:
    """The reference KV manager (Python tree and allocator) and the fast one (native tree and
    pool)."""
    if core() is None:
        pytest.skip("the fast KV manager runs over the native core, which is not built or off")
    ref_alloc, pool = TokenAllocator(size, page), make_pool(size, page)
    return [
        KVManager(RadixCache(ref_alloc, page_size=page), ref_alloc),
        NativeKVManager(NativeRadixCache(pool, page_size=page), pool),
    ]


@pytest.mark.parametrize("page", [1, 4])
def test_fast_grow_past_a_rows_planned_capacity_keeps_its_slots(page: int) -> None:
    """A row grown past its buffer moves to a bigger one: the slots it had come along, then
    the new ones, the same as the reference's grow (and the same free list)."""
    rows, alive = [], []  # both requests stay alive: no buffer is reused between the two
    for kv in _kv_twins(page, 256):
        r = Req("g", np.arange(40, dtype=np.int32))
        r.kv_buf = np.empty(8, dtype=np.int64)
        r.kv_buf[:8] = kv.alloc(8)
        r.kv_row = r.kv_buf[:8]
        kv.grow([r], [30])
        rows.append((r.kv_row.tolist(), kv.allocator.available_size()))
        alive.append(r)
    assert rows[0] == rows[1]
    assert len(rows[1][0]) == -(-30 // page) * page


kv_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"), st.lists(st.integers(0, 2), min_size=2, max_size=40), st.none()
        ),
        st.tuples(st.just("grow"), st.integers(0, 9), st.integers(1, 24)),
        st.tuples(st.just("checkpoint"), st.integers(0, 9), st.integers(0, 24)),
        st.tuples(st.just("release"), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("evict"), st.integers(1, 40), st.booleans()),
    ),
    max_size=40,
)


def _admit(kv: KVManager, r: Req) -> bool:
    """What the scheduler's admission does to a request's KV (match, lock, prefix, its rows)."""
    kv.match_for_admission(r)
    r.lock_node = r.last_node
    kv.cache.inc_lock_ref(r.lock_node)
    kv.take_prefix(r)
    need = -(-r.fill_len // kv.page) * kv.page - len(r.kv_row)
    room = kv.allocator.available_size() + kv.cache.evictable_size()
    if need > room:
        kv.release(r, cache_kv=False)
        return False
    kv.grow([r], [r.fill_len])
    r.kv_len = r.fill_len
    return True


@native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=kv_ops, page=st.sampled_from([1, 2, 4]))
def test_fast_kv_equals_the_reference_kv(ops: list[Any], page: int) -> None:
    """Admissions (match, lock, prefix), grows past the buffer, checkpoints (duplicates of
    what another request cached included), releases and evictions: the fast KV manager over
    the native tree and pool leaves every row, lock, free list and tree as the reference's."""
    sides = _kv_twins(page, 160)
    live: list[list[Req]] = [[], []]
    n = 0
    for op, a, b in ops:
        for kv, reqs in zip(sides, live, strict=True):
            if op == "admit":
                r = Req(f"k{n}", np.asarray(a, dtype=np.int32), SamplingParams(max_new_tokens=8))
                if _admit(kv, r):
                    reqs.append(r)
            elif op == "grow" and reqs:
                r = reqs[a % len(reqs)]
                end = len(r.kv_row) + b
                if end - len(r.kv_row) <= kv.allocator.available_size() + kv.cache.evictable_size():
                    r.output_ids.extend([b % 3] * (end - r.fill_len))
                    kv.grow([r], [end])
                    r.kv_len = end
            elif op == "checkpoint" and reqs:
                r = reqs[a % len(reqs)]
                kv.checkpoint(r, min(r.cache_protected_len + b, r.kv_len))
            elif op == "release" and reqs:
                kv.release(reqs.pop(a % len(reqs)), cache_kv=bool(b))
            elif op == "evict":
                kv.cache.evict(a)
        n += op == "admit"
        got = [
            (
                [(r.rid, r.kv_row.tolist(), r.cache_protected_len, r.prefix_len) for r in reqs],
                [None if r.lock_node is None else r.lock_node.id for r in reqs],
                kv.allocator.free_slots().tolist(),
                sorted((nd.id, nd.lock_ref, len(nd)) for nd in kv.cache._iter_nodes()),
            )
            for kv, reqs in zip(sides, live, strict=True)
        ]
        assert got[0] == got[1], op
        for kv, reqs in zip(sides, live, strict=True):
            kv.allocator.check_integrity(
                cache_slots=kv.cache.all_values(), request_slots=KVManager.owned_slots(reqs)
            )


@pytest.mark.parametrize("page", [1, 4])
def test_fast_checkpoint_of_what_another_request_cached_frees_the_copies(page: int) -> None:
    """Two requests compute the same prompt side by side; the second's checkpoint finds part
    of it cached by the first: its own copies go back to the pool and its row points at the
    cache's, the same in both cores (and a release caches the rest)."""
    out = []
    for kv in _kv_twins(page, 256):
        shared = np.arange(1, 33, dtype=np.int32)
        a = Req("a", shared.copy(), SamplingParams(max_new_tokens=4))
        b = Req("b", np.concatenate([shared, [7, 7, 7, 7]]).astype(np.int32))
        assert _admit(kv, a) and _admit(kv, b)
        kv.checkpoint(a, 16)
        kv.checkpoint(b, 24)  # [0, 16) cached by a: b's copies freed
        kv.checkpoint(a, 32)
        kv.release(b, cache_kv=True)  # [16, 32) cached by a meanwhile
        out.append(
            (
                a.kv_row.tolist(),
                kv.allocator.free_slots().tolist(),
                sorted((nd.id, nd.lock_ref, len(nd)) for nd in kv.cache._iter_nodes()),
            )
        )
        kv.allocator.check_integrity(
            cache_slots=kv.cache.all_values(), request_slots=KVManager.owned_slots([a])
        )
    assert out[0] == out[1]
    assert len(out[0][1]) > 256 - 2 * 36  # b's duplicate slots came back


def _entry_fields(e: Any) -> tuple[Any, ...]:
    return (
        e.req.rid,
        e.prefix_len,
        e.new_token_ids.tolist(),
        e.prefix_slots.tolist(),
        e.new_slots.tolist(),
        e.produces_token,
        e.host_load_len,
    )


@pytest.mark.parametrize("page", [1, 4])
def test_fast_extend_entries_equal_the_reference(page: int) -> None:
    """A prefill in chunks (checkpointed between them), a second request sharing its head, and
    a retracted request prefilled again over its output: the native extend entries, rows,
    stats sums and free lists are the reference's, and so is what a release leaves."""
    out = []
    for kv in _kv_twins(page, 256):
        shared = np.arange(1, 41, dtype=np.int32)
        a = Req("a", shared.copy(), SamplingParams(max_new_tokens=4))
        b = Req("b", np.concatenate([shared[:24], [9] * 9]).astype(np.int32))
        got = []
        for r in (a, b):
            assert _admit_prefix(kv, r)
        got.append(_entry_fields(kv.extend_entry(a, a.prefix_len, 16)))
        kv.checkpoint(a, 16)
        got.append(_entry_fields(kv.extend_entry(a, a.prefix_len, a.fill_len)))
        kv.checkpoint(a, a.fill_len)
        got.append(_entry_fields(kv.extend_entry(b, b.prefix_len, b.fill_len)))
        b.output_ids.extend([5, 6, 7])  # retracted after three tokens: prefilled again
        kv.release(b, cache_kv=True)
        assert _admit_prefix(kv, b)
        got.append(_entry_fields(kv.extend_entry(b, b.prefix_len, b.fill_len)))
        kv.release(a, cache_kv=True)
        got.append((b.kv_row.tolist(), b.kv_len, a.kv_row.tolist(), a.lock_node, a.prefix_len))
        got.append(kv.allocator.free_slots().tolist())
        kv.allocator.check_integrity(
            cache_slots=kv.cache.all_values(), request_slots=KVManager.owned_slots([b])
        )
        out.append(got)
    assert out[0] == out[1]


def _admit_prefix(kv: KVManager, r: Req) -> bool:
    """Admission's match, lock and prefix (no allocation: the extend entries allocate)."""
    kv.match_for_admission(r)
    r.lock_node = r.last_node
    kv.cache.inc_lock_ref(r.lock_node)
    kv.take_prefix(r)
    return True


@pytest.mark.parametrize("page", [1, 4])
def test_fast_extend_batch_equals_the_reference_extends(page: int) -> None:
    """``KV.extend_batch`` over admissions (one with nothing to extend, one scheduled before)
    gives the reference ``_extend``'s entries, first-schedule stamps and stats sums."""
    from radixsched.adder import Admission

    results = []
    for kv in _kv_twins(page, 256):
        reqs = [Req(f"e{i}", np.arange(i, i + 20, dtype=np.int32)) for i in range(3)]
        for r in reqs:
            _admit_prefix(kv, r)
            r.extend_end = r.fill_len
        reqs[1].times.first_scheduled = 0.5
        adm = [Admission(r, r.prefix_len, r.extend_end - r.prefix_len, False) for r in reqs]
        adm.insert(1, Admission(reqs[0], 0, 0, False))
        clock = iter([1.0, 2.0, 3.0])
        if isinstance(kv, NativeKVManager):
            entries, *sums = kv.native.extend_batch(adm, clock.__next__)
        else:
            sums, entries = [0, 0, 0], []
            for a in adm:
                if not a.extend_len:
                    continue
                r = a.req
                if r.times.first_scheduled is None:
                    r.times.first_scheduled = next(clock)
                    r.cached_tokens = r.prefix_len + r.host_hit_len
                    r.host_cached_tokens = r.host_hit_len
                    sums[0] += min(r.cached_tokens, r.prompt_len)
                    sums[1] += min(r.host_hit_len, r.prompt_len)
                    sums[2] += r.prompt_len
                entries.append(kv.extend_entry(r, a.prefix_len, r.extend_end))
        results.append(
            (
                [_entry_fields(e) for e in entries],
                list(sums),
                [(r.times.first_scheduled, r.cached_tokens, r.kv_len) for r in reqs],
                kv.allocator.free_slots().tolist(),
            )
        )
    assert results[0] == results[1]
