"""Hand-made cases for every branch of the radix cache, the no-reuse baseline and the factory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from radixsched.cache import (
    EVICTION_STRATEGIES,
    BasePrefixCache,
    CacheKey,
    IntegrityError,
    NoReuseCache,
    RadixCache,
    TokenAllocator,
    get_strategy,
    longest_common_prefix,
    make_cache,
)
from radixsched.cache.base import Namespace
from radixsched.config import SchedulerConfig

pytestmark = pytest.mark.usefixtures("radix_impl")


def K(tokens: Sequence[int], ns: Namespace = None) -> CacheKey:
    return CacheKey(np.asarray(tokens, dtype=np.int32), ns)


def make(
    page_size: int = 1, policy: str = "lru", *, compat: bool = False, size: int = 4096
) -> tuple[RadixCache, TokenAllocator]:
    alloc = TokenAllocator(size, page_size)
    return RadixCache(alloc, page_size, policy, compat_sglang=compat), alloc


def put(
    cache: RadixCache,
    alloc: TokenAllocator,
    tokens: Sequence[int],
    ns: Namespace = None,
    priority: int = 0,
) -> int:
    """Insert like the scheduler does: fresh page-padded slots, duplicates and the unaligned
    tail freed afterwards. Returns the already-cached length."""
    p = cache.page_size
    n = len(tokens)
    slots = alloc.alloc(-(-n // p) * p)
    assert slots is not None
    res = cache.insert(K(tokens, ns), slots, priority)
    alloc.free(slots[: res.prefix_len])
    alloc.free(slots[(n // p) * p :])
    return res.prefix_len


def conserved(cache: RadixCache, alloc: TokenAllocator) -> None:
    cache.check_integrity()
    alloc.check_integrity(cache_slots=cache.all_values())
    assert cache.total_size() == cache.all_values().size


# ---- helpers ---------------------------------------------------------------------------------
def test_longest_common_prefix() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert longest_common_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert longest_common_prefix(a, a[:3]) == 3
    assert longest_common_prefix(a, np.array([7], dtype=np.int32)) == 0
    assert longest_common_prefix(a, a[:0]) == 0
    assert longest_common_prefix(a, a.copy()) == 4
    # Long arrays: a difference in the head, right after it, far beyond it, or none.
    rng = np.random.default_rng(0)
    long = rng.integers(0, 5, size=2000).astype(np.int32)
    for at in [0, 1, 255, 256, 257, 1999]:
        other = long.copy()
        other[at] += 1
        assert longest_common_prefix(long, other) == at
        assert longest_common_prefix(other[:at], long) == at
    assert longest_common_prefix(long, long[:1500].copy()) == 1500


# ---- match / insert / split ------------------------------------------------------------------
def test_insert_returns_already_cached_length_and_match_returns_values() -> None:
    cache, alloc = make()
    assert put(cache, alloc, [1, 2, 3, 4]) == 0
    assert put(cache, alloc, [1, 2, 3, 4]) == 4
    assert put(cache, alloc, [1, 2, 5]) == 2
    m = cache.match_prefix(K([1, 2, 3, 4, 9]))
    assert m.device_len == 4 and m.indices.dtype == np.int64 and len(m.indices) == 4
    assert m.host_len == 0
    # The values are exactly the first insert's slots (1..4 from a fresh allocator).
    assert m.indices.tolist() == [1, 2, 3, 4]
    # The second insert's slots (5..8) were freed as duplicates; LIFO reuse hands 5, 6, 7 to
    # the third, whose new leaf takes the slot at its own position 2.
    assert cache.match_prefix(K([1, 2, 5])).indices.tolist() == [1, 2, 7]
    assert cache.match_prefix(K([9])).device_len == 0
    assert cache.match_prefix(K([9])).last_node is cache.root
    assert cache.match_prefix(K([])).device_len == 0
    assert cache.total_size() == 5
    conserved(cache, alloc)


def test_split_on_partial_match_keeps_handles_and_sizes() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3, 4, 5, 6])
    leaf = cache.match_prefix(K([1, 2, 3, 4, 5, 6])).last_node
    assert cache.num_nodes() == 1
    # match_len never splits.
    assert cache.match_len(K([1, 2, 3, 9])) == 3
    assert cache.num_nodes() == 1
    m = cache.match_prefix(K([1, 2, 3, 9]))
    assert m.device_len == 3 and m.indices.tolist() == [1, 2, 3]
    assert cache.num_nodes() == 2
    upper = m.last_node
    assert upper is not leaf and leaf.parent is upper and upper.key.tolist() == [1, 2, 3]
    assert leaf.key.tolist() == [4, 5, 6] and leaf.value.tolist() == [4, 5, 6]
    assert cache.evictable_size() == 6
    conserved(cache, alloc)
    # A key ending inside a node splits too; the upper part is the last node.
    m2 = cache.match_prefix(K([1, 2]))
    assert m2.device_len == 2 and m2.last_node.key.tolist() == [1, 2]
    conserved(cache, alloc)


def test_split_of_locked_node_inherits_lock() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3, 4])
    leaf = cache.match_prefix(K([1, 2, 3, 4])).last_node
    cache.inc_lock_ref(leaf)
    assert cache.protected_size() == 4
    put(cache, alloc, [1, 2, 7])  # splits the locked leaf
    upper = leaf.parent
    assert upper.lock_ref == 1 and upper.key.tolist() == [1, 2]
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    conserved(cache, alloc)
    cache.dec_lock_ref(leaf)
    assert cache.protected_size() == 0 and cache.evictable_size() == 5
    conserved(cache, alloc)


def test_insert_value_handling() -> None:
    cache, alloc = make(page_size=1)
    with pytest.raises(ValueError, match="values"):
        cache.insert(K([1, 2, 3]), np.array([5, 6], dtype=np.int64))
    # Values are copied: mutating the caller's row does not change the tree.
    row = alloc.alloc(3)
    assert row is not None
    cache.insert(K([1, 2, 3]), row)
    saved = row.copy()
    row[:] = 0
    assert cache.match_prefix(K([1, 2, 3])).indices.tolist() == saved.tolist()
    # Longer values than the key: only the key's length is taken.
    row2 = alloc.alloc(5)
    assert row2 is not None
    res = cache.insert(K([7, 8]), row2)
    assert (
        res.prefix_len == 0 and cache.match_prefix(K([7, 8])).indices.tolist() == row2[:2].tolist()
    )
    alloc.free(row2[2:])
    conserved(cache, alloc)
    # int64 tokens are accepted (converted).
    assert cache.match_len(CacheKey(np.array([1, 2, 3], dtype=np.int64))) == 3


def test_match_prefix_updates_recency_but_match_len_does_not() -> None:
    cache, _ = make()
    cache.insert(K([1, 2]), np.array([1, 2], dtype=np.int64))
    node = cache.match_prefix(K([1, 2])).last_node
    t = node.last_access_time
    cache.match_len(K([1, 2]))
    assert node.last_access_time == t
    cache.match_prefix(K([1, 2]))
    assert node.last_access_time > t
    t2 = node.last_access_time
    cache.touch_prefix(K([1, 2, 3]))
    assert node.last_access_time > t2


def test_touch_prefix_splits_like_match() -> None:
    cache, _ = make()
    cache.insert(K([1, 2, 3]), np.array([1, 2, 3], dtype=np.int64))
    cache.touch_prefix(K([1, 9]))
    assert cache.num_nodes() == 2
    cache.touch_prefix(K([]))
    cache.check_integrity()


# ---- namespaces -----------------------------------------------------------------------------
def test_namespace_isolation() -> None:
    cache, alloc = make()
    spaces: list[Namespace] = [None, ("", None), ("lora-a", None), (None, "salt"), ("x", "salt")]
    for ns in spaces:
        assert put(cache, alloc, [1, 2, 3], ns) == 0, ns
    for ns in spaces:
        m = cache.match_prefix(K([1, 2, 3], ns))
        assert m.device_len == 3
        assert m.last_node.namespace == ns
    assert cache.total_size() == 15
    assert cache.match_len(K([1, 2, 3], ("other", None))) == 0
    # (None, None) and an empty salt are the default namespace / no salt.
    assert put(cache, alloc, [1, 2, 3], (None, None)) == 3
    assert put(cache, alloc, [1, 2, 3], ("lora-a", "")) == 3
    assert cache.total_size() == 15
    conserved(cache, alloc)
    # Eviction inside one namespace reports that namespace's path key.
    seen: list[tuple[list[int], Namespace, int]] = []
    cache.on_evict = lambda key, n: seen.append((key.tokens.tolist(), key.namespace, n))
    assert cache.evict(15) == 15
    assert sorted(seen, key=repr) == sorted([([1, 2, 3], ns, 3) for ns in spaces], key=repr)
    conserved(cache, alloc)


# ---- page alignment ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 4, 16])
def test_page_alignment(p: int) -> None:
    cache, alloc = make(page_size=p)
    base = list(range(100, 100 + 5 * p))
    # Shorter than a page: nothing stored, nothing matched.
    if p > 1:
        assert put(cache, alloc, base[: p - 1]) == 0
        assert cache.total_size() == 0
        assert cache.match_prefix(K(base[: p - 1])).device_len == 0
    # 3.5 pages: 3 pages stored.
    seq = base[: 3 * p + p // 2]
    assert put(cache, alloc, seq) == 0
    assert cache.total_size() == 3 * p
    assert cache.match_len(K(base)) == 3 * p
    # A mismatch inside the second page matches one page (rounded down).
    probe = [*base[:p], *base[p : p + p // 2], -1, *base[p + p // 2 + 1 :]]
    assert cache.match_len(K(probe)) == (p if p > 1 else p + p // 2)
    m = cache.match_prefix(K(probe))
    assert m.device_len == cache.match_len(K(probe))
    assert len(m.indices) == m.device_len
    for node in [m.last_node, *m.last_node.children.values()]:
        assert len(node.key) % p == 0
    # Insert diverging inside the third page: p*2 (or the exact point at p == 1) already cached.
    div = [*base[: 2 * p], -5, *base[2 * p + 1 : 4 * p]]
    expect = 2 * p
    assert put(cache, alloc, div) == expect
    assert cache.total_size() == 3 * p + (4 * p - expect)
    conserved(cache, alloc)
    assert cache.evict(1) == p  # partial eviction frees one whole page
    conserved(cache, alloc)


def test_page_children_keyed_by_whole_first_page() -> None:
    cache, alloc = make(page_size=4)
    put(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8])
    # Same first token, different first page: a sibling, not a split.
    assert put(cache, alloc, [1, 2, 3, 9, 5, 6, 7, 8]) == 0
    assert len(cache.root.children) == 2
    conserved(cache, alloc)


# ---- locks ------------------------------------------------------------------------------------
def test_lock_accounting() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3, 4])
    put(cache, alloc, [1, 2, 5, 6, 7])
    a = cache.match_prefix(K([1, 2, 3, 4])).last_node
    b = cache.match_prefix(K([1, 2, 5, 6, 7])).last_node
    mid = a.parent
    assert cache.evictable_size() == 7 and cache.protected_size() == 0
    assert cache.num_evictable_leaves() == 2
    assert cache.inc_lock_ref(a) == -4  # [3,4] and [1,2]
    assert cache.evictable_size() == 3 and cache.protected_size() == 4
    assert cache.inc_lock_ref(b) == -3  # [1,2] already locked
    assert mid.lock_ref == 2 and cache.num_evictable_leaves() == 0
    assert cache.inc_lock_ref(a) == 0
    assert cache.evict(100) == 0
    conserved(cache, alloc)
    assert cache.dec_lock_ref(a) == 0
    assert cache.dec_lock_ref(a) == 2
    assert cache.num_evictable_leaves() == 1
    assert cache.dec_lock_ref(b) == 5
    assert cache.evictable_size() == 7 and cache.protected_size() == 0
    with pytest.raises(IntegrityError):
        cache.dec_lock_ref(b)
    # The root is never locked or unlocked.
    assert cache.inc_lock_ref(cache.root) == 0 and cache.dec_lock_ref(cache.root) == 0
    conserved(cache, alloc)


def test_lock_of_evicted_node_raises() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2])
    node = cache.match_prefix(K([1, 2])).last_node
    cache.evict(2)
    with pytest.raises(ValueError, match="not in the tree"):
        cache.inc_lock_ref(node)
    with pytest.raises(ValueError, match="not in the tree"):
        cache.dec_lock_ref(node)


def test_locked_internal_node_with_evicted_children_becomes_leaf_on_unlock() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 4])
    mid = cache.match_prefix(K([1, 2])).last_node
    cache.inc_lock_ref(mid)
    assert cache.evict(10) == 2  # only the two children
    assert not mid.children and cache.num_evictable_leaves() == 0
    cache.dec_lock_ref(mid)
    assert cache.num_evictable_leaves() == 1
    assert cache.evict(10) == 2
    assert cache.total_size() == 0
    conserved(cache, alloc)


def test_insert_under_locked_node_creates_evictable_leaf() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2])
    n = cache.match_prefix(K([1, 2])).last_node
    cache.inc_lock_ref(n)
    put(cache, alloc, [1, 2, 3, 4])
    assert cache.evictable_size() == 2 and cache.protected_size() == 2
    assert cache.evict(10) == 2
    conserved(cache, alloc)
    cache.dec_lock_ref(n)
    conserved(cache, alloc)


# ---- hit counts and priorities --------------------------------------------------------------
def test_hit_count_and_priority_rules() -> None:
    cache, _ = make()
    v = np.arange(1, 7, dtype=np.int64)
    r = cache.insert(K([1, 2, 3]), v[:3], priority=2)
    leaf = r.last_node
    assert leaf.hit_count == 1 and leaf.priority == 2
    cache.insert(K([1, 2, 3]), v[:3], priority=1)
    assert leaf.hit_count == 2 and leaf.priority == 2  # max, never lowered
    # inserted_len: the request already inserted these tokens, no new hit.
    cache.insert(K([1, 2, 3]), v[:3], inserted_len=3)
    assert leaf.hit_count == 2
    # Matching never changes hit counts.
    cache.match_prefix(K([1, 2, 3]))
    assert leaf.hit_count == 2
    # A split copies hit_count and priority; the upper part then takes the new insert's.
    r2 = cache.insert(K([1, 2, 9]), v[3:6], priority=5)
    upper = r2.last_node.parent
    assert upper.key.tolist() == [1, 2]
    assert upper.hit_count == 3 and upper.priority == 5
    assert leaf.priority == 2 and r2.last_node.priority == 5
    # A new leaf past inserted_len counts one hit; one entirely before it counts none.
    r3 = cache.insert(K([1, 2, 9, 4]), np.arange(1, 5, dtype=np.int64), inserted_len=4)
    assert r3.last_node.hit_count == 0


# ---- eviction -----------------------------------------------------------------------------------
def _victim_scenario(policy: str) -> str:
    """A, B, C are disjoint 4-token leaves. Times: A created t1 accessed t5 hits 1 prio 3;
    B created t2 accessed t6 hits 1 prio 0; C created t3 accessed t4 hits 2 prio 5."""
    cache, alloc = make(policy=policy)
    seqs = {"A": [1, 1, 1, 1], "B": [2, 2, 2, 2], "C": [3, 3, 3, 3]}
    put(cache, alloc, seqs["A"], priority=3)
    put(cache, alloc, seqs["B"], priority=0)
    put(cache, alloc, seqs["C"], priority=5)
    put(cache, alloc, seqs["C"], priority=0)
    cache.match_prefix(K(seqs["A"]))
    cache.match_prefix(K(seqs["B"]))
    assert cache.evict(4) == 4
    conserved(cache, alloc)
    (gone,) = [name for name, s in seqs.items() if cache.match_len(K(s)) == 0]
    return gone


@pytest.mark.parametrize(
    ("policy", "victim"),
    [
        ("lru", "C"),
        ("mru", "B"),
        ("fifo", "A"),
        ("filo", "C"),
        ("lfu", "A"),
        ("priority", "B"),
        ("slru", "A"),
    ],
)
def test_eviction_order_per_strategy(policy: str, victim: str) -> None:
    assert _victim_scenario(policy) == victim


def test_strategy_registry() -> None:
    assert set(EVICTION_STRATEGIES) == {"lru", "lfu", "fifo", "filo", "mru", "priority", "slru"}
    assert get_strategy("LRU").name == "lru"
    with pytest.raises(ValueError, match="lfu, lru, mru, priority, slru"):
        get_strategy("bogus")
    with pytest.raises(ValueError, match="Unknown eviction policy"):
        RadixCache(None, eviction_policy="bogus")
    slru = get_strategy("slru", protected_threshold=3)
    assert "3" in repr(slru)
    with pytest.raises(ValueError):
        get_strategy("slru", protected_threshold=-1)


def test_lru_evicts_full_order_and_parents_become_candidates() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3])  # t1
    put(cache, alloc, [1, 2, 4])  # t2: split, [1,2] internal
    put(cache, alloc, [5, 6])  # t3
    order: list[list[int]] = []
    cache.on_evict = lambda key, n: order.append(key.tokens.tolist())
    assert cache.total_size() == 6
    assert cache.evict(6) == 6
    # The insert at t2 touched [1,2,3] before splitting it, so [3] and [4] tie at t2 and node
    # id (creation order) decides; [1,2] (t2) becomes a leaf after both and precedes [5,6] (t3).
    assert order == [[1, 2, 3], [1, 2, 4], [1, 2], [5, 6]]
    conserved(cache, alloc)


@pytest.mark.parametrize("p", [1, 4])
def test_partial_vs_whole_leaf_eviction(p: int) -> None:
    seq = list(range(1, 4 * p + 1))  # one 4-page leaf
    cache, alloc = make(page_size=p)
    put(cache, alloc, seq)
    events: list[tuple[list[int], int]] = []
    cache.on_evict = lambda key, n: events.append((key.tokens.tolist(), n))
    before = alloc.available_size()
    ask = p + 1 if p > 1 else 3
    freed = cache.evict(ask)
    assert ask <= freed < ask + p
    assert alloc.available_size() == before + freed
    assert cache.total_size() == 4 * p - freed
    assert cache.match_len(K(seq)) == 4 * p - freed
    assert events == [(seq, freed)]  # path to the end of the evicted part
    conserved(cache, alloc)

    compat, calloc = make(page_size=p, compat=True)
    put(compat, calloc, seq)
    assert compat.evict(ask) == 4 * p  # whole leaf
    assert compat.total_size() == 0
    conserved(compat, calloc)


def test_partial_eviction_spans_leaves() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 1, 1])  # t1
    put(cache, alloc, [2, 2, 2, 2])  # t2
    assert cache.evict(5) == 5  # whole [1,1,1], then the tail 2 of [2,2,2,2]
    assert cache.match_len(K([2, 2, 2, 2])) == 2
    conserved(cache, alloc)
    assert cache.evict(0) == 0 and cache.evict(-3) == 0


def test_fifo_creation_time_on_split() -> None:
    for compat in (False, True):
        cache, alloc = make(policy="fifo", compat=compat)
        put(cache, alloc, [1, 2, 3, 4])
        created = cache.match_prefix(K([1, 2, 3, 4])).last_node.creation_time
        put(cache, alloc, [9, 9])
        r_leaf = cache.insert(K([1, 2, 7]), np.array([100], dtype=np.int64)[[0, 0, 0]])
        upper = r_leaf.last_node.parent
        if compat:
            assert upper.creation_time > created
        else:
            assert upper.creation_time == created


def test_priority_strategy_keeps_high_priority_prefix() -> None:
    cache, alloc = make(policy="priority")
    put(cache, alloc, [1, 2, 3, 4], priority=0)
    put(cache, alloc, [1, 2], priority=1)  # prompt re-insert at priority + 1 splits the leaf
    put(cache, alloc, [5, 5], priority=0)
    assert cache.evict(2) == 2
    # The low-priority tail [3,4] (older than [5,5]) goes first, the prompt part stays.
    assert cache.match_len(K([1, 2, 3, 4])) == 2
    assert cache.match_len(K([5, 5])) == 2
    conserved(cache, alloc)


@pytest.mark.parametrize("p", [1, 4])
@pytest.mark.parametrize("compat", [False, True])
def test_evict_reclaim_then_recycle_equals_evict_then_alloc(p: int, compat: bool) -> None:
    rng = np.random.default_rng(p)
    pairs = [make(page_size=p, compat=compat, size=64 * p) for _ in range(2)]
    reclaims = 0
    for _ in range(40):
        seq = rng.integers(0, 3, size=int(rng.integers(1, 12)) * p).tolist()
        for cache, alloc in pairs:
            cache.evict(len(seq) - alloc.available_size())  # room to insert (same on both)
            put(cache, alloc, seq)
        n = int(rng.integers(1, 10)) * p
        (a, aa), (b, ba) = pairs
        short = n - aa.available_size()
        if short > 0:
            freed = a.evict(short)
            reclaimed = b.evict_reclaim(short)  # segments, in eviction order
            assert sum(len(seg) for seg in reclaimed) == freed
            assert all(len(seg) % p == 0 for seg in reclaimed)
            assert b.total_size() == a.total_size()
            assert np.array_equal(b.all_values(), a.all_values())
            x = aa.alloc(n)
            if reclaims % 2:
                y = ba.recycle(reclaimed, n)
            else:
                out = np.full(n, -1, dtype=np.int64)
                y = out if ba.recycle_into(reclaimed, out) else None
            reclaims += 1
        else:
            x, y = aa.alloc(n), ba.alloc(n)
        assert (None if x is None else x.tolist()) == (None if y is None else y.tolist())
        assert aa.free_slots().tolist() == ba.free_slots().tolist()
        for cache, alloc in pairs:
            if x is not None:
                alloc.free(x if alloc is aa else y)
            conserved(cache, alloc)
    assert reclaims > 5


@pytest.mark.parametrize("p", [1, 4])
def test_insert_from_a_locked_start_equals_a_full_insert(p: int) -> None:
    """Growing requests checkpoint longer and longer keys: inserting from the locked node
    (start=(node, depth)), also given only the key past it (from_start=True), leaves every
    node exactly as a walk from the root does."""
    rng = np.random.default_rng(10 + p)
    full, fa = make(page_size=p, size=4096 * p)
    hint, ha = make(page_size=p, size=4096 * p)
    tail, ta = make(page_size=p, size=4096 * p)
    locks: list[list[tuple[object, int]]] = [[], [], []]  # per cache: (lock node, depth)
    seqs: list[list[int]] = []
    for step in range(120):
        if not seqs or rng.random() < 0.3:
            seqs.append(rng.integers(0, 3, size=int(rng.integers(1, 4)) * p).tolist())
            for lk in locks:
                lk.append((None, 0))
        i = int(rng.integers(len(seqs)))
        seqs[i] += rng.integers(0, 3, size=int(rng.integers(0, 3)) * p).tolist()
        key = K(seqs[i])
        for c, (cache, alloc) in enumerate(((full, fa), (hint, ha), (tail, ta))):
            node, depth = locks[c][i]
            if c == 2 and node is not None:
                slots = alloc.alloc(len(seqs[i]) - depth)
                assert slots is not None
                res = cache.insert(
                    K(seqs[i][depth:]),
                    slots,
                    priority=step % 3,
                    inserted_len=depth,
                    start=(node, depth),
                    from_start=True,
                )
                alloc.free(slots[: res.prefix_len - depth])
            else:
                slots = alloc.alloc(len(seqs[i]))
                assert slots is not None
                start = None if c == 0 or node is None else (node, depth)
                res = cache.insert(key, slots, priority=step % 3, inserted_len=depth, start=start)
                alloc.free(slots[: res.prefix_len])
            cache.inc_lock_ref(res.last_node)
            if node is not None:
                cache.dec_lock_ref(node)
            locks[c][i] = (res.last_node, len(seqs[i]))
        conserved(full, fa)
        conserved(hint, ha)
        conserved(tail, ta)

        def snapshot(cache: RadixCache) -> list[tuple[object, ...]]:
            return [
                (n.key.tobytes(), n.last_access_time, n.priority, n.hit_count, n.lock_ref)
                for n in cache._iter_nodes()
            ]

        assert snapshot(full) == snapshot(hint) == snapshot(tail)
    with pytest.raises(ValueError, match="start node"):
        tail.insert(K(seqs[0]), np.zeros(len(seqs[0])), from_start=True)
    node, depth = locks[1][0]
    with pytest.raises(IntegrityError, match="depth"):
        hint.insert(K([*seqs[0], 1] * 2), np.zeros(2 * len(seqs[0]) + 2), start=(node, depth + p))


@pytest.mark.parametrize("p", [1, 4])
def test_touch_prefixes_equals_touch_prefix_in_order(p: int) -> None:
    rng = np.random.default_rng(p)
    caches = [make(page_size=p, size=8192) for _ in range(2)]
    seqs = [rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist() for _ in range(30)]
    for cache, alloc in caches:
        for seq in seqs[:15]:
            put(cache, alloc, seq, ns=("x", None) if len(seq) % 3 == 0 else None)
    keys = [
        CacheKey(np.asarray(seq, dtype=np.int64 if i % 4 == 0 else np.int32), ns)
        for i, seq in enumerate([*seqs, [], [1], [0, 1, 2]])
        for ns in (None, ("x", None), ("x", ""))
    ]
    (a, _), (b, _) = caches
    for key in keys:
        a.touch_prefix(key)
    b.touch_prefixes(keys)

    def snapshot(cache: RadixCache) -> list[tuple[object, ...]]:
        return [(n.key.tobytes(), n.last_access_time) for n in cache._iter_nodes()]

    assert snapshot(a) == snapshot(b)
    assert a._clock == b._clock and a.root.last_access_time == b.root.last_access_time


@pytest.mark.parametrize("p", [1, 4])
def test_move_lock_equals_inc_then_dec(p: int) -> None:
    """Moving a request's lock down its path (and anywhere else) leaves every count as locking
    the new node and then releasing the old one does."""
    rng = np.random.default_rng(20 + p)
    pairs = [make(page_size=p, size=8192 * p) for _ in range(2)]
    seqs: list[list[int]] = []
    locks: list[list[object]] = [[], []]
    for step in range(150):
        if not seqs or rng.random() < 0.25:
            seqs.append(rng.integers(0, 3, size=int(rng.integers(1, 4)) * p).tolist())
            for lk in locks:
                lk.append(None)
        i = int(rng.integers(len(seqs)))
        if rng.random() < 0.7:
            seqs[i] += rng.integers(0, 3, size=int(rng.integers(1, 3)) * p).tolist()
        else:  # jump elsewhere (the new node is not below the old one)
            seqs[i] = rng.integers(0, 3, size=int(rng.integers(1, 6)) * p).tolist()
        for c, (cache, alloc) in enumerate(pairs):
            put(cache, alloc, seqs[i])
            new = cache.match_prefix(K(seqs[i])).last_node
            old = locks[c][i]
            if c == 0:
                cache.inc_lock_ref(new)
                if old is not None:
                    cache.dec_lock_ref(old)
            else:
                cache.move_lock(old, new)
            locks[c][i] = new
        if step % 10 == 9:  # evict what is unlocked, alike on both
            amount = int(rng.integers(1, 20)) * p
            for cache, _ in pairs:
                cache.evict(amount)
        (a, aa), (b, ba) = pairs
        conserved(a, aa)
        conserved(b, ba)
        assert (a.evictable_size(), a.protected_size()) == (b.evictable_size(), b.protected_size())
        assert [(n.key.tobytes(), n.lock_ref) for n in a._iter_nodes()] == [
            (n.key.tobytes(), n.lock_ref) for n in b._iter_nodes()
        ]
        assert sorted(n.id for n in a._evictable_leaves) == sorted(
            n.id for n in b._evictable_leaves
        )


@pytest.mark.parametrize("p", [1, 4])
def test_match_node_is_match_prefix_without_indices(p: int) -> None:
    rng = np.random.default_rng(30 + p)
    (a, aa), (b, ba) = (make(page_size=p, size=8192) for _ in range(2))
    for _ in range(25):
        seq = rng.integers(0, 3, size=int(rng.integers(1, 12)) * p).tolist()
        put(a, aa, seq)
        put(b, ba, seq)
    for _ in range(60):  # queries that hit, miss and split nodes
        key = K(rng.integers(0, 3, size=int(rng.integers(0, 14)) * p + int(rng.integers(p))))
        full, lean = a.match_prefix(key), b.match_node(key)
        assert lean.device_len == full.device_len and len(lean.indices) == 0
        assert lean.last_node.key.tobytes() == full.last_node.key.tobytes()
    assert [(n.key.tobytes(), n.last_access_time) for n in a._iter_nodes()] == [
        (n.key.tobytes(), n.last_access_time) for n in b._iter_nodes()
    ]
    conserved(a, aa)
    conserved(b, ba)


def test_evict_without_allocator() -> None:
    cache = RadixCache(None)
    cache.insert(K([1, 2, 3]), np.array([1, 2, 3], dtype=np.int64))
    assert cache.evict(3) == 3 and cache.total_size() == 0
    cache.check_integrity()


# ---- DFS-weight order ---------------------------------------------------------------------------
def _dfs_tree() -> tuple[RadixCache, dict[str, object]]:
    cache, alloc = make()
    put(cache, alloc, [1, 10])
    put(cache, alloc, [1, 11])
    put(cache, alloc, [2, 20])
    handles = {
        "n1": cache.match_prefix(K([1])).last_node,
        "l10": cache.match_prefix(K([1, 10])).last_node,
        "l11": cache.match_prefix(K([1, 11])).last_node,
        "l2": cache.match_prefix(K([2, 20])).last_node,
    }
    return cache, handles


def test_dfs_weight_order_worked_example() -> None:
    cache, h = _dfs_tree()
    nodes = [h["l2"], h["l11"], h["l10"], h["l10"], h["n1"]]
    assert cache.dfs_weight_order(nodes) == [2, 3, 1, 4, 0]  # type: ignore[arg-type]
    assert cache.dfs_weight_order([h["l2"], h["l11"]]) == [1, 0]  # type: ignore[list-item]
    assert cache.dfs_weight_order([]) == []
    # Root handles come last, in original order.
    order = cache.dfs_weight_order([cache.root, h["l2"], cache.root])  # type: ignore[list-item]
    assert order == [1, 0, 2]


def test_dfs_weight_order_keeps_unreachable_handles() -> None:
    cache, h = _dfs_tree()
    l2 = h["l2"]
    # Evict [2,20] (the LRU leaf after touching the [1,...] subtree).
    cache.match_prefix(K([1, 10]))
    cache.match_prefix(K([1, 11]))
    assert cache.evict(2) == 2
    assert l2.parent is None  # type: ignore[attr-defined]
    nodes = [l2, h["l11"], None, h["l10"]]
    assert cache.dfs_weight_order(nodes) == [3, 1, 0, 2]  # type: ignore[arg-type]


# ---- reset --------------------------------------------------------------------------------------
def test_reset_frees_everything_and_detaches_handles() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 4])
    node = cache.match_prefix(K([1, 2, 3])).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.total_size() == 0 and alloc.available_size() == alloc.total_size
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)
    assert cache.dfs_weight_order([node]) == [0]
    conserved(cache, alloc)


# ---- integrity ------------------------------------------------------------------------------------
def test_check_integrity_detects_corruption() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 4])
    cache.check_integrity()
    cache._evictable_size += 1
    with pytest.raises(IntegrityError, match="sizes"):
        cache.check_integrity()
    cache._evictable_size -= 1
    leaf = cache.match_prefix(K([1, 2, 3])).last_node
    leaf.lock_ref = 1
    with pytest.raises(IntegrityError):
        cache.check_integrity()
    leaf.lock_ref = 0
    cache._evictable_leaves.discard(leaf)
    with pytest.raises(IntegrityError, match="evictable leaves"):
        cache.check_integrity()
    cache._evictable_leaves.add(leaf)
    leaf.value = leaf.parent.value[:1].copy()
    with pytest.raises(IntegrityError, match="two tree positions"):
        cache.check_integrity()


def test_check_integrity_page_alignment() -> None:
    cache, alloc = make(page_size=4)
    put(cache, alloc, list(range(8)))
    leaf = cache.match_prefix(K(list(range(8)))).last_node
    leaf.key = leaf.key[:6].copy()
    with pytest.raises(IntegrityError, match="multiple of 4"):
        cache.check_integrity()


# ---- disabled mode and baseline ---------------------------------------------------------------
def test_disabled_mode() -> None:
    alloc = TokenAllocator(64)
    cache = RadixCache(alloc, eviction_policy="lfu", disable=True)
    assert cache.disabled and not cache.supports_prefix_sharing()
    assert cache.eviction_policy == "lru"
    slots = alloc.alloc(3)
    assert slots is not None
    res = cache.insert(K([1, 2, 3]), slots)
    assert res.prefix_len == 0 and res.last_node is cache.root
    m = cache.match_prefix(K([1, 2, 3]))
    assert m.device_len == 0 and m.last_node is cache.root and len(m.indices) == 0
    assert cache.match_len(K([1, 2, 3])) == 0
    cache.touch_prefix(K([1, 2, 3]))
    assert cache.inc_lock_ref(cache.root) == 0 and cache.dec_lock_ref(cache.root) == 0
    assert cache.evict(10) == 0
    assert cache.total_size() == cache.evictable_size() == cache.protected_size() == 0
    assert cache.dfs_weight_order([cache.root, cache.root]) == [0, 1]
    cache.check_integrity()
    # The caller still owns every slot it passed.
    alloc.check_integrity(request_slots=[slots])


def test_no_reuse_cache() -> None:
    alloc = TokenAllocator(64)
    cache = NoReuseCache()
    assert isinstance(cache, BasePrefixCache)
    assert not cache.disabled and cache.supports_prefix_sharing()
    slots = alloc.alloc(4)
    assert slots is not None
    assert cache.insert(K([1, 2, 3, 4]), slots).prefix_len == 0
    m = cache.match_prefix(K([1, 2, 3, 4]))
    assert m.device_len == 0 and m.last_node is cache.root
    assert cache.match_len(K([1, 2, 3, 4])) == 0
    assert cache.inc_lock_ref(cache.root) == 0 and cache.dec_lock_ref(cache.root) == 0
    with pytest.raises(ValueError):
        cache.inc_lock_ref(object())
    assert cache.evict(4) == 0
    assert cache.total_size() == cache.evictable_size() == cache.protected_size() == 0
    assert cache.all_values().size == 0
    assert cache.dfs_weight_order([cache.root] * 3) == [0, 1, 2]
    cache.touch_prefix(K([1]))
    cache.reset()
    cache.check_integrity()
    alloc.check_integrity(request_slots=slots)  # nothing was taken or freed
    with pytest.raises(ValueError):
        NoReuseCache(page_size=0)


@pytest.mark.python_tree
def test_make_cache_factory() -> None:
    alloc = TokenAllocator(64, page_size=4)
    cfg = SchedulerConfig(page_size=4, radix_eviction_policy="lfu")
    cache = make_cache(cfg, alloc)
    assert isinstance(cache, RadixCache)
    assert cache.page_size == 4 and cache.eviction_policy == "lfu"
    assert not cache.disabled and not cache.compat_sglang
    disabled = make_cache(cfg.replace(disable_radix_cache=True), alloc)
    assert disabled.disabled
    compat = make_cache(cfg.replace(compat="sglang"), alloc)
    assert isinstance(compat, RadixCache) and compat.compat_sglang
    with pytest.raises(ValueError):
        RadixCache(None, page_size=0)


@pytest.mark.python_tree
def test_stored_node_keys_are_checked() -> None:
    cache, alloc = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 4])
    leaf = cache.match_prefix(K([1, 2, 3])).last_node
    assert leaf.subtree_key == leaf.parent.child_key
    cache.check_integrity()
    good = leaf.subtree_key
    leaf.subtree_key = b"other"
    with pytest.raises(IntegrityError, match="subtree_key"):
        cache.check_integrity()
    leaf.subtree_key = good
    good = leaf.child_key
    leaf.child_key = b"other"
    with pytest.raises(IntegrityError, match="child_key"):
        cache.check_integrity()
    leaf.child_key = good
    conserved(cache, alloc)


def test_prefix_slots_gathers_what_match_prefix_returns_even_after_a_split() -> None:
    """``match_node`` now, ``prefix_slots`` later (the scheduler's admission): the same slots as
    ``match_prefix``, also when another walk split a node of the path in between."""
    alloc = TokenAllocator(1_000, 1)
    cache = RadixCache(alloc, page_size=1)
    a = np.arange(1, 41, dtype=np.int32)
    cache.insert(CacheKey(a), alloc.alloc(40))
    b = np.concatenate([a[:30], np.arange(100, 110, dtype=np.int32)])
    cache.insert(
        CacheKey(b), np.concatenate([cache.match_prefix(CacheKey(b)).indices, alloc.alloc(10)])
    )
    m = cache.match_node(CacheKey(a[:35]))  # splits the a-branch at 35
    assert m.device_len == 35 and len(m.indices) == 0
    cache.inc_lock_ref(m.last_node)
    cache.match_node(CacheKey(a[:12]))  # another walk splits the path again, above the node
    got = cache.prefix_slots(m.last_node, 35)
    assert np.array_equal(got, cache.match_prefix(CacheKey(a[:35])).indices)
    got[0] = -1  # a new array: the tree's values are untouched
    assert cache.match_prefix(CacheKey(a[:35])).indices[0] != -1
    with pytest.raises(IntegrityError):
        cache.prefix_slots(m.last_node, 34)
    cache.dec_lock_ref(m.last_node)
    cache.check_integrity()
    assert len(cache.prefix_slots(cache.root, 0)) == 0
    baseline = NoReuseCache()
    assert len(baseline.prefix_slots(baseline.root, 0)) == 0


@pytest.mark.python_tree
def test_insert_adopt_keeps_views_default_copies() -> None:
    """``adopt=True`` lets new nodes keep views of the caller's key and values (the scheduler
    never rewrites a row's computed positions); the default copies both."""
    cache, alloc = make(size=64)
    toks = np.arange(10, dtype=np.int32)
    vals = alloc.alloc(10)
    assert vals is not None
    leaf = cache.insert(CacheKey(toks), vals, adopt=True).last_node
    assert np.shares_memory(leaf.key, toks) and np.shares_memory(leaf.value, vals)
    toks2 = np.arange(20, 30, dtype=np.int32)
    vals2 = alloc.alloc(10)
    assert vals2 is not None
    leaf2 = cache.insert(CacheKey(toks2), vals2).last_node
    assert not np.shares_memory(leaf2.key, toks2)
    assert not np.shares_memory(leaf2.value, vals2)
    # A view that needs a dtype change is copied even when adopted.
    vals3 = alloc.alloc(5)
    assert vals3 is not None
    leaf3 = cache.insert(K([40, 41, 42, 43, 44]), vals3.astype(np.int32), adopt=True).last_node
    assert leaf3.value.dtype == np.int64
    conserved(cache, alloc)


@pytest.mark.python_tree
@pytest.mark.parametrize("split_copies", [True, False])
def test_a_split_copies_both_halves_unless_the_tree_keeps_views(split_copies: bool) -> None:
    """By default each half of a split owns its memory (an evicted half frees it); a tree
    built with ``split_copies=False`` (the optimal bound's, which never evicts) keeps views
    of the adopted arrays, so splitting it costs no memory. Keys and values read the same."""
    cache = RadixCache(None, page_size=1, split_copies=split_copies)
    toks = np.arange(10, dtype=np.int32)
    vals = np.arange(100, 110, dtype=np.int64)
    leaf = cache.insert(CacheKey(toks), vals, adopt=True).last_node
    other = np.array([0, 1, 2, 3, 99], dtype=np.int32)
    cache.insert(CacheKey(other), np.arange(5, dtype=np.int64), adopt=True)
    head = leaf.parent
    assert head is not None and head is not cache.root
    assert head.key.tolist() == [0, 1, 2, 3] and leaf.key.tolist() == list(range(4, 10))
    assert head.value.tolist() == [100, 101, 102, 103] and leaf.value.tolist()[0] == 104
    for a, base in ((head.key, toks), (leaf.key, toks), (head.value, vals), (leaf.value, vals)):
        assert np.shares_memory(a, base) is not split_copies


@pytest.mark.parametrize("p", [1, 4])
def test_prefix_slots_equal_match_indices(p: int) -> None:
    """``prefix_slots`` after ``match_node`` gathers what ``match_prefix`` returns, as a new
    array or into the caller's ``out``; a wrong length is an IntegrityError."""
    rng = np.random.default_rng(40 + p)
    cache, alloc = make(page_size=p, size=8192)
    seqs = [rng.integers(0, 3, size=int(rng.integers(1, 30)) * p).tolist() for _ in range(25)]
    for seq in seqs[:15]:
        put(cache, alloc, seq)
    for seq in seqs:
        key = K(seq)
        m = cache.match_node(key)
        want = cache.match_prefix(key).indices
        got = cache.prefix_slots(m.last_node, m.device_len)
        buf = np.full(m.device_len + 3, -1, dtype=np.int64)
        into = cache.prefix_slots(m.last_node, m.device_len, out=buf[: m.device_len])
        assert got.tolist() == want.tolist() == into.tolist()
        assert (buf[m.device_len :] == -1).all()
        if m.device_len:
            assert np.shares_memory(into, buf)
            with pytest.raises(IntegrityError, match="path holds"):
                cache.prefix_slots(m.last_node, m.device_len - p)
            with pytest.raises(ValueError, match="out holds"):
                cache.prefix_slots(m.last_node, m.device_len, out=buf[: m.device_len + 1])
    conserved(cache, alloc)
