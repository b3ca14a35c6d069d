"""The native tree's evictable leaves (a list with an index by node id, radix.hpp): adding a
member or removing a non-member changes nothing, a leaf leaving from the middle of the list
leaves the others evictable in the reference's order, and a heap entry of an evicted (freed)
node is skipped by its id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from radixsched.cache import CacheKey, IntegrityError, RadixCache, TokenAllocator
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _trees() -> tuple[Any, Any]:
    from radixsched.native.radix import NativeRadixCache

    pa, na = TokenAllocator(256), TokenAllocator(256)
    return (RadixCache(pa, 1, "lru"), pa), (NativeRadixCache(na, 1, "lru"), na)


def _put(cache: Any, alloc: TokenAllocator, tokens: Sequence[int]) -> Any:
    slots = alloc.alloc(len(tokens))
    assert slots is not None
    res = cache.insert(CacheKey(np.asarray(tokens, dtype=np.int32)), slots, 0)
    alloc.free(slots[: res.prefix_len])
    return cache.match_prefix(CacheKey(np.asarray(tokens, dtype=np.int32))).last_node


def test_adding_a_member_or_removing_a_non_member_changes_nothing() -> None:
    _, (cache, _alloc) = _trees()
    a = _put(cache, _alloc, [1, 2, 3])
    _put(cache, _alloc, [1, 2, 4])
    b = _put(cache, _alloc, [5, 6])
    mid = a.parent
    tree = cache.tree
    assert cache.num_evictable_leaves() == 3
    tree.leaf_set(a, True)
    tree.leaf_set(mid, False)
    assert cache.num_evictable_leaves() == 3 and not tree.leaf_member(mid)
    cache.check_integrity()
    tree.leaf_set(b, False)
    tree.leaf_set(b, False)
    assert cache.num_evictable_leaves() == 2 and not tree.leaf_member(b)
    with pytest.raises(IntegrityError, match="evictable leaves"):
        cache.check_integrity()
    tree.leaf_set(b, True)
    assert tree.leaf_member(b) and tree.leaf_member(a)
    cache.check_integrity()


def test_leaves_leaving_the_middle_evict_as_the_reference() -> None:
    """Leaves locked and unlocked out of their order of arrival (each leaves the list's middle,
    the last one taking its place), then evicted a few tokens at a time, and re-inserted over
    freed nodes: the same evictions, the same free lists and the same leaf counts as the
    Python tree."""
    trees = _trees()
    nodes: list[list[Any]] = [[], []]
    for i, (cache, alloc) in enumerate(trees):
        for t in range(6):
            nodes[i].append(_put(cache, alloc, [t, t + 10, t + 20]))
        for j in (1, 3, 0):
            cache.inc_lock_ref(nodes[i][j])
        cache.dec_lock_ref(nodes[i][3])
    for step in range(8):
        counts = []
        for i, (cache, alloc) in enumerate(trees):
            evicted = cache.evict(2)
            if step == 4:
                cache.dec_lock_ref(nodes[i][1])
                _put(cache, alloc, [7, 8, 9, 10])
            counts.append((evicted, cache.num_evictable_leaves(), alloc.free_slots().tolist()))
            cache.check_integrity()
        assert counts[0] == counts[1]


def test_a_partly_evicted_leaf_keeps_its_block_while_it_holds_a_sixteenth() -> None:
    """A cut leaf's key and slots stay views of their blocks while they hold at least 1/16 of
    them (4 of 64 here), and are copied out to blocks of their own below that."""
    _, (cache, alloc) = _trees()
    leaf = _put(cache, alloc, list(range(100, 164)))
    slots = leaf.value.tolist()
    assert (leaf.key_block, leaf.value_block) == (64, 64)
    cache.evict(60)
    assert leaf.key.tolist() == [100, 101, 102, 103] and leaf.value.tolist() == slots[:4]
    assert (leaf.key_block, leaf.value_block) == (64, 64)
    cache.evict(1)
    assert leaf.key.tolist() == [100, 101, 102] and leaf.value.tolist() == slots[:3]
    assert (leaf.key_block, leaf.value_block) == (3, 3)
    cache.check_integrity()
    alloc.check_integrity(cache_slots=cache.all_values())


def test_a_node_with_an_id_past_the_tree_s_is_refused_as_a_leaf() -> None:
    _, (big, big_alloc) = _trees()
    _, (small, _small_alloc) = _trees()
    for t in range(3):
        node = _put(big, big_alloc, [t, t + 1])
    with pytest.raises(ValueError, match="not of this tree"):
        small.tree.leaf_set(node, True)
    assert small.num_evictable_leaves() == 0
    small.check_integrity()


def test_a_reset_clears_the_leaf_index() -> None:
    _, (cache, alloc) = _trees()
    old = [_put(cache, alloc, [t, t + 1, t + 2]) for t in range(4)]
    cache.reset()
    assert cache.num_evictable_leaves() == 0
    assert not any(cache.tree.leaf_member(n) for n in old)
    cache.check_integrity()
    _put(cache, alloc, [9, 9])
    assert cache.num_evictable_leaves() == 1
    cache.check_integrity()
    alloc.check_integrity(cache_slots=cache.all_values())
