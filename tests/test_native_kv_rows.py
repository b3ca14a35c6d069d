"""The native KV manager's row buffers (``_native/kv.cpp``): a released request's buffer that
nothing else holds is handed to a later row of a size it fits, and one that something still
holds (a view of it) never is; either way every row holds the reference's slots."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.cache import RadixCache, TokenAllocator
from radixsched.kv import KVManager
from radixsched.native import core
from radixsched.native.kv import NativeKVManager
from radixsched.native.radix import NativeRadixCache, make_pool
from radixsched.request import Req, SamplingParams

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _twins(size: int = 256) -> tuple[KVManager, NativeKVManager]:
    ref_alloc, pool = TokenAllocator(size, 1), make_pool(size, 1)
    return (
        KVManager(RadixCache(ref_alloc), ref_alloc),
        NativeKVManager(NativeRadixCache(pool), pool),
    )


def _run(kv: KVManager, rid: str, tokens: list[int], max_new: int = 4) -> Req:
    """Admit a request (its cached prefix taken), compute its whole fill and cache it."""
    r = Req(rid, np.asarray(tokens, dtype=np.int32), SamplingParams(max_new_tokens=max_new))
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
        # A buffer of 20 + 400 + 64 slots: a's 20 cached ones are too few of it for its leaf
        # to share it (SlotVec::kShareFraction), so nothing else holds it once a is released.
        a = _run(kv, "a", list(range(20)), max_new=400)
        address = a.kv_buf.__array_interface__["data"][0]  # no reference to the buffer kept
        kv.release(a, cache_kv=True)
        b = _run(kv, "b", list(range(12)) + [99] * 8, max_new=400)  # 12 cached, 8 new
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


# ---- the rows' dtype (int32, as the pool's and the tree's slots) -------------------------------
def test_rows_the_native_core_makes_are_int32_with_the_references_slots() -> None:
    ref, fast = _twins()
    rows = []
    for kv in (ref, fast):
        a = _run(kv, "a", list(range(20)))
        b = _run(kv, "b", list(range(12)) + [99] * 8)  # its prefix taken from the tree
        kv.grow([a, b], [a.fill_len + 30, b.fill_len + 90])  # b moves to a bigger buffer
        entry = kv.extend_entry(b, b.prefix_len, b.prefix_len)
        rows.append([r.kv_row.tolist() for r in (a, b)] + [kv.alloc(3).tolist()])
        want = np.int64 if kv is ref else np.int32
        for arr in (a.kv_row, a.kv_buf, b.kv_row, b.kv_buf, entry.prefix_slots, kv.alloc(1)):
            assert arr.dtype == want
    assert rows[0] == rows[1]


def test_a_row_made_elsewhere_as_int64_is_read_grown_and_freed_as_the_references() -> None:
    ref, fast = _twins()
    got = []
    for kv in (ref, fast):
        r = Req("w", np.arange(30, dtype=np.int32), SamplingParams(max_new_tokens=4))
        kv.match_for_admission(r)
        r.kv_buf = np.zeros(64, dtype=np.int64)  # room for the grow: written in place
        r.kv_row = r.kv_buf[:0]
        kv.grow([r], [10])
        r.kv_len = 10
        kv.checkpoint(r, 10)  # from an int64 row into the tree
        kv.grow([r], [100])  # past its buffer: moved to one of the manager's dtype
        got.append((r.kv_row.tolist(), r.kv_buf.dtype == kv.row_dtype))
        kv.release(r, cache_kv=False)
        got.append((kv.allocator.free_slots().tolist(), kv.cache.evictable_size()))
    assert got[0] == got[2] and got[1] == got[3] and got[0][1]


def test_an_int64_rows_slot_outside_int32_is_refused_as_it_moves_to_an_int32_row() -> None:
    _, fast = _twins()
    r = Req("x", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=4))
    r.kv_buf = np.array([1, 2**31, 3, 4], dtype=np.int64)
    r.kv_row = r.kv_buf
    free = fast.allocator.available_size()
    with pytest.raises(ValueError, match="int32"):
        fast.grow([r], [8])
    assert fast.allocator.available_size() == free  # refused before anything was taken


def test_a_pool_whose_slots_pass_int32_gets_int64_rows_and_refuses_int32_ones() -> None:
    size, page = 2**32, 2**20  # 4096 pages: slots up to 2**32 + 2**20 - 1
    ref_alloc, pool = TokenAllocator(size, page), make_pool(size, page)
    ref = KVManager(RadixCache(ref_alloc, page_size=page), ref_alloc)
    fast = NativeKVManager(NativeRadixCache(pool, page_size=page), pool)
    assert fast.native.wide_rows and fast.row_dtype == np.int64
    assert not _twins()[1].native.wide_rows
    rows = []
    for kv in (ref, fast):
        r = _run(kv, "big", list(range(40)))
        assert r.kv_row.dtype == np.int64 and kv.alloc(page).dtype == np.int64
        rows.append((r.kv_row[:3].tolist(), len(r.kv_row), kv.allocator.available_size()))
    assert rows[0] == rows[1]
    r = Req("narrow", np.arange(8, dtype=np.int32), SamplingParams(max_new_tokens=4))
    r.kv_buf = np.empty(2 * page, dtype=np.int32)  # an int32 row made elsewhere
    r.kv_row = r.kv_buf[:0]
    free = pool.available_size()
    with pytest.raises(ValueError, match="int32"):
        fast.grow([r], [8])
    assert pool.available_size() == free


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_decode_settle_claims_slots_straight_into_each_row(dtype: type) -> None:
    """``DecodeBatch.settle`` appends each row's claimed slots in its buffer (in place when it
    has room, whatever its dtype; an empty or full one moves to a new int32 buffer)."""
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner
    from radixsched.sim.simulate import SimConfig

    mod = core()
    assert mod is not None
    runner = CostModelRunner(build_cost_model(SimConfig()))
    pool, twin = make_pool(1000, 1), make_pool(1000, 1)
    sampling = SamplingParams(max_new_tokens=9, ignore_eos=True)
    roomy, empty, full = (Req(k, np.arange(5, dtype=np.int32), sampling) for k in "abc")
    for r, cap in ((roomy, 64), (full, 5)):
        r.kv_buf = np.asarray(twin.alloc(5), dtype=dtype)
        r.kv_buf = np.concatenate([r.kv_buf, np.zeros(cap - 5, dtype)])
        r.kv_row = r.kv_buf[:5]
    pool.alloc(10)  # the two rows' slots, taken from the pool as from the twin
    roomy_buf = roomy.kv_buf
    b = mod.DecodeBatch(False)
    b.extend([roomy, empty, full])
    res = b.jump(True, 1000, 1, 0.0, None, runner.native_decode_cost(), pool, print, 0.0, 0.0)
    assert res is not None and res[0] == 9
    b.settle([0, 1, 2], runner.tokens_at, runner.native_tokens(), pool)
    owed = [13 - 5, 13, 13 - 5]
    for r, n in zip((roomy, empty, full), owed, strict=True):
        twin.reserve(n)
        want = twin.claim(n).tolist()
        assert r.kv_row[len(r.kv_row) - n :].tolist() == want and len(r.kv_row) == 13
    assert roomy.kv_buf is roomy_buf and np.shares_memory(roomy.kv_row, roomy_buf)
    assert empty.kv_buf.dtype == np.int32 and full.kv_buf.dtype == np.int32
    assert len(full.kv_buf) == 64 and full.kv_row[:5].tolist() == list(range(6, 11))


@pytest.mark.parametrize("p", [1, 4])
def test_an_int32_allocation_that_evicts_equals_the_int64_one(p: int) -> None:
    """``KV.alloc`` (an int32 array: the tree's evicted slots copied straight into it, the
    rest from the pool; through whole segments when short or misaligned) against the tree's
    int64 ``alloc_into``: the same slots, free list and tree, and the same failures."""
    from radixsched.cache.base import CacheKey, IntegrityError

    rng = np.random.default_rng(11 + p)
    sides = []
    for _ in range(2):
        pool = make_pool(48 * p, p)
        sides.append((NativeKVManager(NativeRadixCache(pool, p), pool), pool))
    fails = shorts = 0
    for _ in range(150):
        seq = np.asarray(rng.integers(0, 3, size=int(rng.integers(1, 10)) * p), dtype=np.int32)
        for kv, pool in sides:
            kv.cache.evict(len(seq) - pool.available_size())
            if pool.available_size() >= len(seq):
                slots = pool.alloc(len(seq))
                res = kv.cache.insert(CacheKey(seq), slots, 0)
                if res.prefix_len:
                    pool.free(slots[: res.prefix_len])
        n = int(rng.integers(1, 30)) * p + (p > 1 and rng.random() < 0.1)  # some misaligned
        shorts += n > sides[0][1].available_size()
        out = np.full(n, -1, dtype=np.int64)
        try:
            ok_b = sides[1][0].cache.tree.alloc_into(sides[1][1], out)
        except ValueError:
            ok_b = None
        try:
            got = sides[0][0].alloc(n)
            assert got.dtype == np.int32
            ok_a = True
        except IntegrityError:
            ok_a = False
        except ValueError:
            ok_a = None
        assert ok_a == ok_b
        if ok_a:
            assert got.tolist() == out.tolist()
        else:
            fails += ok_a is False
        (a, apool), (b, bpool) = sides
        assert apool.free_slots().tolist() == bpool.free_slots().tolist()
        assert a.cache.tree.all_values().tolist() == b.cache.tree.all_values().tolist()
        if ok_a and rng.random() < 0.7:
            apool.free(got)
            bpool.free(out)
    assert fails > 3 and shorts > 20


def test_rows_are_int32_exactly_while_every_slot_of_the_pool_fits_int32() -> None:
    page = 2**20
    for pages, wide in ((2047, False), (2048, True)):  # the last slot: 2**31 - 1, then 2**31 + ...
        pool = make_pool(pages * page, page)
        assert pool.pool_size - 1 == (pages + 1) * page - 1
        kv = NativeKVManager(NativeRadixCache(pool, page_size=page), pool)
        assert kv.native.wide_rows == wide
        assert kv.row_dtype == (np.int64 if wide else np.int32)


def test_decode_settle_on_a_pool_past_int32_makes_int64_rows_and_refuses_int32_ones() -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner
    from radixsched.sim.simulate import SimConfig

    mod = core()
    assert mod is not None
    page = 2**20
    runner = CostModelRunner(build_cost_model(SimConfig()))
    sampling = SamplingParams(max_new_tokens=3, ignore_eos=True)
    for given in (None, np.int32):
        pool = make_pool(4096 * page, page)
        r = Req("w", np.arange(5, dtype=np.int32), sampling)
        if given is not None:  # an int32 row made elsewhere, with room for a page
            r.kv_buf = np.empty(page + 8, dtype=given)
            r.kv_row = r.kv_buf[:0]
        b = mod.DecodeBatch(False)
        b.extend([r])
        args = (runner.native_decode_cost(), pool, print, 0.0, 0.0)
        res = b.jump(True, 10 * page, page, 0.0, None, *args)
        assert res is not None and res[0] == 3 and pool.reserved_size() == page
        if given is None:
            b.settle([0], runner.tokens_at, runner.native_tokens(), pool)
            assert r.kv_buf.dtype == np.int64 and len(r.kv_row) == page
            assert r.kv_row[[0, -1]].tolist() == [page, 2 * page - 1]  # page 1's slots
        else:
            with pytest.raises(ValueError, match="int32"):
                b.settle([0], runner.tokens_at, runner.native_tokens(), pool)
            assert pool.reserved_size() == page and len(r.kv_row) == 0  # nothing claimed


# ---- a checkpoint's leaf views the request's row buffer (radix.hpp's SlotVec) ------------------
def _leaf(kv: NativeKVManager, r: Req) -> object:
    node = r.last_node
    assert node is not None and not node.children
    return node


def test_a_checkpoints_leaf_views_the_rows_buffer_which_is_never_handed_out_again() -> None:
    """The leaf a checkpoint inserts holds a view of the request's buffer (its slots not
    copied): that buffer is not handed to a later row while the leaf lives, and the later
    rows' writes never reach the leaf's slots; the tree's slots stay the reference's."""
    ref, fast = _twins()
    got = []
    for kv in (ref, fast):
        a = _run(kv, "a", list(range(40)))  # 40 of 40 + 4 + 64 slots: viewed, not copied
        if kv is fast:
            leaf: Any = _leaf(fast, a)
            assert leaf.value_block == len(a.kv_buf) > len(leaf) == 40
            address = a.kv_buf.__array_interface__["data"][0]
        kv.release(a, cache_kv=True)
        b = _run(kv, "b", [7] * 40)  # nothing cached: a buffer of the same size, all fresh
        if kv is fast:
            assert b.kv_buf.__array_interface__["data"][0] != address
            assert leaf.value.tolist() == list(range(1, 41))  # b's row wrote elsewhere
        got.append((a.kv_row.tolist(), b.kv_row.tolist(), sorted(kv.cache.all_values().tolist())))
        kv.release(b, cache_kv=True)
        got.append(kv.cache.evict(80))
    assert got[0] == got[2] and got[1] == got[3]


def test_a_short_leaf_copies_its_slots_and_a_split_views_or_copies_by_length() -> None:
    """A leaf holding less than 1/16 of its row's buffer copies its slots (the buffer is then
    free to serve the next row); the parts of a split view the block or copy by the same
    rule; their slots are the reference's either way."""
    ref, fast = _twins(1024)
    for kv in (ref, fast):
        a = _run(kv, "a", list(range(20)), max_new=400)  # 20 of 484: copied
        if kv is fast:
            assert _leaf(fast, a).value_block == 20
        c = _run(kv, "c", list(range(100, 180)))  # 80 of 148: viewed
        d = _run(kv, "d", list(range(100, 104)) + [5] * 76)  # splits c's leaf at 4
        if kv is fast:
            upper = d.last_node.parent
            assert len(upper) == 4 and upper.value_block == 4  # 4 of 148: copied out
            lower = next(iter(upper.children.values()))
            assert lower.value_block == len(c.kv_buf)  # 76 of 148: still a view
        for r in (a, c, d):
            kv.release(r, cache_kv=True)
    assert sorted(ref.cache.all_values().tolist()) == sorted(fast.cache.all_values().tolist())
    assert ref.cache.evict(1024) == fast.cache.evict(1024)


