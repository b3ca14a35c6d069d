"""The native tree's ``alloc_into`` (kv.cpp ``alloc_evicting``: evicted slots written straight
into the caller's array) against the same eviction as segments then ``recycle_into``: the same
slots, the same free list, the same tree, and the caller's array untouched when it fails."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fakes import put_fresh
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")


def _twin(p: int, compat: bool, policy: str, size: int) -> tuple[Any, Any]:
    from radixsched.native.radix import NativeRadixCache, make_pool

    pool = make_pool(size, p)
    return NativeRadixCache(pool, p, policy, compat_sglang=compat), pool


@pytest.mark.parametrize("p", [1, 4])
@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("policy", ["lru", "priority"])
def test_alloc_into_equals_evict_then_recycle_into(p: int, compat: bool, policy: str) -> None:
    rng = np.random.default_rng(7 * p + compat)
    pairs = [_twin(p, compat, policy, 48 * p) for _ in range(2)]
    (a, apool), (b, bpool) = pairs
    held: list[tuple[np.ndarray, np.ndarray]] = []  # (a's slots, b's slots), still allocated
    fails = shorts = 0
    for _ in range(120):
        seq = (rng.integers(0, 3, size=int(rng.integers(1, 10)) * p)).tolist()
        prio = int(rng.integers(0, 3))
        for cache, pool in pairs:
            cache.evict(len(seq) - pool.available_size())
            if pool.available_size() >= len(seq):
                put_fresh(cache, pool, seq, prio)
        n = int(rng.integers(1, 30)) * p
        out_a = np.full(n + 2, -1, dtype=np.int64)
        out_b = out_a.copy()
        shorts += n > apool.available_size()
        ok_a = a.tree.alloc_into(apool, out_a[1:-1])
        segs = b.evict_reclaim(max(n - bpool.available_size(), 0))
        ok_b = bpool.recycle_into(segs, out_b[1:-1]) if segs else bpool.alloc_into(out_b[1:-1])
        assert ok_a == ok_b
        assert out_a.tolist() == out_b.tolist()  # untouched on failure, and past the view
        assert apool.free_slots().tolist() == bpool.free_slots().tolist()
        assert a.tree.all_values().tolist() == b.tree.all_values().tolist()
        assert a.evictable_size() == b.evictable_size()
        a.check_integrity()
        if ok_a:
            held.append((out_a[1:-1].copy(), out_b[1:-1].copy()))
        else:
            fails += 1
        if held and rng.random() < 0.5:
            xa, xb = held.pop(int(rng.integers(0, len(held))))
            apool.free(xa)
            bpool.free(xb)
    assert fails > 3 and shorts > 20
