"""KV slot allocator: layout, exhaustion, misuse, conservation checks, for the Python allocator
(the reference's) and the native pool (the accelerated core's, ``_native/pool.cpp``): every
test runs on both."""

from __future__ import annotations

import numpy as np
import pytest

from radixsched.cache import IntegrityError, TokenAllocator
from radixsched.native import core


@pytest.fixture(autouse=True, params=["python", "native"])
def allocator_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``native`` rebinds this module's ``TokenAllocator`` to the native pool."""
    if request.param == "native":
        mod = core()
        if mod is None:
            pytest.skip("the native core is not built, or is off")
        monkeypatch.setitem(globals(), "TokenAllocator", mod.Pool)
    return str(request.param)


def test_page1_layout_and_order() -> None:
    a = TokenAllocator(10)
    assert a.total_size == 10 and a.pool_size == 11 and a.available_size() == 10
    x = a.alloc(3)
    assert x is not None and x.dtype == np.int64 and x.tolist() == [1, 2, 3]
    y = a.alloc(2)
    assert y is not None and y.tolist() == [4, 5]
    a.free(x)
    # LIFO: the freed group comes back first, in its original order.
    z = a.alloc(4)
    assert z is not None and z.tolist() == [1, 2, 3, 6]
    assert a.available_size() == 4
    a.check_integrity(request_slots=[y, z])


def test_paged_layout_and_rounding() -> None:
    a = TokenAllocator(18, page_size=4)  # rounded down to 4 whole pages
    assert a.total_size == 16 and a.num_pages == 4 and a.pool_size == 20
    x = a.alloc(8)
    assert x is not None and x.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="multiple of page_size"):
        a.alloc(3)
    with pytest.raises(ValueError):
        a.alloc(-4)
    assert a.alloc(0) is not None and a.alloc(0).size == 0  # type: ignore[union-attr]
    a.free(x[4:])  # the second page alone
    y = a.alloc(4)
    assert y is not None and y.tolist() == [8, 9, 10, 11]
    a.check_integrity(request_slots=np.concatenate([x[:4], y]))


def test_exhaustion_is_never_partial() -> None:
    a = TokenAllocator(8, page_size=2)
    x = a.alloc(6)
    assert x is not None
    assert a.alloc(4) is None
    assert a.available_size() == 2
    y = a.alloc(2)
    assert y is not None and a.available_size() == 0
    assert a.alloc(2) is None
    a.free(np.concatenate([x, y]))
    assert a.available_size() == 8
    a.check_integrity()


def test_free_misuse_raises_and_changes_nothing() -> None:
    a = TokenAllocator(8)
    x = a.alloc(4)
    assert x is not None
    a.free(x[:2])
    with pytest.raises(ValueError, match="double free"):
        a.free(x[:1])
    with pytest.raises(ValueError, match="padding"):
        a.free(np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="out of range"):
        a.free(np.array([9], dtype=np.int64))
    with pytest.raises(ValueError, match="twice in one call"):
        a.free(np.array([3, 3], dtype=np.int64))
    assert a.available_size() == 6
    a.check_integrity(request_slots=x[2:])
    a.free(np.zeros(0, dtype=np.int64))  # no-op


@pytest.mark.parametrize(
    ("bad", "match"),
    [([2, 3, 1], "double free"), ([2, 3, 2], "twice in one call"), ([2, 3, 9], "out of range")],
)
def test_checked_free_refused_past_its_first_pages_changes_nothing(
    bad: list[int], match: str
) -> None:
    """A free refused at a later page leaves the pages before it allocated (the native pool
    checks and places each page in one pass, and undoes the places it wrote)."""
    a = TokenAllocator(8)
    x = a.alloc(4)
    assert x is not None and x.tolist() == [1, 2, 3, 4]
    a.free(x[:1])
    before = a.free_slots().tolist()
    with pytest.raises(ValueError, match=match):
        a.free(np.array(bad, dtype=np.int64))
    assert a.free_slots().tolist() == before
    a.check_integrity(request_slots=x[1:])
    a.free(x[1:3])  # still allocated: freed without complaint
    y = a.alloc(3)
    assert y is not None and y.tolist() == [2, 3, 1]


def test_free_misuse_paged() -> None:
    a = TokenAllocator(16, page_size=4)
    x = a.alloc(8)
    assert x is not None
    with pytest.raises(ValueError, match="whole number of pages"):
        a.free(x[:3])
    with pytest.raises(ValueError, match="page-aligned"):
        a.free(x[1:5])
    with pytest.raises(ValueError, match="page-aligned"):
        a.free(x[[0, 2, 1, 3]])
    with pytest.raises(ValueError, match="padding"):
        a.free(np.arange(4, dtype=np.int64))
    a.free(x)
    with pytest.raises(ValueError, match="double free"):
        a.free(x[4:])
    a.check_integrity()


