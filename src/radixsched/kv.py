"""KV slot ownership: every request's KV row, and the moves of slots between the allocator,
the radix cache and the requests.

Invariant (``Scheduler.check_integrity`` checks it after every step in tests): every slot is in
exactly one place: free in the allocator, held by the cache, or owned by one running (or
chunked) request as ``kv_row[cache_protected_len:]``. A request's ``kv_row[:cache_protected_len]``
are cache slots, pinned by the lock it holds on ``lock_node`` from admission until
``release``. Allocation evicts unlocked cache leaves when the free list is short; the adder's
budget guarantees that free + evictable always covers what a round allocates.
"""

from __future__ import annotations

import numpy as np

from radixsched.cache import CacheKey, TokenAllocator
from radixsched.cache.base import BasePrefixCache, IntegrityError, ceil_page, floor_page
from radixsched.config import SchedulerConfig
from radixsched.request import EMPTY_SLOTS, Req, SlotArray
from radixsched.runner import DecodeEntry, ExtendEntry


class KVManager:
    row_dtype: type[np.integer] = np.int64  # its rows' (NativeKVManager's: int32, as its pool's)

    def __init__(
        self,
        cache: BasePrefixCache,
        allocator: TokenAllocator,
        config: SchedulerConfig = SchedulerConfig(),  # frozen: its priority order and mode
        *,
        host_tier: object = None,
    ) -> None:
        self.cache = cache
        self.allocator = allocator
        self.page = allocator.page_size
        self.hit_unit = max(self.page, config.hit_unit)  # a hit is whole pages or blocks
        self.host_tier = host_tier
        self.priority_sign = config.priority_sign
        self.compat = config.sglang_compat

    # ---- admission -------------------------------------------------------------------------
    def match_for_admission(self, req: Req) -> None:
        """Match the request's fill capped at ``len - 1`` (at least one token is computed) and
        host-tier hits; the prefix is borrowed until ``take_prefix`` or ``drop_match``."""
        key = self.admission_key(req)
        m = self.cache.match_node(key)
        self.borrow(req, key, m.device_len, m.last_node)

    @staticmethod
    def admission_key(req: Req) -> CacheKey:
        fill = req.fill_ids()
        return CacheKey(fill[: req.max_prefix_len(len(fill))], req.namespace)

    def borrow(self, req: Req, key: CacheKey, device_len: int, last_node: object) -> None:
        """The admission's match of ``key`` is ``device_len`` tokens ending at ``last_node``."""
        cap = len(key.tokens)
        if device_len % self.hit_unit:  # vLLM's blocks: the hit ends at the last whole one
            device_len -= device_len % self.hit_unit
            short = key._replace(tokens=key.tokens[:device_len])
            last_node = self.cache.match_node(short).last_node
        req.prefix_len = req.kv_len = req.cache_protected_len = device_len
        req.last_node = last_node
        req.kv_row = req.kv_buf = EMPTY_SLOTS
        req.host_hit_len = 0
        if self.host_tier is not None:
            host = self.host_tier.host_len(key, device_len)  # type: ignore[attr-defined]
            end = floor_page(min(device_len + host, cap), self.hit_unit)
            req.host_hit_len = max(0, end - device_len)
        req.num_matched_prefix_tokens = min(device_len + req.host_hit_len, cap)

    def drop_match(self, req: Req) -> None:
        """The request was not admitted: it holds nothing."""
        req.kv_len = req.cache_protected_len = 0

    def take_prefix(self, req: Req) -> None:
        """An admitted request's row starts with its cached prefix (its lock keeps it)."""
        n = req.prefix_len
        buf = np.empty(max(row_capacity(req), n), dtype=self.row_dtype)
        if n:
            self.cache.prefix_slots(req.last_node, n, out=buf[:n])
        req.kv_buf, req.kv_row = buf, buf[:n]

    # ---- allocation ---------------------------------------------------------------------------
    def alloc(self, n: int) -> SlotArray:
        """``n`` new slots, evicting cache leaves when the free list is short."""
        self.keep_free(n)
        slots = self.allocator.alloc(n)
        if slots is None:
            raise IntegrityError(
                f"KV allocation of {n} slots failed: available {self.allocator.available_size()}"
                f", evictable {self.cache.evictable_size()} (the admission budget was violated)"
            )
        return slots

    def keep_free(self, n: int) -> None:
        """Evict unlocked cache leaves until ``n`` slots are free (or nothing is evictable)."""
        short = n - self.allocator.available_size()
        if short > 0:
            self.cache.evict(short)

    def grow(self, reqs: list[Req], ends: list[int]) -> None:
        """Grow each row to cover positions ``[0, end)`` (whole pages), in one allocation."""
        needs = [
            max(ceil_page(e, self.page) - len(r.kv_row), 0) for r, e in zip(reqs, ends, strict=True)
        ]
        slots = self.alloc(sum(needs))
        off = 0
        for r, n in zip(reqs, needs, strict=True):
            if n:
                have = len(r.kv_row)
                if len(r.kv_buf) < have + n:  # a row past its planned capacity
                    buf = np.empty(2 * (have + n), dtype=self.row_dtype)
                    buf[:have] = r.kv_row
                    r.kv_buf = buf
                r.kv_buf[have : have + n] = slots[off : off + n]
                r.kv_row = r.kv_buf[: have + n]
                off += n

    def extend_entry(self, req: Req, prefix_len: int, end: int) -> ExtendEntry:
        """Allocate positions ``[prefix_len, end)`` of the request and describe the extend."""
        if not len(req.kv_buf):
            req.kv_buf = np.empty(row_capacity(req), dtype=self.row_dtype)
            req.kv_row = req.kv_buf[:0]
        self.grow([req], [end])
        fill = req.fill_ids()
        host_load = 0
        if req.host_hit_len and prefix_len == req.cache_protected_len == req.prefix_len:
            host_load = min(req.host_hit_len, end - prefix_len)
            req.host_hit_len = 0
            if self.host_tier is not None:  # loaded back: refresh the host pages' recency
                n = prefix_len + host_load
                self.host_tier.touch(CacheKey(fill[:n], req.namespace), n)  # type: ignore[attr-defined]
        req.kv_len = end
        return ExtendEntry(
            req=req,
            prefix_len=prefix_len,
            new_token_ids=fill[prefix_len:end],
            prefix_slots=req.kv_row[:prefix_len],
            new_slots=req.kv_row[prefix_len:end],
            produces_token=end == req.fill_len,
            host_load_len=host_load,
        )

    def decode_entries(self, reqs: list[Req]) -> list[DecodeEntry]:
        """One decode step of each request: its row grows to hold its last token's KV."""
        self.grow(reqs, [r.fill_len for r in reqs])
        entries = []
        for r in reqs:
            pos = r.fill_len - 1
            r.kv_len = pos + 1
            last = r.output_ids[-1] if r.output_ids else int(r.prompt_ids[-1])
            entries.append(DecodeEntry(r, last, pos, r.kv_row[: pos + 1]))
        return entries

    # ---- cache / release ----------------------------------------------------------------------
    def checkpoint(self, req: Req, up_to: int) -> None:
        """Insert the request's computed KV ``[0, up_to)`` (whole pages) into the cache and point
        its row at the cached copy; its lock moves to the new deepest node."""
        aligned = floor_page(min(up_to, req.kv_len), self.page)
        if self.cache.disabled or aligned <= req.cache_protected_len:
            req.prefix_len = up_to
            return
        key = CacheKey(req.fill_slice(0, aligned), req.namespace)
        res = self.cache.insert(
            key,
            req.kv_row[:aligned],
            self._insert_priority(req),
            inserted_len=req.cache_inserted_len,
        )
        m = self.cache.match_prefix(key)
        if m.device_len < aligned:  # the cache did not keep it (a no-reuse cache)
            req.prefix_len = up_to
            return
        lo = req.cache_protected_len
        dup_end = min(res.prefix_len, aligned)
        if dup_end > lo:  # already cached: our copies are freed, the cache's used
            self.allocator.free(req.kv_row[lo:dup_end])
            req.kv_row[lo:dup_end] = m.indices[lo:dup_end]
        req.cache_protected_len = req.cache_inserted_len = aligned
        self.cache.move_lock(req.lock_node, m.last_node)
        req.lock_node = req.last_node = m.last_node
        req.prefix_len = up_to

    def _insert_priority(self, req: Req) -> int:
        """Node priority for the ``priority`` eviction policy: more important is kept longer,
        no priority inserts as 0 (compat: SGLang's raw value, whatever the priority order)."""
        if req.priority is None:
            return 0
        if self.compat or self.priority_sign < 0:
            return req.priority
        return -req.priority

    def release(self, req: Req, *, cache_kv: bool) -> None:
        """Give back everything the request holds: its KV (cached first when ``cache_kv``),
        its own slots and its lock."""
        if cache_kv and req.kv_len > req.cache_protected_len:
            self.checkpoint(req, req.kv_len)
        if len(req.kv_row) > req.cache_protected_len:
            self.allocator.free(req.kv_row[req.cache_protected_len :])
        if req.lock_node is not None:
            self.cache.dec_lock_ref(req.lock_node)
        req.lock_node = req.last_node = None
        req.kv_row = req.kv_buf = EMPTY_SLOTS
        req.kv_len = req.cache_protected_len = req.cache_inserted_len = 0
        req.prefix_len = req.extend_end = req.host_hit_len = 0

    @staticmethod
    def owned_slots(holders: list[Req]) -> SlotArray:
        parts = [r.kv_row[r.cache_protected_len :] for r in holders if len(r.kv_row)]
        return np.concatenate(parts) if parts else EMPTY_SLOTS


def row_capacity(r: Req) -> int:
    """Positions a request's row is sized for: every position it can reach, plus a page."""
    return len(r.prompt_ids) + r.sampling.max_new_tokens + 64