def test_long_runs_of_slots_reach_rows_as_the_references() -> None:
    """Long runs of slots copied into rows: a cached prefix from one node (b's 1030) and from
    two (c's 2532), a whole leaf evicted into a row then a leaf's tail after it (d's 701, then
    1436 of 1502); every row and the free list are the reference's."""
    ref, fast = _twins(4096)
    got = []
    for kv in (ref, fast):
        rows = []
        head, mid, tail = list(range(1030)), list(range(5000, 6502)), list(range(7000, 7701))
        for rid, toks in (("a", head), ("b", head + mid), ("c", head + mid + tail)):
            r = _run(kv, rid, toks)
            rows.append(r.kv_row.tolist())
            kv.release(r, cache_kv=True)
        assert kv.allocator.available_size() == 4096 - 3233
        d = _run(kv, "d", list(range(10_000, 13_000)))  # evicts the 701 leaf, then 1436 of 1502
        rows.append(d.kv_row.tolist())
        got.append((rows, kv.allocator.free_slots().tolist(), kv.cache.evictable_size()))
    assert got[0] == got[1]
    a, b, c, d = got[1][0]
    assert b[:1030] == a and c[:2532] == b  # the cached prefixes' slots, from both nodes
    assert d[:701] == c[2532:] and d[701:2137] == b[1030 + 66 :]  # the evicted leaf, the tail


