"""``FastKVManager``: the reference KV ownership (``radixsched.kv``) over the native tree and
the native slot pool, each hot move one native call (``radixsched/_native/kv.cpp``), the same
slots in the same places.

- Allocating evicts to the pool's shortfall and hands the evicted slots straight to the
  allocation (the same slots and free list as freeing, then allocating); a request's slots
  are written straight into its row.
- A checkpoint inserts only the key past the request's locked node (the path above it is the
  request's own prefix), and re-matches from the root only when some of the key was cached
  before: then the request's copies are freed and its row points at the cache's.
"""

from __future__ import annotations

import numpy as np

from radixsched.cache.base import IntegrityError
from radixsched.cache.native_radix import NativeRadixCache, as_tokens
from radixsched.kv import KVManager, ceil_page, floor_page
from radixsched.native import namespace_id
from radixsched.request import Req, SlotArray


class FastKVManager(KVManager):
    cache: NativeRadixCache

    def _alloc_into(self, out: SlotArray) -> None:
        if not self.cache.tree.alloc_into(self.allocator, out):
            n = len(out)
            raise IntegrityError(
                f"KV allocation of {n} slots failed: available {self.allocator.available_size()}"
                f", evictable {self.cache.evictable_size()} (the admission budget was violated)"
            )

    def alloc(self, n: int) -> SlotArray:
        out = np.empty(n, dtype=np.int64)
        self._alloc_into(out)
        return out

    def grow(self, reqs: list[Req], ends: list[int]) -> None:
        if len(reqs) != 1:
            super().grow(reqs, ends)
            return
        r = reqs[0]
        have, new_len = len(r.kv_row), ceil_page(ends[0], self.page)
        if new_len <= have:
            return
        if len(r.kv_buf) < new_len:
            buf = np.empty(2 * new_len, dtype=np.int64)
            buf[:have] = r.kv_row
            r.kv_buf = buf
        self._alloc_into(r.kv_buf[have:new_len])
        r.kv_row = r.kv_buf[:new_len]

    def checkpoint(self, req: Req, up_to: int) -> None:
        aligned = floor_page(min(up_to, req.kv_len), self.page)
        lo = req.cache_protected_len
        if self.cache.disabled or aligned <= lo:
            req.prefix_len = up_to
            return
        lock = req.lock_node
        # The key from the lock's depth (lo; the root's is 0), or whole without a lock.
        start = lo if lock is not None else 0
        node = self.cache.tree.checkpoint(
            self.allocator,
            as_tokens(req.fill_slice(start, aligned)),
            start,
            namespace_id(req.namespace),
            req.kv_row,
            lo,
            aligned,
            self._insert_priority(req),
            req.cache_inserted_len,
            lock,
        )
        if node is not None:  # else the cache did not keep it (nothing moved)
            req.cache_protected_len = req.cache_inserted_len = aligned
            req.lock_node = req.last_node = node
        req.prefix_len = up_to
