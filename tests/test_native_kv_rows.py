"""The native KV manager's row buffers (``_native/kv.cpp``): a released request's buffer that
nothing else holds is handed to a later row of a size it fits, and one that something still
holds (a view of it) never is; either way every row holds the reference's slots."""

from __future__ import annotations

import numpy as np
import pytest

from radixsched.cache import RadixCache, TokenAllocator
from radixsched.cache.native_radix import NativeRadixCache, make_pool
from radixsched.fast.kv import FastKVManager
from radixsched.kv import KVManager
from radixsched.native import core
from radixsched.request import Req, SamplingParams

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _twins(size: int = 256) -> tuple[KVManager, FastKVManager]:
    ref_alloc, pool = TokenAllocator(size, 1), make_pool(size, 1)
    return (
        KVManager(RadixCache(ref_alloc), ref_alloc),
        FastKVManager(NativeRadixCache(pool), pool),
    )


def _run(kv: KVManager, rid: str, tokens: list[int]) -> Req:
    """Admit a request (its cached prefix taken), compute its whole fill and cache it."""
    r = Req(rid, np.asarray(tokens, dtype=np.int32), SamplingParams(max_new_tokens=4))
    kv.match_for_admission(r)
    r.lock_node = r.last_node
    kv.cache.inc_lock_ref(r.lock_node)
    kv.take_prefix(r)
    kv.grow([r], [r.fill_len])
    r.kv_len = r.fill_len
    kv.checkpoint(r, r.fill_len)
    return r


def test_a_released_rows_buffer_serves_the_next_row_with_the_references_slots() -> None:
    ref, fast = _twins()
    rows, reused = [], []
    for kv in (ref, fast):
        a = _run(kv, "a", list(range(20)))
        address = a.kv_buf.__array_interface__["data"][0]  # no reference to the buffer kept
        kv.release(a, cache_kv=True)
        b = _run(kv, "b", list(range(12)) + [99] * 8)  # 12 cached, 8 new
        rows.append((b.kv_row.tolist(), b.prefix_len, kv.allocator.available_size()))
        reused.append(b.kv_buf.__array_interface__["data"][0] == address)
        kv.release(b, cache_kv=True)
    assert rows[0] == rows[1]
    assert rows[1][0][:12] == list(range(1, 13))  # the cached prefix's slots
    assert reused[1]  # the native manager's b took a's buffer (the same size: it fits)


def test_a_buffer_still_viewed_is_never_handed_out_again() -> None:
    _, fast = _twins()
    a = _run(fast, "a", list(range(20)))
    held = a.kv_row  # a view of a's buffer outlives the release
    before = held.copy()
    fast.release(a, cache_kv=True)
    b = _run(fast, "b", [7] * 20)  # nothing cached: every slot fresh
    assert not np.shares_memory(held, b.kv_buf)
    assert held.tolist() == before.tolist()  # nobody wrote into it
    assert b.kv_row.tolist() != before.tolist()
