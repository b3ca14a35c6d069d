"""The native cache's ``evict`` with the native pool (kv.cpp ``evict_free``: the evicted slots
freed to the pool in the same call, as int32) against ``evict_flat`` then ``Pool.free`` unchecked
(the int64 array in between): the same count, free list and tree; any other allocator still
gets the evicted array through its ``free``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fakes import put_fresh
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")


def _cache(allocator: Any, p: int, compat: bool, policy: str) -> Any:
    from radixsched.native.radix import NativeRadixCache

    return NativeRadixCache(allocator, p, policy, compat_sglang=compat)


@pytest.mark.parametrize("p", [1, 4])
@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("policy", ["lru", "priority"])
def test_evict_with_the_native_pool_equals_evict_flat_then_free(
    p: int, compat: bool, policy: str
) -> None:
    from radixsched.native.radix import make_pool

    rng = np.random.default_rng(11 * p + compat)
    apool, bpool = make_pool(40 * p, p), make_pool(40 * p, p)
    a, b = _cache(apool, p, compat, policy), _cache(None, p, compat, policy)
    evicted = 0
    for _ in range(150):
        seq = (rng.integers(0, 4, size=int(rng.integers(1, 9)) * p)).tolist()
        prio = int(rng.integers(0, 3))
        k = int(rng.integers(-1, 12)) * p - int(rng.integers(0, 2)) * (p > 1)
        got = a.evict(k)
        out = b.tree.evict_flat(k)
        if len(out):
            bpool.free(out, checked=False)
        assert got == len(out)
        evicted += got
        assert apool.free_slots().tolist() == bpool.free_slots().tolist()
        assert a.tree.all_values().tolist() == b.tree.all_values().tolist()
        assert a.evictable_size() == b.evictable_size()
        a.check_integrity()
        if apool.available_size() >= len(seq):
            put_fresh(a, apool, seq, prio)
            put_fresh(b, bpool, seq, prio)
    assert evicted > 100


def test_evict_with_another_allocator_frees_through_it() -> None:
    from radixsched.native.radix import make_pool

    class Recording:
        def __init__(self) -> None:
            self.pool = make_pool(16, 1)
            self.freed: list[list[int]] = []

        def alloc(self, n: int) -> Any:
            return self.pool.alloc(n)

        def free(self, slots: Any, *, checked: bool = True) -> None:
            self.freed.append(slots.tolist())
            self.pool.free(slots, checked=checked)

    rec = Recording()
    cache = _cache(rec, 1, False, "lru")
    put_fresh(cache, rec, [1, 2, 3], 0)
    put_fresh(cache, rec, [5, 6], 0)
    assert cache.evict(0) == 0 and rec.freed == []
    assert cache.evict(4) == 4  # [1, 2, 3] whole, then [5, 6]'s last token
    assert len(rec.freed) == 1 and len(rec.freed[0]) == 4 and cache.evictable_size() == 1
    assert rec.pool.available_size() == 15
