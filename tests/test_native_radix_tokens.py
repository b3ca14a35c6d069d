"""The native ``match_prefix`` (``Tree.match_key``) reads a plain int32 array in place through
numpy's C API and every other token sequence through the buffer protocol or a converted copy:
each kind of input gives what the Python tree gives (slots, length, node, clock), and the
instance's bound ``match_prefix`` is the native call unless a subclass overrides it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


class _Sub(np.ndarray):  # an ndarray subclass: not read through the in-place path
    pass


# Views of the same tokens: the in-place path (plain contiguous int32) and every fallback.
VIEWS: dict[str, Callable[[np.ndarray], Any]] = {
    "int32": lambda a: a.copy(),
    "readonly": lambda a: _readonly(a),
    "offset slice": lambda a: np.concatenate([[7], a]).astype(np.int32)[1:],
    "strided": lambda a: np.repeat(a, 2)[::2],
    "int64": lambda a: a.astype(np.int64),
    "big-endian": lambda a: a.astype(">i4"),
    "subclass": lambda a: a.copy().view(_Sub),
    "column": lambda a: a.reshape(-1, 1)[:, 0],
}


def _readonly(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


def _match(cache: Any, key: CacheKey) -> tuple[list[int], int, int]:
    m = cache.match_prefix(key)
    return (np.asarray(m.indices).tolist(), m.device_len, m.last_node.id)


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("view", list(VIEWS))
def test_every_token_input_matches_as_the_python_tree(page: int, view: str) -> None:
    from radixsched.native.radix import NativeRadixCache

    caches = []
    for cls in (RadixCache, NativeRadixCache):
        alloc = TokenAllocator(1_000, page)
        cache = cls(alloc, page, "lru")
        for body in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 12):
            slots = alloc.alloc(len(body) - len(body) % page)
            assert slots is not None
            cache.insert(CacheKey(np.array(body, dtype=np.int32)), slots)
        caches.append(cache)
    py, nat = caches
    queries = [[1, 2, 3, 4, 5, 6, 7, 8, 1], [1, 2, 3, 4, 9, 9], [5] * 13, [1, 2], [8, 8], []]
    for q in queries:
        key = CacheKey(VIEWS[view](np.array(q, dtype=np.int32)))
        assert _match(py, key) == _match(nat, key), (view, q)
        assert py._clock == nat.tree.clock
    nat.check_integrity()


def test_match_prefix_is_the_native_call_unless_overridden() -> None:
    from radixsched.native.radix import NativeRadixCache

    calls: list[CacheKey] = []

    class Counting(NativeRadixCache):
        def match_prefix(self, key: CacheKey) -> Any:
            calls.append(key)
            return super().match_prefix(key)

    plain = NativeRadixCache(TokenAllocator(100, 1), 1, "lru")
    assert plain.__dict__["match_prefix"] is plain._match  # the bound Tree.match_key
    counting = Counting(TokenAllocator(100, 1), 1, "lru")
    assert "match_prefix" not in counting.__dict__
    key = CacheKey(np.arange(4, dtype=np.int32))
    assert counting.match_prefix(key).device_len == 0
    assert calls == [key]
