"""The persistent lazy eviction heap evicts exactly what rebuilding the heap on every call
evicts, for every monotone strategy, under random inserts, matches, locks and evictions."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.cache.evict import EVICTION_STRATEGIES

pytestmark = pytest.mark.usefixtures("radix_impl")


def _snapshot(cache: RadixCache) -> list[tuple[bytes, int]]:
    return sorted((n.key.tobytes(), len(n.value)) for n in cache._iter_nodes())


@pytest.mark.parametrize("strategy", sorted(EVICTION_STRATEGIES))
@pytest.mark.parametrize("seed", range(4))
def test_lazy_heap_evicts_like_a_fresh_heap(strategy: str, seed: int) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    caches = []
    for persistent in (True, False):
        alloc = TokenAllocator(4000, 1)
        cache = RadixCache(alloc, eviction_policy=strategy)
        cache._heap_persistent = persistent and cache.strategy.monotone
        caches.append((cache, alloc))
    heads = [nrng.integers(0, 30, 40).astype(np.int32) for _ in range(4)]
    locks: list[list[object]] = [[], []]
    for _ in range(200):
        op = rng.random()
        p = np.concatenate(
            [
                heads[rng.randrange(4)][: rng.randrange(1, 40)],
                nrng.integers(0, 30, rng.randrange(0, 15)),
            ]
        ).astype(np.int32)
        for i, (cache, alloc) in enumerate(caches):
            if op < 0.45:
                slots = alloc.alloc(len(p))
                if slots is not None:
                    res = cache.insert(CacheKey(p), slots)
                    if res.prefix_len:
                        alloc.free(slots[: res.prefix_len])
            elif op < 0.65:
                cache.match_prefix(CacheKey(p))
            elif op < 0.75:
                node = cache.match_prefix(CacheKey(p)).last_node
                cache.inc_lock_ref(node)
                locks[i].append(node)
            elif op < 0.85 and locks[i]:
                cache.dec_lock_ref(locks[i].pop(0))
            else:
                cache.evict(1 + (int(p[0]) * 7) % 50)
        assert _snapshot(caches[0][0]) == _snapshot(caches[1][0])
    for cache, _ in caches:
        cache.check_integrity()
