"""The native match_prefix fast path (radixsched/_native/radix_match.cpp) against the Python
tree: tokens of any int dtype or layout, partial matches (their own exact-size slot array),
matches that split a node, keys shorter than a page (the clock still ticks), namespaces."""

from __future__ import annotations

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.native import core
from radixsched.native.radix import NativeRadixCache

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _pair(page: int) -> tuple[RadixCache, NativeRadixCache]:
    caches = (RadixCache(TokenAllocator(64, page), page), NativeRadixCache(None, page))
    seqs = [(list(range(1, 13)), None), ([*range(1, 9), 50, 51, 52, 53], ("a", None))]
    seqs.append(([*range(1, 5), 70, 71, 72, 73], None))
    for i, (toks, ns) in enumerate(seqs):
        vals = np.arange(100 * (i + 1), 100 * (i + 1) + len(toks), dtype=np.int64)
        for c in caches:
            c.insert(CacheKey(np.array(toks, np.int32), ns), vals)
    return caches


def _same(key: CacheKey, py: RadixCache, nat: NativeRadixCache) -> np.ndarray:
    a, b = py.match_prefix(key), nat.match_prefix(key)
    assert b.indices.dtype == np.int64 and b.indices.flags.c_contiguous
    assert b.indices.flags.owndata and len(b.indices) == b.device_len
    assert b.indices.tolist() == a.indices.tolist()
    assert (b.device_len, len(b.last_node), b.host_len) == (a.device_len, len(a.last_node), 0)
    assert nat._clock == py._clock
    nat.check_integrity()
    return b.indices


@pytest.mark.parametrize("page", [1, 4])
def test_match_prefix_equals_python(page: int) -> None:
    py, nat = _pair(page)
    keys = [
        CacheKey(np.arange(1, 13, dtype=np.int32)),  # whole
        CacheKey(np.arange(1, 11, dtype=np.int32)),  # splits inside a node
        CacheKey(np.array([1, 2, 3, 4, 70, 71, 99, 99], np.int32)),  # partial, splits
        CacheKey(np.array([1, 2], np.int32)),  # under a page at 4: the clock ticks
        CacheKey(np.array([9, 9, 9, 9], np.int32)),  # no first page
        CacheKey(np.arange(1, 13, dtype=np.int32), ("a", None)),
        CacheKey(np.arange(1, 13, dtype=np.int32), ("b", "s")),  # an unseen namespace
    ]
    for key in keys:
        _same(key, py, nat)


def test_match_prefix_converts_tokens_like_as_tokens() -> None:
    py, nat = _pair(1)
    base = np.arange(1, 13, dtype=np.int32)
    want = _same(CacheKey(base), py, nat).tolist()
    wide = np.zeros(24, dtype=np.int64)
    wide[::2] = base
    for tokens in (base.astype(np.int64), wide[::2], base.astype(">i4"), base.tolist()):
        got = nat.match_prefix(CacheKey(tokens))  # type: ignore[arg-type]
        assert got.indices.tolist() == want and got.device_len == 12
    with pytest.raises(TypeError):
        nat.match_prefix(CacheKey(base.reshape(3, 4)))


def test_match_node_and_touch_prefix_tick_like_python() -> None:
    py, nat = _pair(4)
    key = CacheKey(np.array([1, 2, 3, 4, 70, 71, 72, 73, 5], np.int32))
    a, b = py.match_node(key), nat.match_node(key)
    assert (a.device_len, len(a.indices)) == (b.device_len, len(b.indices)) == (8, 0)
    py.touch_prefix(key)
    nat.touch_prefix(key)
    assert nat._clock == py._clock
    nat.check_integrity()
