from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cache.base import CacheKey
from radixsched.cluster.hicache import HostKVTier, host_capacity_tokens


def key(tokens: list[int] | range, ns: tuple[str | None, str | None] | None = None) -> CacheKey:
    return CacheKey(np.asarray(list(tokens), dtype=np.int32), ns)


def test_capacity_from_gb() -> None:
    assert host_capacity_tokens(1.0, 1024) == 1 << 20
    assert host_capacity_tokens(0.0, 128) == 0
    with pytest.raises(ValueError):
        host_capacity_tokens(-1, 128)
    with pytest.raises(ValueError):
        host_capacity_tokens(1, 0)


def test_evicted_segment_is_matched_beyond_device_prefix() -> None:
    tier = HostKVTier(capacity_tokens=1000, page_size=4)
    full = range(20)
    # Device evicted tokens [8, 20) of this path; [0, 8) stays on device.
    tier.on_evict(key(full), 12)
    assert tier.size_tokens == 12
    assert tier.match_len(key(full)) == 0  # page 0 is not on the host
    assert tier.match_len(key(full), device_len=8) == 20
    assert tier.host_len(key(full), 8) == 12
    # A longer query stops where the host copy ends (page-aligned, partial page dropped).
    assert tier.match_len(key([*full, 1, 2, 3, 4, 5]), device_len=8) == 20
    # A divergent query stops at the divergence page.
    assert tier.match_len(key([*range(12), 99, 99, 99, 99]), device_len=8) == 12
    # The device match alone, when nothing beyond it is on the host.
    assert tier.host_len(key(range(100, 120)), 8) == 0


def test_straddling_and_partial_pages() -> None:
    tier = HostKVTier(capacity_tokens=1000, page_size=4)
    # Segment [6, 14): pages [4,8) (straddles) and [8,12) stored; [12,14) partial is not.
    tier.on_evict(key(range(14)), 8)
    assert tier.size_tokens == 8
    assert tier.match_len(key(range(14)), device_len=6) == 12
    assert tier.host_len(key(range(14)), 6) == 6
    # Device match not page aligned and host lacks that page: only whole pages count.
    tier2 = HostKVTier(capacity_tokens=1000, page_size=4)
    assert tier2.match_len(key(range(14)), device_len=6) == 4
    assert tier2.host_len(key(range(14)), 6) == 0


def test_namespaces_are_separate() -> None:
    tier = HostKVTier(capacity_tokens=100, page_size=2)
    tier.on_evict(key(range(8), ("a", None)), 8)
    assert tier.match_len(key(range(8), ("a", None))) == 8
    assert tier.match_len(key(range(8))) == 0
    assert tier.match_len(key(range(8), ("a", ""))) == 8  # empty salt = no salt


def test_capacity_lru_trims_deep_pages_first() -> None:
    tier = HostKVTier(capacity_tokens=16, page_size=4)  # 4 pages
    tier.on_evict(key(range(8)), 8)  # a: 2 pages
    tier.on_evict(key(range(100, 108)), 8)  # b: 2 pages
    tier.touch(key(range(8)), 8)  # a is now the most recent
    tier.on_evict(key(range(200, 204)), 4)  # c: 1 page -> drop b's deep page
    assert tier.match_len(key(range(8))) == 8
    assert tier.match_len(key(range(100, 108))) == 4
    assert tier.match_len(key(range(200, 204))) == 4
    assert tier.stats.dropped_pages == 1
    tier.check_integrity()
    tier.clear()
    assert tier.size_tokens == 0


def test_zero_capacity_stores_nothing() -> None:
    tier = HostKVTier(capacity_tokens=3, page_size=4)
    tier.on_evict(key(range(8)), 8)
    assert tier.size_tokens == 0 and tier.match_len(key(range(8))) == 0


def test_reject_bad_arguments() -> None:
    with pytest.raises(ValueError):
        HostKVTier(10, page_size=0)
    with pytest.raises(ValueError):
        HostKVTier(-1, page_size=4)


def test_wired_to_radix_cache_eviction() -> None:
    from radixsched.cache.radix import RadixCache

    class Freer:
        def __init__(self) -> None:
            self.freed = 0

        def free(self, slots: np.ndarray, *, checked: bool = True) -> None:
            self.freed += len(slots)

    tier = HostKVTier(capacity_tokens=1000, page_size=4)
    cache = RadixCache(Freer(), page_size=4, on_evict=tier.on_evict)
    a = key(range(16))
    b = key([*range(8), *range(50, 58)])
    cache.insert(a, np.arange(16, dtype=np.int64))
    cache.insert(b, np.arange(100, 116, dtype=np.int64))
    assert cache.evict(8) >= 8
    device = cache.match_len(a)
    device_b = cache.match_len(b)
    # Whatever the device lost of a or b, the host tier has it back.
    assert device + tier.host_len(a, device) == 16
    assert device_b + tier.host_len(b, device_b) == 16
    cache.evict(10**6)
    assert tier.match_len(a) == 16 and tier.match_len(b) == 16


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=16), st.integers(1, 16)),
        min_size=1,
        max_size=15,
    ),
    st.integers(0, 40),
)
def test_properties(evictions: list[tuple[list[int], int]], capacity: int) -> None:
    """Bounded by capacity; matches are page-aligned prefixes of the query; a just-stored
    segment is fully matched when capacity allows."""
    tier = HostKVTier(capacity_tokens=capacity, page_size=2)
    for tokens, n in evictions:
        n = min(n, len(tokens))
        k = key(tokens)
        tier.on_evict(k, n)
        assert tier.size_tokens <= capacity
        start = len(tokens) - n
        m = tier.match_len(k, device_len=start)
        assert m % 2 == 0 and m <= len(tokens)
        stored_pages = len(tokens) // 2 - start // 2
        if stored_pages <= tier.max_pages and stored_pages > 0:
            assert m == (len(tokens) // 2) * 2