def test_check_integrity_reports_numbers() -> None:
    a = TokenAllocator(8)
    x = a.alloc(4)
    assert x is not None
    a.check_integrity(cache_slots=x[:2], request_slots=[x[2:3], x[3:]])
    with pytest.raises(IntegrityError, match=r"free 4 \+ cache 2 \+ requests 0 = 6 != total 8"):
        a.check_integrity(cache_slots=x[:2])
    with pytest.raises(IntegrityError, match="1 slot\\(s\\) in two places"):
        a.check_integrity(cache_slots=x, request_slots=[x[:1]])
    with pytest.raises(IntegrityError, match="out of usable range"):
        a.check_integrity(cache_slots=np.array([0, *x[1:]], dtype=np.int64), request_slots=x[:1])


def test_reset_and_repr() -> None:
    a = TokenAllocator(6, page_size=3)
    assert a.alloc(6) is not None and a.available_size() == 0
    a.reset()
    assert a.available_size() == 6
    assert "available=6" in repr(a)
    with pytest.raises(ValueError):
        TokenAllocator(8, page_size=0)
    with pytest.raises(ValueError):
        TokenAllocator(-1)
    empty = TokenAllocator(3, page_size=4)
    assert empty.total_size == 0 and empty.alloc(4) is None


class _RefAllocator:
    """The documented semantics in plain Python: a LIFO list of page ids (top at the end), a
    freed group pushed so its first page comes back first."""

    def __init__(self, size: int, p: int) -> None:
        self.p = p
        self.n = size // p
        self.stack = list(range(self.n, 0, -1))
        self.free = set(self.stack)

    def alloc(self, num_tokens: int) -> list[int] | None:
        k = num_tokens // self.p
        if k > len(self.stack):
            return None
        pages = [self.stack.pop() for _ in range(k)]
        self.free -= set(pages)
        return [pg * self.p + j for pg in pages for j in range(self.p)]

    def release(self, slots: list[int]) -> bool:
        """Free like TokenAllocator.free; False (nothing changed) where it must raise."""
        p = self.p
        if len(slots) % p:
            return False
        groups = [slots[i : i + p] for i in range(0, len(slots), p)]
        if any(g != list(range(g[0], g[0] + p)) or g[0] % p for g in groups):
            return False
        pages = [g[0] // p for g in groups]
        if any(not 1 <= pg <= self.n or pg in self.free for pg in pages):
            return False
        if len(set(pages)) != len(pages):
            return False
        self.stack.extend(reversed(pages))
        self.free |= set(pages)
        return True


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("seed", range(6))
def test_random_ops_match_reference(p: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.choice([8, 40, 200])) * p
    a = TokenAllocator(size, p)
    ref = _RefAllocator(size, p)
    held: list[np.ndarray] = []
    for _ in range(300):
        r = rng.random()
        if r < 0.4:
            n = int(rng.integers(0, 12)) * p
            if rng.random() < 0.5:
                got = a.alloc(n)
            else:  # alloc_into: the same slots, written into the caller's view only
                buf = np.full(n + 2, -1, dtype=np.int64)
                got = buf[1:-1] if a.alloc_into(buf[1:-1]) else None
                assert buf[0] == buf[-1] == -1
                if got is None:
                    assert (buf == -1).all()
            want = ref.alloc(n)
            assert (None if got is None else got.tolist()) == want
            if got is not None and got.size:
                held.append(got)
        elif r < 0.7 and held:
            x = held.pop(int(rng.integers(len(held))))
            if rng.random() < 0.5 and x.size > p:  # free a random subset of whole pages
                pages = x.reshape(-1, p)
                keep = rng.random(len(pages)) < 0.5
                held.append(pages[keep].reshape(-1))
                x = rng.permutation(pages[~keep]).reshape(-1)
            assert ref.release(x.tolist())
            a.free(x)
        elif r < 0.8 and held:
            # recycle == free then alloc: same slots back, same free list afterwards.
            x = held.pop(int(rng.integers(len(held))))
            n = int(rng.integers(0, 2 * x.size // p + 3)) * p
            assert ref.release(x.tolist())
            want = ref.alloc(n)
            if rng.random() < 0.5:
                got = a.recycle(x, n)
            else:
                # recycle_into: x as segments of whole pages (the cache's eviction order),
                # written into a view of a larger buffer.
                cuts = sorted(rng.choice(x.size // p + 1, size=2).tolist())
                segs = [x[: cuts[0] * p], x[cuts[0] * p : cuts[1] * p], x[cuts[1] * p :]]
                buf = np.full(n + 2, -1, dtype=np.int64)
                got = buf[1:-1] if a.recycle_into(segs, buf[1:-1]) else None
                assert buf[0] == buf[-1] == -1
            assert (None if got is None else got.tolist()) == want
            if got is not None and got.size:
                held.append(got)
        else:
            # Misuse: whatever the reference rejects must raise and change nothing.
            pool = [*held, a.free_slots()]
            base = pool[int(rng.integers(len(pool)))]
            kind = int(rng.integers(5))
            if kind == 0:
                bad = np.concatenate([base, base[:p]])
            elif kind == 1:
                bad = np.concatenate([base, a.free_slots()[:p]])
            elif kind == 2:
                bad = base[1 : 1 + p] if base.size > p else base[::-1]
            elif kind == 3:
                start = int(rng.choice([-(2**40), -p, 0, a.pool_size, 2**40]))
                bad = np.arange(start, start + p, dtype=np.int64)
            else:
                bad = np.concatenate([base, base[::-1]])
            expect_ok = ref.release(bad.tolist())
            if expect_ok:
                a.free(bad)
                held = [h[~np.isin(h, bad)] for h in held]
                held = [h for h in held if h.size]
            else:
                before = (a.available_size(), a.free_slots().tolist())
                with pytest.raises(ValueError):
                    a.free(bad)
                assert (a.available_size(), a.free_slots().tolist()) == before
        assert a.available_size() == len(ref.stack) * p
        a.check_integrity(request_slots=held)


def test_free_edge_inputs() -> None:
    a = TokenAllocator(8)
    x = a.alloc(3)
    assert x is not None and x.tolist() == [1, 2, 3]
    # More pages than are allocated, all of them allocated: necessarily a repeat.
    with pytest.raises(ValueError, match="twice in one call"):
        a.free(np.array([1, 2, 3, 1, 2, 3, 1, 2, 3], dtype=np.int64))
    for bad in (-1, -(2**40), 9, 2**40):
        with pytest.raises(ValueError, match=r"padding|out of range"):
            a.free(np.array([bad], dtype=np.int64))
    with pytest.raises(ValueError, match="whole number of pages"):
        a.free(np.array([[1, 2]], dtype=np.int64))
    a.check_integrity(request_slots=x)
    # Other dtypes, lists and strided views are accepted; the argument is neither kept nor
    # modified.
    arg = np.array([3, 0, 1], dtype=np.int32)[::2]
    a.free(arg)
    assert arg.tolist() == [3, 1]
    a.free([2])
    y = a.alloc(3)
    assert y is not None and y.tolist() == [2, 3, 1]


def test_paged_free_order_and_alignment() -> None:
    a = TokenAllocator(32, page_size=4)
    x = a.alloc(16)
    assert x is not None
    a.free(np.concatenate([x[8:12], x[0:4]]))  # pages 3 and 1, in that order
    y = a.alloc(8)
    assert y is not None and y.tolist() == [*x[8:12], *x[0:4]]
    with pytest.raises(ValueError, match="page-aligned"):
        a.free(np.array([5, 6, 7, 8], dtype=np.int64))  # consecutive but not aligned
    with pytest.raises(ValueError, match="page-aligned"):
        a.free(np.array([4, 5, 6, 6], dtype=np.int64))
    a.check_integrity(request_slots=[x[4:8], x[12:16], y])


@pytest.mark.parametrize("p", [1, 4])
def test_unchecked_free_same_state_and_integrity_still_catches_misuse(p: int) -> None:
    a, b = TokenAllocator(64, p), TokenAllocator(64, p)
    xa, xb = a.alloc(8 * p), b.alloc(8 * p)
    assert xa is not None and xb is not None
    a.free(xa[2 * p :])
    b.free(xb[2 * p :], checked=False)
    assert np.array_equal(a.free_slots(), b.free_slots())
    b.check_integrity(request_slots=[xb[: 2 * p]])
    ya, yb = a.alloc(4 * p), b.alloc(4 * p)
    assert ya is not None and yb is not None and np.array_equal(ya, yb)
    # An unchecked double free is not refused, but the conservation check detects it.
    b.free(xb[:p], checked=False)
    b.free(xb[:p], checked=False)
    with pytest.raises(IntegrityError):
        b.check_integrity(request_slots=[xb[p : 2 * p], yb])
