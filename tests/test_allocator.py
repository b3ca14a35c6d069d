"""KV slot allocator: layout, exhaustion, misuse, conservation checks."""

from __future__ import annotations

import numpy as np
import pytest

from radixsched.cache import IntegrityError, TokenAllocator


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
