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

``recycle(freed, n)`` is ``free(freed)`` followed by ``alloc(n)`` with the same result and
state, for slots the cache has just evicted for this very allocation.

Representation (chosen so that ``alloc`` and ``free`` are a handful of numpy calls each): the
stack grows downwards, ``_stack[_first_free:]`` are the free pages with the top at
``_stack[_first_free]``, so both a pop and a push are forward copies of a contiguous block.
``_stack_pos[k]`` is ``i + 1`` when page ``k`` is free and sits at ``_stack[i]``, 0 when it is
allocated, and -1 for the reserved page 0 and for the sentinel entry
``_stack_pos[num_pages + 1]``. ``free`` validates with one clipped gather of ``_stack_pos``
(clipping maps every out-of-range page onto a -1 entry, so a nonzero value is a double free, the
reserved page or out of range), writes the new stack positions, and detects a page given twice
in one call by reading them back (the later write wins, so an earlier occurrence reads a
different position).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from radixsched.cache.base import IntegrityError
from radixsched.request import EMPTY_SLOTS, SlotArray

PageArray = npt.NDArray[np.int64]
PosArray = npt.NDArray[np.signedinteger[Any]]  # int32, or int64 for a huge pool


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
        # Positions are 1 .. num_pages: int32 halves the memory the validation gathers touch.
        pos_dtype = np.int32 if self.num_pages < 2**31 - 1 else np.int64
        # _stamps[i] == i + 1: the _stack_pos value of a page at _stack[i] (read-only, sliced).
        self._stamps: PosArray = np.arange(1, self.num_pages + 1, dtype=pos_dtype)
        self._stamps.flags.writeable = False
        self.reset()

    def reset(self) -> None:
        """Everything free again (the cache and requests must drop their slots too)."""
        n = self.num_pages
        # Free pages are _stack[_first_free:], top first; pages 1, 2, ... are handed out first.
        self._stack: PageArray = np.arange(1, n + 1, dtype=np.int64)
        self._first_free = 0
        # Invariant: _stack_pos[_stack[i]] == i + 1 for i >= _first_free; _stack_pos[k] == 0
        # for allocated pages; _stack_pos[0] == _stack_pos[n + 1] == -1 (page 0 and the
        # out-of-range sentinel: never freeable).
        self._stack_pos: PosArray = np.empty(n + 2, dtype=self._stamps.dtype)
        self._stack_pos[0] = self._stack_pos[n + 1] = -1
        self._stack_pos[1 : n + 1] = self._stamps

    # ---- queries ------------------------------------------------------------------------
    def available_size(self) -> int:
        """Free slots (a multiple of page_size)."""
        return (self.num_pages - self._first_free) * self.page_size

    def free_slots(self) -> SlotArray:
        """Every free slot (for conservation checks; allocates)."""
        return self._pages_to_slots(self._stack[self._first_free :][::-1])

    def _whole_pages(self, what: str, n: int) -> int:
        """``n`` tokens in pages; ``what`` (the call) raises unless ``n`` is whole pages, >= 0."""
        p = self.page_size
        if n < 0 or n % p:
            raise ValueError(f"{what}({n}): must be a non-negative multiple of page_size ({p})")
        return n // p

    # ---- alloc / free -------------------------------------------------------------------
    def alloc(self, num_tokens: int) -> SlotArray | None:
        """Slots of ``num_tokens / page_size`` whole pages, or None when not enough are free
        (never a partial allocation). The returned array is new (the caller owns it)."""
        p = self.page_size
        k = self._whole_pages("alloc", num_tokens)
        lo = self._first_free
        if k > self.num_pages - lo:
            return None
        if k == 0:
            return EMPTY_SLOTS.copy()
        self._first_free = lo + k
        if p == 1:
            slots = self._stack[lo : lo + k].copy()
            self._stack_pos[slots] = 0
            return slots
        pages = self._stack[lo : lo + k]
        self._stack_pos[pages] = 0
        return (pages[:, None] * p + self._page_offsets).reshape(-1)

    def alloc_into(self, out: SlotArray) -> bool:
        """``alloc(len(out))`` written into ``out`` (an int64 view the caller owns) instead of a
        new array; False, with nothing allocated and ``out`` untouched, when not enough are
        free."""
        p = self.page_size
        k = self._whole_pages("alloc", len(out))
        lo = self._first_free
        if k > self.num_pages - lo:
            return False
        if k == 0:
            return True
        self._first_free = lo + k
        pages = self._stack[lo : lo + k]
        self._stack_pos[pages] = 0
        if p == 1:
            out[:] = pages
        else:
            out[:] = (pages[:, None] * p + self._page_offsets).reshape(-1)
        return True

    def recycle_into(self, freed: Sequence[SlotArray], out: SlotArray) -> bool:
        """``recycle(concatenation of freed, len(out))`` written into ``out`` (an int64 view
        the caller owns), without building the concatenation: the same slots in ``out`` and
        the same state afterwards. ``freed``: segments of whole pages, just reclaimed from the
        cache. False (``freed`` all freed, as a free followed by a failed alloc) when not
        enough are free."""
        p = self.page_size
        n = len(out)
        self._whole_pages("alloc", n)
        g = 0
        for seg in freed:
            if len(seg) % p:
                raise ValueError(f"free: {len(seg)} slots is not a whole number of pages (p={p})")
            g += len(seg)
        if n > g and (n - g) // p > self.num_pages - self._first_free:
            if g:
                self.free(np.concatenate(freed) if len(freed) > 1 else freed[0], checked=False)
            return False
        pos = 0
        for i, seg in enumerate(freed):
            take = min(len(seg), n - pos)
            out[pos : pos + take] = seg[:take]
            pos += take
            if take < len(seg):
                # The excess, freed as one group: what freeing everything and allocating
                # ``n`` leaves on the stack.
                rest = [seg[take:], *freed[i + 1 :]]
                self.free(np.concatenate(rest) if len(rest) > 1 else rest[0], checked=False)
                return True
        if pos < n:
            ok = self.alloc_into(out[pos:])
            assert ok
        return True

    def recycle(self, freed: SlotArray | Sequence[SlotArray], num_tokens: int) -> SlotArray | None:
        """``free(freed, checked=False)`` then ``alloc(num_tokens)`` in one step, with the same
        result and the same state afterwards: the allocation takes ``freed``'s pages first (the
        top of the stack after that free), and those never pass through the free list. For
        slots just reclaimed from the cache (``evict_reclaim``: an array or its segments),
        which the caller owns. None when not enough are free."""
        self._whole_pages("alloc", num_tokens)
        parts = [freed] if isinstance(freed, np.ndarray) else list(freed)
        out = np.empty(num_tokens, dtype=np.int64)
        return out if self.recycle_into(parts, out) else None

    def free(self, slots: SlotArray, *, checked: bool = True) -> None:
        """Return whole pages. ``slots`` must be a concatenation of whole pages, each page's
        slots consecutive and in order. Raises ValueError on a malformed group, a reserved or
        out-of-range page, or a double free (nothing is freed then). ``slots`` is only read,
        never kept: the caller may reuse or mutate it afterwards.

        ``checked=False`` skips the range and double-free checks (about half the cost of a
        large free): for slots the caller's own bookkeeping proves allocated, such as a radix
        node's value on eviction. A violation then corrupts the free list silently until the
        next ``check_integrity``, which still detects it (tests run it after every step)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        p = self.page_size
        if slots.ndim != 1 or slots.size % p:
            raise ValueError(f"free: {slots.size} slots is not a whole number of pages (p={p})")
        if p == 1:
            pages = slots
        else:
            groups = slots.reshape(-1, p)
            pages = groups[:, 0] // p
            # Row g must be exactly page g's slots: this also rejects an unaligned first slot.
            if checked and np.count_nonzero(groups != (pages * p)[:, None] + self._page_offsets):
                raise ValueError(f"free: slots are not page-aligned groups of {p}")
        k = pages.size
        pos = self._stack_pos
        # Clipping sends pages < 0 to _stack_pos[0] and pages > num_pages to
        # _stack_pos[num_pages + 1] (both -1): any nonzero entry is out of range, the reserved
        # page or a free page.
        if checked and np.count_nonzero(pos.take(pages, mode="clip")):
            self._reject(pages)
        lo = self._first_free - k
        if lo < 0:  # more pages than are allocated, all of them allocated: a repeat
            raise ValueError("free: the same page appears twice in one call")
        stamps = self._stamps[lo : lo + k]
        pos[pages] = stamps
        # A page given twice kept only its later position: the earlier occurrence differs.
        if checked and k > 1 and np.count_nonzero(pos.take(pages, mode="clip") != stamps):
            pos[pages] = 0  # every page was allocated (checked above): undo exactly
            raise ValueError("free: the same page appears twice in one call")
        self._stack[lo : lo + k] = pages
        self._first_free = lo

    def _reject(self, pages: PageArray) -> NoReturn:
        """Raise the ValueError for a ``free`` of ``pages`` that failed a fast check, with the
        message of the first failing check in order: range, then double free."""
        lo, hi = int(pages.min()), int(pages.max())
        if lo < 1 or hi > self.num_pages:
            what = "the padding page (slot 0)" if lo < 1 else f"page {hi} (out of range)"
            raise ValueError(f"free: refusing to free {what}")
        is_free = self._stack_pos[pages] > 0
        bad = pages[is_free]
        raise ValueError(f"free: double free of {bad.size} page(s), first page {int(bad[0])}")

    # ---- conservation ------------------------------------------------------------------
    def check_integrity(
        self,
        *,
        cache_slots: SlotArray = EMPTY_SLOTS,
        request_slots: SlotArray | Sequence[SlotArray] = (),
    ) -> None:
        """free + cache + requests == total, and no slot is in two places (or none)."""
        lo = self._first_free
        n_stack = self.num_pages - lo
        n_marked = int(np.count_nonzero(self._stack_pos[1:-1] > 0))
        if (
            n_marked != n_stack
            or self._stack_pos[0] != -1
            or self._stack_pos[-1] != -1
            or not np.array_equal(self._stack_pos[self._stack[lo:]], self._stamps[lo:])
        ):
            raise IntegrityError(
                f"allocator free-list corrupt: {n_stack} pages on the stack, {n_marked} marked free"
            )
        check_conservation(
            self.free_slots(),
            cache_slots,
            request_slots,
            self.page_size,
            self.pool_size,
            self.total_size,
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


def check_conservation(
    free: SlotArray,
    cache_slots: SlotArray | None,
    request_slots: SlotArray | Sequence[SlotArray],
    page_size: int,
    pool_size: int,
    total_size: int,
) -> None:
    """free + cache + requests == total, and no slot is in two places (or none): the check of
    ``TokenAllocator`` and of the native pool (``radixsched._native``'s ``Pool``)."""
    if isinstance(request_slots, np.ndarray):
        req = request_slots.astype(np.int64, copy=False)
    elif len(request_slots):
        req = np.concatenate([np.asarray(r, dtype=np.int64) for r in request_slots])
    else:
        req = EMPTY_SLOTS
    cache = EMPTY_SLOTS if cache_slots is None else np.asarray(cache_slots, dtype=np.int64)
    everything = np.concatenate([free, cache, req])
    n_free, n_cache, n_req = free.size, cache.size, req.size
    if everything.size and (everything.min() < page_size or everything.max() >= pool_size):
        raise IntegrityError(
            f"slot out of usable range [{page_size}, {pool_size}): "
            f"min {int(everything.min())}, max {int(everything.max())}"
        )
    counts = np.bincount(everything, minlength=pool_size)
    dup = int(np.count_nonzero(counts > 1))
    missing = int(np.count_nonzero(counts[page_size:] == 0))
    if dup or n_free + n_cache + n_req != total_size:
        raise IntegrityError(
            f"KV slot conservation violated: free {n_free} + cache {n_cache} + requests "
            f"{n_req} = {n_free + n_cache + n_req} != total {total_size}; "
            f"{dup} slot(s) in two places, {missing} slot(s) unaccounted for"
        )
