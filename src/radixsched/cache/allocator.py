"""Page-granular KV slot allocator.

Slot space: ``pool_size = (num_pages + 1) * page_size`` slots. Page 0 (slots ``[0, page_size)``)
is reserved: slot 0 is the padding slot that padded batch positions write to, so it is never
handed out. Usable pages are ``1 .. num_pages`` with ``num_pages = size // page_size``; a ``size``
that is not a multiple of the page size is rounded DOWN to whole pages, so ``total_size`` may be
smaller than the requested ``size``. Page ``k`` is the slots ``k*p .. k*p + p - 1``, in order.

Every usable slot is in exactly one place: free here, held by the radix cache, or owned by a
request; ``check_integrity`` verifies that partition.

Order is deterministic: the free list is a LIFO stack of page ids. Initially pages ``1, 2, 3,
...`` are handed out in that order; afterwards the most recently freed pages are reused first,
and a group freed by one ``free`` call comes back in its original order. The slots of each page
are consecutive.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from radixsched.cache.base import IntegrityError
from radixsched.request import EMPTY_SLOTS, SlotArray

PageArray = npt.NDArray[np.int64]


class TokenAllocator:
    def __init__(self, size: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.page_size = page_size
        self.num_pages = size // page_size
        self.total_size = self.num_pages * page_size
        self.pool_size = (self.num_pages + 1) * page_size  # slots incl. the reserved page 0
        self._page_offsets = np.arange(page_size, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        """Everything free again (the cache and requests must drop their slots too)."""
        n = self.num_pages
        # Stack of free page ids; the top is the end. Pages 1, 2, ... are handed out first.
        self._stack: PageArray = np.arange(n, 0, -1, dtype=np.int64)
        self._top = n
        # _is_free[k] mirrors "page k is on the stack"; page 0 is never free.
        self._is_free = np.zeros(n + 1, dtype=np.bool_)
        self._is_free[1:] = True
        # Scratch for duplicate detection in free(): O(n), no sort.
        self._mark = np.zeros(n + 1, dtype=np.int64)

    # ---- queries ------------------------------------------------------------------------
    def available_size(self) -> int:
        """Free slots (a multiple of page_size)."""
        return self._top * self.page_size

    def free_slots(self) -> SlotArray:
        """Every free slot (for conservation checks; allocates)."""
        return self._pages_to_slots(self._stack[: self._top])

    # ---- alloc / free -------------------------------------------------------------------
    def alloc(self, num_tokens: int) -> SlotArray | None:
        """Slots of ``num_tokens / page_size`` whole pages, or None when not enough are free
        (never a partial allocation)."""
        p = self.page_size
        if num_tokens < 0 or num_tokens % p:
            raise ValueError(
                f"alloc({num_tokens}): must be a non-negative multiple of page_size ({p})"
            )
        k = num_tokens // p
        if k > self._top:
            return None
        if k == 0:
            return EMPTY_SLOTS.copy()
        top = self._top
        pages = self._stack[top - k : top][::-1]
        self._is_free[pages] = False
        self._top = top - k
        return self._pages_to_slots(pages)

    def free(self, slots: SlotArray) -> None:
        """Return whole pages. ``slots`` must be a concatenation of whole pages, each page's
        slots consecutive and in order. Raises ValueError on a malformed group, a reserved or
        out-of-range page, or a double free (nothing is freed then)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        p = self.page_size
        if slots.ndim != 1 or slots.size % p:
            raise ValueError(f"free: {slots.size} slots is not a whole number of pages (p={p})")
        starts = slots[::p]
        pages = starts // p
        if p > 1 and not (
            (starts % p == 0).all()
            and np.array_equal(slots.reshape(-1, p), starts[:, None] + self._page_offsets)
        ):
            raise ValueError(f"free: slots are not page-aligned groups of {p}")
        lo, hi = int(pages.min()), int(pages.max())
        if lo < 1 or hi > self.num_pages:
            what = "the padding page (slot 0)" if lo < 1 else f"page {hi} (out of range)"
            raise ValueError(f"free: refusing to free {what}")
        if self._is_free[pages].any():
            bad = pages[self._is_free[pages]]
            raise ValueError(f"free: double free of {bad.size} page(s), first page {int(bad[0])}")
        order = np.arange(pages.size, dtype=np.int64)
        self._mark[pages] = order
        if not np.array_equal(self._mark[pages], order):
            raise ValueError("free: the same page appears twice in one call")
        self._is_free[pages] = True
        top = self._top
        # Pushed reversed so the group's first page is on top: free(x) then alloc(len(x))
        # hands back x in its original order.
        self._stack[top : top + pages.size] = pages[::-1]
        self._top = top + pages.size

    # ---- conservation ------------------------------------------------------------------
    def check_integrity(
        self,
        *,
        cache_slots: SlotArray = EMPTY_SLOTS,
        request_slots: SlotArray | Sequence[SlotArray] = (),
    ) -> None:
        """free + cache + requests == total, and no slot is in two places (or none)."""
        if isinstance(request_slots, np.ndarray):
            req = request_slots.astype(np.int64, copy=False)
        elif len(request_slots):
            req = np.concatenate([np.asarray(r, dtype=np.int64) for r in request_slots])
        else:
            req = EMPTY_SLOTS
        cache = np.asarray(cache_slots, dtype=np.int64)
        free = self.free_slots()
        stack_pages = self._stack[: self._top]
        if np.count_nonzero(self._is_free) != self._top or not self._is_free[stack_pages].all():
            raise IntegrityError(
                f"allocator free-list corrupt: {self._top} pages on the stack, "
                f"{int(np.count_nonzero(self._is_free))} marked free"
            )
        everything = np.concatenate([free, cache, req])
        n_free, n_cache, n_req = free.size, cache.size, req.size
        if everything.size and (
            everything.min() < self.page_size or everything.max() >= self.pool_size
        ):
            raise IntegrityError(
                f"slot out of usable range [{self.page_size}, {self.pool_size}): "
                f"min {int(everything.min())}, max {int(everything.max())}"
            )
        counts = np.bincount(everything, minlength=self.pool_size)
        dup = int(np.count_nonzero(counts > 1))
        missing = int(np.count_nonzero(counts[self.page_size :] == 0))
        if dup or n_free + n_cache + n_req != self.total_size:
            raise IntegrityError(
                f"KV slot conservation violated: free {n_free} + cache {n_cache} + requests "
                f"{n_req} = {n_free + n_cache + n_req} != total {self.total_size}; "
                f"{dup} slot(s) in two places, {missing} slot(s) unaccounted for"
            )

    # ---- helpers ------------------------------------------------------------------------
    def _pages_to_slots(self, pages: PageArray) -> SlotArray:
        p = self.page_size
        if p == 1:
            return pages.astype(np.int64, copy=True)
        return (pages[:, None] * p + self._page_offsets).reshape(-1)

    def __repr__(self) -> str:
        return (
            f"TokenAllocator(total={self.total_size}, page_size={self.page_size}, "
            f"available={self.available_size()})"
        )
