"""The native tree's child index (``ChildIndex`` in ``_native/radix.hpp``) and its one-call
``match_prefix`` (``Tree.match_key``), against the Python tree: wide fan-outs (the index grows,
and evictions delete from it with backward shifts), children whose first pages differ only past
the first token or only by namespace, and the match's edge cases (empty key, a disabled cache,
another dtype, namespaces, keys shorter than a page)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _pair(page: int, size: int = 40_000, disable: bool = False) -> list[tuple[Any, TokenAllocator]]:
    from radixsched.native.radix import NativeRadixCache

    out = []
    for cls in (RadixCache, NativeRadixCache):
        alloc = TokenAllocator(size, page)
        out.append((cls(alloc, page, "lru", disable=disable), alloc))
    return out


def _tree(cache: Any) -> list[Any]:
    return [
        (n.id, n.parent.id, n.key.tolist(), n.value.tolist(), n.last_access_time, n.child_key)
        for n in cache._iter_nodes()
    ]


def _match(cache: Any, key: CacheKey) -> tuple[list[int], int, int, int]:
    m = cache.match_prefix(key)
    return (m.indices.tolist(), m.device_len, m.last_node.id, m.host_len)


def _insert_both(pair: list[tuple[Any, TokenAllocator]], key: CacheKey) -> None:
    for cache, alloc in pair:
        n = len(key.tokens) - len(key.tokens) % cache.page_size
        slots = alloc.alloc(n)
        assert slots is not None
        res = cache.insert(key, slots)
        alloc.free(slots[: res.prefix_len])


def _keys(page: int) -> list[CacheKey]:
    """300 keys whose first pages collide in the low bits (multiples of 1024), some sharing
    the first token and differing later in the page, some in another namespace."""
    keys = []
    for i in range(300):
        first = [(i % 150) * 1024] + [i // 150] * (page - 1)
        ns = ("x", None) if (page == 1 and i >= 150) else None
        body = [(i * 7 + j) % 97 for j in range(2 * page + i % 3 * page)]
        keys.append(CacheKey(np.array(first + body, dtype=np.int32), ns))
    return keys


@pytest.mark.parametrize("page", [1, 4])
def test_wide_fanout_inserts_evictions_and_matches_equal_the_python_tree(page: int) -> None:
    pair = _pair(page)
    keys = _keys(page)
    for key in keys:
        _insert_both(pair, key)
    (py, _), (nat, _) = pair
    nat.check_integrity()
    assert _tree(py) == _tree(nat)
    for key in keys[::3]:  # touch a third, so that the evictions below skip them
        assert _match(py, key) == _match(nat, key)
    for n in (37 * page, 211 * page, 5 * page):
        assert py.evict(n) == nat.evict(n)
        nat.check_integrity()
        assert _tree(py) == _tree(nat)
        for key in keys:
            assert _match(py, key) == _match(nat, key)
    assert py._clock == nat._clock


def test_match_edge_cases_equal_the_python_tree() -> None:
    pair = _pair(4)
    base = np.arange(100, 140, dtype=np.int32)
    _insert_both(pair, CacheKey(base))
    _insert_both(pair, CacheKey(base, ("e", "s")))
    (py, _), (nat, _) = pair
    queries = [
        CacheKey(base),
        CacheKey(np.zeros(0, dtype=np.int32)),  # empty: no walk, no clock tick
        CacheKey(base[:3]),  # shorter than a page: a walk that matches nothing
        CacheKey(base[:30].astype(np.int64)),  # another dtype
        CacheKey(base[::2].copy()),  # a miss on the first page
        CacheKey(base, ("e", "s")),
        CacheKey(base, ("e", "")),  # another namespace (never inserted)
        CacheKey(base[:8], (None, "")),  # normalised to the default namespace
    ]
    for q in queries:
        assert _match(py, q) == _match(nat, q)
        assert py._clock == nat._clock
    assert _tree(py) == _tree(nat)
    nat.check_integrity()


def test_disabled_cache_matches_nothing_without_a_tick() -> None:
    pair = _pair(1, disable=True)
    (py, _), (nat, _) = pair
    key = CacheKey(np.arange(10, dtype=np.int32))
    assert _match(py, key) == _match(nat, key)
    assert nat.match_prefix(key).device_len == 0
    assert py._clock == nat._clock == 0


def test_match_key_rejects_a_bad_key() -> None:
    (_, _), (nat, _) = _pair(1)
    with pytest.raises(TypeError):
        nat.match_prefix((np.arange(3, dtype=np.int32),))  # type: ignore[arg-type]