class _Buf(np.ndarray):
    """A row buffer of an ndarray subclass: the native manager slices it as numpy does."""


def _entry_parts(kv: KVManager, r: Req) -> list[Any]:
    kv.match_for_admission(r)
    r.lock_node = r.last_node
    kv.cache.inc_lock_ref(r.lock_node)
    kv.take_prefix(r)
    e = kv.extend_entry(r, r.prefix_len, r.fill_len)
    parts = [r.kv_row, e.new_token_ids, e.prefix_slots, e.new_slots]
    flags = ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA", "ALIGNED")
    return [
        (type(a), a.tolist(), a.flags.writeable, [a.flags[f] for f in flags]) for a in parts
    ] + [r.kv_buf]


def test_rows_and_an_entrys_views_are_numpys_slices_of_their_arrays() -> None:
    """The views the native manager makes of a row's buffer, its row and a prompt (``kv.cpp``
    ``array_slice``, through numpy's C API) are what slicing makes: the same type, slots,
    writeability (a read-only prompt's tokens stay read-only) and flags (contiguous, aligned,
    not owning their data), each a view of the array itself (its base: the buffer, or the
    buffer under a row); a buffer that is not an exact numpy array (a subclass) is sliced, as
    the reference slices it."""
    ref, fast = _twins()
    prompt = np.arange(40, dtype=np.int32)
    prompt.flags.writeable = False
    got = []
    for kv in (ref, fast):
        _run(kv, "a", list(range(24)))
        r = Req("b", prompt, SamplingParams(max_new_tokens=4))
        parts = _entry_parts(kv, r)
        row, buf = r.kv_row, parts[-1]
        assert row.base is buf and np.shares_memory(row, buf)
        e = kv.extend_entry(r, 30, 40)
        assert e.new_slots.base is buf and e.new_token_ids.base is prompt
        assert e.new_slots.tolist() == buf[30:40].tolist() and e.new_token_ids[0] == 30
        sub = Req("c", np.arange(100, 108, dtype=np.int32), SamplingParams(max_new_tokens=4))
        sub.kv_buf = np.zeros(64, dtype=kv.row_dtype).view(_Buf)
        sub.kv_row = sub.kv_buf[:0]
        kv.grow([sub], [8])
        got.append((parts[:-1], type(sub.kv_row), sub.kv_row.tolist(), sub.kv_row.base))
    assert got[0][:3] == got[1][:3]
    assert [p[2] for p in got[1][0]] == [True, False, True, True]  # the prompt's: read-only
    assert got[1][1] is _Buf and got[1][3] is not None


