"""``NativeKVManager``: the reference KV ownership (``radixsched.kv``) over the native tree and
the native slot pool, each hot move one native call on the request itself
(``_core.KV``, ``radixsched/_native/kv.cpp``), the same slots in the same places.

- Allocating evicts to the pool's shortfall and hands the evicted slots straight to the
  allocation (the same slots and free list as freeing, then allocating); a request's slots
  are written straight into its row's buffer.
- A checkpoint inserts only the key past the request's locked node (the path above it is the
  request's own prefix), and re-matches from the root only when some of the key was cached
  before: then the request's copies are freed and its row points at the cache's.
- ``alloc``, ``checkpoint``, ``take_prefix``, ``release`` and (without a host tier)
  ``extend_entry`` are the native object's bound methods, set on the instance: a call is one native call, no Python
  frame. With a host tier the reference's ``extend_entry`` runs (it touches the host pages).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixsched.config import SchedulerConfig
from radixsched.kv import KVManager
from radixsched.native import core, namespace_of
from radixsched.native.radix import NativeRadixCache
from radixsched.request import EMPTY_SLOTS, Req


class NativeKVManager(KVManager):
    cache: NativeRadixCache
    # the native core's rows (``_native/kv.cpp``), as its pool's slots
    row_dtype: type[np.integer] = np.int32

    def __init__(
        self,
        cache: NativeRadixCache,
        allocator: Any,
        config: SchedulerConfig = SchedulerConfig(),
        *,
        host_tier: object = None,
    ) -> None:
        super().__init__(cache, allocator, config, host_tier=host_tier)
        native = core()
        assert native is not None, "the native KV manager runs over the native core"
        kv = native.KV(
            cache.tree, allocator, self.priority_sign, self.compat, namespace_of, EMPTY_SLOTS
        )
        self.native = kv
        if kv.wide_rows:  # a pool whose slots do not all fit int32
            self.row_dtype = np.int64
        self.alloc = kv.alloc  # type: ignore[method-assign]
        self.checkpoint = kv.checkpoint  # type: ignore[method-assign]
        self.take_prefix = kv.take_prefix  # type: ignore[method-assign]
        self.release = kv.release  # type: ignore[method-assign]
        if host_tier is None:
            self.extend_entry = kv.extend_entry  # type: ignore[method-assign]

    def grow(self, reqs: list[Req], ends: list[int]) -> None:
        if len(reqs) == 1:
            self.native.grow(reqs[0], ends[0])
        else:
            super().grow(reqs, ends)
