"""The native radix tree against the Python one, side by side: random operation sequences
(inserts from the root and from a locked start, matches, match ends, touches, locks, lock moves,
evictions and reclaims, resets, DFS-weight orders) give the same results, the same node ids,
the same evictions in the same order, the same listener and host-tier events, and the same
tree (every node's key, slots, locks, clock times, hit counts, priorities and places), for
every eviction strategy, both compat modes, pages of 1 and 4, and three namespaces."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.cache.evict import EVICTION_STRATEGIES
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

NAMESPACES = [None, ("a", None), ("", "salt")]


def _nid(node: Any) -> Any:
    return None if node is None else node.id


def _out(value: Any) -> Any:
    """A result in a comparable form: nodes by id, arrays as lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [_out(v) for v in value]
    if hasattr(value, "lock_ref"):
        return ("node", value.id)
    return value


class Log:
    """A listener and a host-tier hook that record what they are told (nodes by id)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_child(self, parent: Any, child_key: Any) -> None:
        self.events.append(("child", parent.id, child_key))

    def on_split(self, upper: Any, lower: Any) -> None:
        self.events.append(("split", upper.id, lower.id, len(upper), len(lower)))

    def on_evict(self, leaf: Any, keep: int) -> None:
        self.events.append(("evict", leaf.id, _nid(leaf.parent), len(leaf), keep))

    def on_reset(self) -> None:
        self.events.append(("reset",))

    def host(self, key: CacheKey, n: int) -> None:
        self.events.append(("host", key.tokens.tolist(), key.namespace, n))


def _snapshot(cache: Any) -> list[Any]:
    return [
        (
            n.id,
            _nid(n.parent),
            n.key.tolist(),
            n.value.tolist(),
            n.lock_ref,
            n.last_access_time,
            n.creation_time,
            n.hit_count,
            n.priority,
            n.slot,
            n.child_key,
            n.subtree_key,
            n.namespace,
        )
        for n in cache._iter_nodes()
    ]


class Pair:
    """The two trees, each with its allocator and its log; every operation runs on both."""

    def __init__(self, page: int, policy: str, compat: bool) -> None:
        from radixsched.native.radix import NativeRadixCache

        self.page = page
        self.sides: list[tuple[Any, TokenAllocator, Log]] = []
        for cls in (RadixCache, NativeRadixCache):
            alloc = TokenAllocator(600, page)
            log = Log()
            cache = cls(alloc, page, policy, compat_sglang=compat, on_evict=log.host)
            cache.listener = log
            self.sides.append((cache, alloc, log))
        self.locks: list[tuple[list[Any], int, list[int], Any]] = []  # nodes, depth, path, ns

    def both(self, fn: Any) -> list[Any]:
        return [fn(cache, alloc) for cache, alloc, _ in self.sides]

    def same(self, fn: Any) -> list[Any]:
        a, b = self.both(fn)
        assert _out(a) == _out(b)
        return [a, b]

    def check(self) -> None:
        (pc, pa, pl), (nc, na, nl) = self.sides
        assert pl.events == nl.events
        assert _snapshot(pc) == _snapshot(nc)
        assert (pc.evictable_size(), pc.protected_size(), pc.num_evictable_leaves()) == (
            nc.evictable_size(),
            nc.protected_size(),
            nc.num_evictable_leaves(),
        )
        assert pc._clock == nc._clock
        assert pa.available_size() == na.available_size()
        nc.check_integrity()


def _insert(cache: Any, alloc: TokenAllocator, key: CacheKey, prio: int, start: Any) -> Any:
    p = cache.page_size
    n = len(key.tokens) - len(key.tokens) % p
    slots = alloc.alloc(n)
    if slots is None:
        return None
    kw: dict[str, Any] = {}
    base = 0
    if start is not None:
        node, depth, from_start = start
        kw = {"start": (node, depth), "from_start": from_start}
        base = depth if from_start else 0
    res = cache.insert(key, slots, prio, **kw)
    alloc.free(slots[: max(res.prefix_len - base, 0)])
    return res


def _step(pair: Pair, data: st.DataObject, heads: list[list[int]]) -> None:
    op = data.draw(
        st.sampled_from(
            [
                "insert",
                "insert",
                "match",
                "end",
                "lock",
                "unlock",
                "move",
                "evict",
                "reclaim",
                "touch",
                "order",
                "reset",
            ]
        )
    )
    ns = data.draw(st.sampled_from(NAMESPACES))
    head = heads[data.draw(st.integers(0, len(heads) - 1))]
    cut = data.draw(st.integers(0, len(head)))
    tail = data.draw(st.lists(st.integers(0, 6), max_size=12))
    toks = np.array(head[:cut] + tail, dtype=np.int32)
    key = CacheKey(toks, ns)
    if op == "insert":
        prio = data.draw(st.integers(-2, 3))
        if pair.locks and data.draw(st.booleans()):
            nodes, depth, path, lns = pair.locks[data.draw(st.integers(0, len(pair.locks) - 1))]
            if depth > 0:
                from_start = data.draw(st.booleans())
                full = np.array(path + tail, dtype=np.int32)
                key = CacheKey(full[depth:] if from_start else full, lns)
                res = [
                    _out(_insert(cache, alloc, key, prio, (nodes[i], depth, from_start)))
                    for i, (cache, alloc, _) in enumerate(pair.sides)
                ]
                assert res[0] == res[1]
                pair.check()
                return
        pair.same(lambda c, al: _insert(c, al, key, prio, None))
    elif op == "match":
        how = data.draw(st.sampled_from(["prefix", "node", "len", "touch"]))
        if how == "prefix":
            pair.same(lambda c, al: c.match_prefix(key)[:3])
        elif how == "node":
            pair.same(lambda c, al: c.match_node(key)[1:3])
        elif how == "len":
            pair.same(lambda c, al: c.match_len(key))
        else:
            pair.same(lambda c, al: c.touch_prefixes([key, key]))
    elif op == "end":
        ends = pair.same(lambda c, al: c.match_end(key))
        if data.draw(st.booleans()):
            pair.same(lambda c, al: c.touch_at(*_end_of(ends, c, pair)))
    elif op == "lock":
        res = pair.same(lambda c, al: c.match_prefix(key))
        nodes = [res[0].last_node, res[1].last_node]
        pair.same(lambda c, al: c.inc_lock_ref(nodes[_side(pair, c)]))
        path = toks[: res[0].device_len].tolist()
        pair.locks.append((nodes, res[0].device_len, path, ns))
        pair.same(lambda c, al: c.prefix_slots(nodes[_side(pair, c)], res[0].device_len))
    elif op == "unlock" and pair.locks:
        nodes = pair.locks.pop(data.draw(st.integers(0, len(pair.locks) - 1)))[0]
        pair.same(lambda c, al: c.dec_lock_ref(nodes[_side(pair, c)]))
    elif op == "move" and pair.locks:
        i = data.draw(st.integers(0, len(pair.locks) - 1))
        old = pair.locks[i][0]
        res = pair.same(lambda c, al: c.match_prefix(key))
        new = [res[0].last_node, res[1].last_node]
        pair.same(lambda c, al: c.move_lock(old[_side(pair, c)], new[_side(pair, c)]))
        pair.locks[i] = (new, res[0].device_len, toks[: res[0].device_len].tolist(), ns)
    elif op == "evict":
        n = data.draw(st.integers(0, 40))
        pair.same(lambda c, al: c.evict(n))
    elif op == "reclaim":
        segs = pair.same(lambda c, al: c.evict_reclaim(len(toks) * 2 + 1))
        for (_, alloc, _), seg in zip(pair.sides, segs, strict=True):
            if seg:
                alloc.free(np.concatenate(seg))
    elif op == "touch":
        pair.same(lambda c, al: c.touch_prefix(key))
    elif op == "order":
        offs = [data.draw(st.integers(0, 5)) for _ in pair.locks]
        pair.same(
            lambda c, al: c.dfs_weight_order_at(
                [(lk[0][_side(pair, c)], o) for lk, o in zip(pair.locks, offs, strict=True)]
            )
        )
    elif op == "reset" and not pair.locks:
        pair.same(lambda c, al: c.reset())
    pair.check()


def _side(pair: Pair, cache: Any) -> int:
    return 0 if cache is pair.sides[0][0] else 1


def _end_of(ends: list[Any], cache: Any, pair: Pair) -> tuple[Any, int]:
    end = ends[_side(pair, cache)]
    return end.node, end.offset


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    page=st.sampled_from([1, 4]),
    policy=st.sampled_from(sorted(EVICTION_STRATEGIES)),
    compat=st.booleans(),
)
def test_native_tree_equals_python_tree(
    data: st.DataObject, page: int, policy: str, compat: bool
) -> None:
    pair = Pair(page, policy, compat)
    rng = np.random.default_rng(data.draw(st.integers(0, 3)))
    heads = [rng.integers(0, 6, 24).tolist() for _ in range(3)]
    for _ in range(data.draw(st.integers(5, 40))):
        _step(pair, data, heads)


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24)
matcher_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs, st.booleans()),
        st.tuples(st.just("evict"), st.integers(1, 30), st.booleans()),
        st.tuples(st.just("match"), seqs, st.booleans()),  # match_prefix: splits, recency
        st.tuples(st.just("track"), seqs, st.booleans()),
        st.tuples(st.just("untrack"), st.integers(0, 50), st.booleans()),
        st.tuples(st.just("reset"), st.integers(0, 1), st.booleans()),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=matcher_ops, page=st.sampled_from([1, 2, 4]), policy=st.sampled_from(["lru", "mru"]))
def test_native_matcher_memos_equal_the_python_trees_fresh_match(
    ops: list[Any], page: int, policy: str
) -> None:
    """After every operation, each tracked request's memo is where a fresh ``match_end`` of its
    fill ends on the Python reference tree fed the same operations (the trees stay the same),
    and the re-matched requests were all dirty."""
    from radixsched.native.matching import NativeMatcher
    from radixsched.native.radix import NativeRadixCache
    from radixsched.request import Req

    sides = []
    for cls in (RadixCache, NativeRadixCache):
        alloc = TokenAllocator(4096, page)
        sides.append((cls(alloc, page_size=page, eviction_policy=policy), alloc))
    (ref, _), (cache, _) = sides
    matcher = NativeMatcher(cache)
    tracked: list[Req] = []
    n = 0
    for op, arg, flag in ops:
        ns = ("x", None) if flag else None
        for c, alloc in sides:
            if op == "insert":
                tokens = np.asarray(arg, dtype=np.int32)[: len(arg) // page * page]
                slots = alloc.alloc(len(tokens))
                if slots is not None:
                    res = c.insert(CacheKey(tokens, ns), slots)
                    alloc.free(slots[: res.prefix_len])
            elif op == "evict":
                c.evict(arg * page)
            elif op == "match":
                c.match_prefix(CacheKey(np.asarray(arg, dtype=np.int32), ns))
            elif op == "reset":
                c.reset()
        if op == "track":
            r = Req(f"r{n}", np.asarray(arg, dtype=np.int32), extra_key="x" if flag else None)
            n += 1
            matcher.track(r)
            tracked.append(r)
        elif op == "untrack" and tracked:
            matcher.untrack(tracked.pop(arg % len(tracked)))
        dirty = set(matcher.dirty)
        moved = matcher.refresh()
        assert {id(r) for r in moved} <= dirty, op
        assert not matcher.dirty, op
        for r in tracked:
            m = matcher.memo[id(r)]
            want = ref.match_end(CacheKey(r.fill_ids(), r.namespace))
            got_offset = len(m.node) if m.full else m.offset
            assert (m.n, m.node.id, got_offset) == (want.length, want.node.id, want.offset), op
        assert _snapshot(ref) == _snapshot(cache), op


@pytest.mark.parametrize("at", [0, 1, 100, 183, 184, 199, None])
def test_a_long_key_is_matched_to_the_first_difference_wherever_it_lies(at: int | None) -> None:
    """A query that parts from a 200-token key in its head, in its last 16 tokens (what a
    tail-first compare reads first), or not at all, matches (match_len, match_end, the
    matcher's walk, match_prefix's split) exactly as far as on the Python tree."""
    from radixsched.native.matching import NativeMatcher
    from radixsched.native.radix import NativeRadixCache
    from radixsched.request import Req

    key = np.arange(200, dtype=np.int32)
    query = np.concatenate([key, [7, 8]]).astype(np.int32)
    if at is not None:
        query[at] = -1
    ref, cache = RadixCache(TokenAllocator(1024, 1)), NativeRadixCache(TokenAllocator(1024, 1))
    for c in (ref, cache):
        c.insert(CacheKey(key), np.arange(200))
    matcher = NativeMatcher(cache)
    r = Req("q", query)
    matcher.track(r)
    want = ref.match_end(CacheKey(query))
    assert (matcher.memo[id(r)].n, cache.match_len(CacheKey(query))) == (want.length,) * 2
    assert cache.match_end(CacheKey(query)).length == want.length
    got = [c.match_prefix(CacheKey(query)) for c in (ref, cache)]
    assert [g.device_len for g in got] == [want.length] * 2
    assert _snapshot(ref) == _snapshot(cache)
