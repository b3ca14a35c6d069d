"""Prefix caches (radix tree, no-reuse baseline), eviction strategies and the KV slot allocator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixsched.cache.allocator import TokenAllocator
from radixsched.cache.base import (
    BasePrefixCache,
    CacheKey,
    InsertResult,
    IntegrityError,
    MatchResult,
    SlotFreer,
)
from radixsched.cache.baseline import NoReuseCache
from radixsched.cache.evict import EVICTION_STRATEGIES, EvictionStrategy, get_strategy
from radixsched.cache.radix import RadixCache, TreeNode, longest_common_prefix

if TYPE_CHECKING:
    from collections.abc import Callable

    from radixsched.config import SchedulerConfig

__all__ = [
    "EVICTION_STRATEGIES",
    "BasePrefixCache",
    "CacheKey",
    "EvictionStrategy",
    "InsertResult",
    "IntegrityError",
    "MatchResult",
    "NoReuseCache",
    "RadixCache",
    "SlotFreer",
    "TokenAllocator",
    "TreeNode",
    "get_strategy",
    "longest_common_prefix",
    "make_cache",
]


def make_cache(
    config: SchedulerConfig,
    allocator: SlotFreer | None,
    *,
    on_evict: Callable[[CacheKey, int], None] | None = None,
) -> BasePrefixCache:
    """The scheduler's cache for ``config``: a radix cache, disabled under
    ``--disable-radix-cache`` (SGLang builds a disabled tree too)."""
    return RadixCache(
        allocator,
        page_size=config.page_size,
        eviction_policy=config.radix_eviction_policy,
        disable=config.disable_radix_cache,
        compat_sglang=config.sglang_compat,
        on_evict=on_evict,
    )
