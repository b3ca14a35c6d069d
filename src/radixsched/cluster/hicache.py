"""Host KV tier: KV pages the device cache evicted, kept in host memory for a cheap load-back.

Wiring (hierarchical cache):
- The device ``RadixCache`` gets ``on_evict=tier.on_evict``. Each call passes the key from the
  root to the end of the evicted segment and the segment's length; the tier stores every full
  page of that key overlapping the segment (``page_size`` tokens per page, prefix page hashes
  from ``pagehash``, one int per page: no per-token objects). A trailing partial page is not
  stored; a page straddling the segment's start is (its head is a copy of device-resident KV).
- The tier is its own LRU bounded by ``capacity_tokens`` (whole pages). Within one stored
  segment the deepest pages are the oldest, so capacity pressure trims prefixes from the end.
- At admission the scheduler asks ``match_len(key, device_len)`` with the device match
  length. The result counts leading tokens of ``key`` available on device or host: pages that
  lie inside the device match count as present without a host copy (the device still holds
  them), every later page must be in the tier. The scheduler then uses
  ``host_len = max(0, host_match - device_match)`` (``host_len(key, device_len)``): those
  tokens are loaded back over PCIe (the cost model charges
  ``kv_bytes_per_token * host_len / pcie_bw`` instead of recomputing them); calling
  ``touch(key, host_match)`` on a load-back refreshes their recency in the tier. Host pages stay in the tier
  after a load-back (the host copy remains valid; the device copy may be evicted again).
- ``host_capacity_tokens(hicache_size_gb, kv_bytes_per_token)`` turns ``--hicache-size`` into
  the capacity.

Page size: any; hashing is vectorised (``pagehash``), so ``page_size == 1`` is fine, at one
dict entry per held page. A host match is page-aligned to the tier's pages.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from radixsched.cache.base import CacheKey
from radixsched.cluster.pagehash import page_hashes

GB = 1 << 30


def host_capacity_tokens(size_gb: float, kv_bytes_per_token: int) -> int:
    """Tokens of KV that ``size_gb`` GiB of host memory holds."""
    if size_gb < 0:
        raise ValueError(f"hicache size must be >= 0, got {size_gb}")
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    return int(size_gb * GB) // kv_bytes_per_token


class HostTierStats(NamedTuple):
    stored_pages: int  # pages written by on_evict (refreshes of a held page included)
    dropped_pages: int  # pages pushed out by the capacity bound


class HostKVTier:
    def __init__(self, capacity_tokens: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.page_size = page_size
        self.capacity_tokens = capacity_tokens
        self.max_pages = capacity_tokens // page_size
        # Prefix page hash -> None, least recently used first.
        self._pages: OrderedDict[int, None] = OrderedDict()
        self._stored = 0
        self._dropped = 0

    # ---- writes ---------------------------------------------------------------------------
    def on_evict(self, key: CacheKey, num_tokens: int) -> None:
        """The device evicted ``key.tokens[len - num_tokens:]``; keep it on the host."""
        if self.max_pages == 0 or num_tokens <= 0:
            return
        start = max(len(key.tokens) - num_tokens, 0)
        new = page_hashes(
            key.tokens, self.page_size, key.namespace, start_page=start // self.page_size
        )
        if not new:
            return
        pages = self._pages
        # Held pages are re-queued with the segment, so the order below holds for all of them.
        for h in [h for h in new if h in pages]:
            del pages[h]
        # Deepest first, so the shallow pages of the segment are the most recently used.
        new.reverse()
        pages.update(dict.fromkeys(new))
        self._stored += len(new)
        excess = len(pages) - self.max_pages
        for _ in range(excess):
            pages.popitem(last=False)
        self._dropped += max(excess, 0)

    def touch(self, key: CacheKey, num_tokens: int) -> None:
        """Refresh the recency of the held pages among the first ``num_tokens`` of ``key``."""
        n_pages = num_tokens // self.page_size
        if n_pages <= 0 or not self._pages:
            return
        pages = self._pages
        for h in reversed(page_hashes(key.tokens, self.page_size, key.namespace, n_pages)):
            if h in pages:
                pages.move_to_end(h)

    def clear(self) -> None:
        self._pages.clear()

    # ---- reads ----------------------------------------------------------------------------
    def match_len(self, key: CacheKey, device_len: int = 0) -> int:
        """Leading tokens of ``key`` held on device (``[0, device_len)``) or in this tier, in
        whole pages of this tier (so possibly less than ``device_len``); no recency update."""
        pages = self._pages
        first = device_len // self.page_size  # pages wholly inside the device match
        n = first
        for h in page_hashes(key.tokens, self.page_size, key.namespace, start_page=first):
            if h not in pages:
                break
            n += 1
        return n * self.page_size

    def host_len(self, key: CacheKey, device_len: int) -> int:
        """Tokens beyond the device match that can be loaded back from the host."""
        return max(0, self.match_len(key, device_len) - device_len)

    @property
    def size_tokens(self) -> int:
        return len(self._pages) * self.page_size

    @property
    def stats(self) -> HostTierStats:
        return HostTierStats(self._stored, self._dropped)

    def check_integrity(self) -> None:
        if len(self._pages) > self.max_pages:
            raise AssertionError(
                f"host tier holds {len(self._pages)} pages, capacity {self.max_pages}"
            )
