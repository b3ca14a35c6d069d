"""The native checkpoint's re-match (kv.cpp ``checkpoint``, when part of the inserted range was
cached already) against the same steps spelled out on a twin tree: insert, walk the whole key
from the root (the lock's path key, then the request's tokens), free the request's copies of
[lo, dup_end) and point its row at the cache's, move the lock. The native one walks from the
lock when it is in the key's namespace (``Tree::walk_below``) and copies only [lo, dup_end)
(``Tree::path_slots``); with the lock in another namespace it rebuilds the key (the fallback).
The same row, free list, tree (ids, keys, slots, times, counts) and clock either way."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")

I32 = np.int32


def _twin(p: int) -> tuple[Any, Any]:
    from radixsched.native.radix import make_pool

    mod = core()
    assert mod is not None
    return mod.Tree(p, "lru", 2, False, False), make_pool(64 * p, p)


def _put(tree: Any, pool: Any, toks: list[int], ns: int) -> Any:
    """Cache `toks` with fresh slots (the duplicates freed) and return its node."""
    slots = pool.alloc(len(toks))
    length, node = tree.insert(np.array(toks, I32), ns, slots, 0, 0, None, 0, 0)
    if length:
        pool.free(slots[:length])
    return node


def _path_key(node: Any) -> list[int]:
    parts = []
    while node.parent is not None:
        parts.append(node.key.tolist())
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def _reference(tree: Any, pool: Any, toks: list[int], ns: int, row: Any, lo: int, lock: Any) -> Any:
    """The checkpoint's steps one by one (the key rebuilt, the whole path's slots read)."""
    aligned = len(toks)
    start = lo if lock is not None else 0
    length, node = tree.insert(
        np.array(toks[start:], I32), ns, row[start:aligned], 0, 0, lock, start, start
    )
    if length != lo:
        key = (_path_key(lock) if lock is not None else []) + toks[start:]
        walked, m, values = tree.walk(np.array(key, I32), ns, True)
        if m < aligned:
            return None
        dup_end = min(length, aligned)
        if dup_end > lo:
            pool.free(row[lo:dup_end])
            row[lo:dup_end] = values[lo:dup_end]
        node = walked
    tree.move_lock(lock, node)
    return node


def _state(tree: Any, pool: Any) -> list[Any]:
    nodes = [
        (n.id, n.key.tolist(), n.value.tolist(), n.lock_ref, n.last_access_time, n.hit_count)
        for n in tree.nodes()
    ]
    return [nodes, tree.clock, pool.free_slots().tolist(), tree.evictable_size()]


# (tokens cached by another request first (namespace), the request's key, its locked depth,
# the request's namespace, the lock's namespace)
CASES = [
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], 2, 0, 0),  # cached past the lock, ends on a node
    ([0, 1, 2, 3, 9, 9], [0, 1, 2, 3, 4, 5], 1, 0, 0),  # the cached part ends inside a node
    ([0, 1, 2, 3], [0, 1, 2, 3], 1, 0, 0),  # all of it cached already
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], 0, 0, 0),  # no lock: the whole key from the root
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], 2, 0, 1),  # the lock in another namespace
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], 2, 1, 0),  # the other way round
    ([0, 1, 2, 3], [0, 1, 2, 3, 4, 5], 3, 1, 1),  # both in namespace 1
]


def _checkpoint_both(p: int, case: Any, tail: list[int]) -> Any:
    """The case's checkpoint on two twin trees, natively on one and as the steps spelled out
    on the other (its key's pages, then ``tail``, tokens of a partial last page): the same
    re-match, rows, trees and pools. Returns the native tree."""
    cached, key, depth, ns, lock_ns = case
    cached_p = [t for t in cached for _ in range(p)]
    key_p = [t for t in key for _ in range(p)] + tail
    lo = depth * p
    (a, apool), (b, bpool) = _twin(p), _twin(p)
    rows = []
    locks = []
    for tree, pool in ((a, apool), (b, bpool)):
        lock = None
        if lo:
            lock = _put(tree, pool, key_p[:lo], lock_ns)
            tree.inc_lock_ref(lock)
        _put(tree, pool, cached_p, lock_ns if lo else ns)
        row = np.full(len(key_p) + 2 * p, -1, dtype=np.int64)
        if lo:
            row[:lo] = tree.prefix_slots(lock, lo, None)
        row[lo : len(key_p) - len(tail)] = pool.alloc(len(key_p) - len(tail) - lo)
        rows.append(row)
        locks.append(lock)
    start = lo if lo else 0
    got = a.checkpoint(
        apool, np.array(key_p[start:], I32), start, ns, rows[0], lo, len(key_p), 0, 0, locks[0]
    )
    want = _reference(b, bpool, key_p, ns, rows[1], lo, locks[1])
    assert (got is None) == (want is None)
    if got is not None:
        assert got.id == want.id
    assert rows[0].tolist() == rows[1].tolist()
    assert _state(a, apool) == _state(b, bpool)
    return a


@pytest.mark.parametrize("p", [1, 4])
@pytest.mark.parametrize("case", CASES)
def test_checkpoint_rematch_equals_the_steps_spelled_out(p: int, case: Any) -> None:
    a = _checkpoint_both(p, case, [])
    if case[3] == case[4]:  # ns == lock_ns, else the insert hangs a leaf under another's lock
        a.check_integrity()


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_of_a_partial_last_page_rematches_as_the_steps(case: Any) -> None:
    """A key that ends inside a page (the Python API's checkpoint takes any `aligned`): the
    insert trims it, so the re-match (from the lock, or with its path's key) falls short and
    nothing is moved, after the same touches as the steps spelled out."""
    _checkpoint_both(4, case, [7, 7])
