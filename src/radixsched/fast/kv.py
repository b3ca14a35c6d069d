"""``FastKVManager``: the reference KV ownership (``radixsched.kv``) with fewer copies and
walks, the same slots in the same places.

- A checkpoint inserts only the key past the request's locked node (the path above it is the
  request's own prefix), lets new nodes keep views of the prompt and the row instead of copies
  (the scheduler never rewrites a row's computed positions), and skips the re-match when
  nothing past the locked prefix was cached before (the new nodes hold the row's own slots).
- Evicting to allocate hands the evicted slots straight to the allocation
  (``evict_reclaim`` + ``recycle_into``): the same slots and free list as freeing, then
  allocating, without the round trip; a request's slots are written straight into its row.
"""

from __future__ import annotations

import numpy as np

from radixsched.cache import CacheKey
from radixsched.cache.base import IntegrityError
from radixsched.kv import KVManager, ceil_page, floor_page
from radixsched.request import Req, SlotArray


class FastKVManager(KVManager):
    def _alloc_into(self, out: SlotArray) -> None:
        n = len(out)
        short = n - self.allocator.available_size()
        if short > 0:
            ok = self.allocator.recycle_into(self.cache.evict_reclaim(short), out)
        else:
            ok = self.allocator.alloc_into(out)
        if not ok:
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
        if self.cache.disabled or aligned <= req.cache_protected_len:
            req.prefix_len = up_to
            return
        lock, lo, ns = req.lock_node, req.cache_protected_len, req.namespace
        prio = self._insert_priority(req)
        if lock is not None and lock is not self.cache.root:
            res = self.cache.insert(
                CacheKey(req.fill_slice(lo, aligned), ns),
                req.kv_row[lo:aligned],
                prio,
                inserted_len=req.cache_inserted_len,
                start=(lock, lo),
                from_start=True,
                adopt=True,
            )
        else:
            res = self.cache.insert(
                CacheKey(req.fill_slice(0, aligned), ns),
                req.kv_row[:aligned],
                prio,
                inserted_len=req.cache_inserted_len,
                adopt=True,
            )
        if res.prefix_len == lo and self.cache.supports_prefix_sharing():
            node = res.last_node  # the new nodes hold the row's own slots: nothing to re-point
        else:
            m = self.cache.match_prefix(CacheKey(req.fill_slice(0, aligned), ns))
            if m.device_len < aligned:  # the cache did not keep it (a no-reuse cache)
                req.prefix_len = up_to
                return
            dup_end = min(res.prefix_len, aligned)
            if dup_end > lo:
                self.allocator.free(req.kv_row[lo:dup_end])
                req.kv_row[lo:dup_end] = m.indices[lo:dup_end]
            node = m.last_node
        req.cache_protected_len = req.cache_inserted_len = aligned
        self.cache.move_lock(req.lock_node, node)
        req.lock_node = req.last_node = node
        req.prefix_len = up_to