def _checkpointed(kv: Any, prompt: Any, outputs: list[Any]) -> tuple[Any, ...]:
    """A request of ``prompt`` with ``outputs`` past it checkpointed whole by ``kv``: its row,
    protected length and the cache's evictable size."""
    r = Req("w", prompt, SamplingParams(max_new_tokens=40))
    r.output_ids = list(outputs)
    kv.match_for_admission(r)
    kv.take_prefix(r)
    kv.grow([r], [r.fill_len])
    r.kv_len = r.fill_len
    kv.checkpoint(r, r.fill_len)
    return (r.kv_row.tolist(), r.cache_protected_len, kv.cache.evictable_size())


@pytest.mark.parametrize("layout", ["int32", "int64", "strided", "swapped"])
def test_a_checkpoint_reads_any_prompt_and_its_outputs_as_the_reference(layout: str) -> None:
    """The prompt is read in place where it is a plain int32 array, else as nanobind casts it;
    the outputs past it (many: read ahead) follow. The tree holds what the reference's holds."""
    ref, fast = _twins()
    got = []
    for kv in (ref, fast):
        base = np.arange(60, dtype=np.int32)
        prompt: Any = {
            "int32": base[:30].copy(),
            "int64": base[:30].astype(np.int64),
            "strided": base[::2],
            "swapped": base[:30].astype(">i4"),
        }[layout]
        got.append(_checkpointed(kv, prompt, list(range(1000, 1040))))
        q = _run(kv, "q", np.asarray(prompt).tolist() + list(range(1000, 1040)) + [7])
        got.append((q.prefix_len, q.kv_row.tolist()))
    assert got[0] == got[2] and got[1] == got[3]
    assert got[3][1][:70] == got[2][0][:70]  # q's 70 tokens were the cache's hit


@pytest.mark.parametrize(
    "outputs",
    [
        [0, -5, 2**30 - 1, 2**30, 2**31 - 1, -(2**30), -(2**31), 12] * 3,
        [True, np.int64(7), 3, np.int32(2**30 + 5), False] * 4,
    ],
)
def test_a_checkpoints_output_ids_are_read_as_the_reference_reads_them(outputs: list[Any]) -> None:
    """Output ids past the prompt enter the key as the reference's: ints of one digit (read in
    place), of two digits, negative ones, and ints that are not exact ints (read by a cast)."""
    ref, fast = _twins()
    got = []
    for kv in (ref, fast):
        got.append(_checkpointed(kv, np.arange(10, dtype=np.int32), outputs))
        tail = [int(t) for t in outputs]
        q = _run(kv, "q", list(range(10)) + tail[:-1] + [tail[-1] + 1, 7])
        got.append((q.prefix_len, q.kv_row.tolist()))
    assert got[0] == got[2] and got[1] == got[3]
    hit = 10 + len(outputs) - 1  # every output id but the last: the cache's slots
    assert got[3][1][:hit] == got[2][0][:hit]
