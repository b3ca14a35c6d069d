"""The prefix-cache contract shared by the radix cache, the disabled cache and the no-reuse
baseline. Callers (the policy, the prefill adder, the scheduler) depend only on this.

Contract for callers:
- ``match_prefix`` may split a node (a read that changes structure) and refreshes recency.
  The returned ``indices`` are only safe to use while the caller holds a lock on
  ``last_node`` (``inc_lock_ref``); an unlocked prefix can be evicted at any allocation.
- ``match_len`` returns the matched length only: no split, no index array, no recency
  update. It is the fast path for policies that only sort on lengths.
- ``insert`` returns how much of the key was already cached; the caller owns the slots it
  passed for that already-cached range and must free them (they are duplicates).
- ``evict(n)`` frees at least ``min(n, evictable_size())`` tokens through the allocator, never
  from a locked node. It may free up to one page more than asked (partial-leaf eviction);
  in SGLang-compat mode it frees whole leaves and may overshoot by a whole leaf.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from radixsched.request import SlotArray, TokenArray

Namespace = tuple[str | None, str | None] | None


def ceil_page(n: int, page: int) -> int:
    return -(-n // page) * page


def floor_page(n: int, page: int) -> int:
    return n // page * page


class CacheKey(NamedTuple):
    """Token ids plus a namespace ``(extra_key, cache_salt)``; None = the default namespace."""

    tokens: TokenArray
    namespace: Namespace = None


class MatchResult(NamedTuple):
    indices: SlotArray  # device KV slots of the matched prefix (len == device_len)
    device_len: int
    last_node: Any  # opaque handle: lock it before using ``indices``
    host_len: int = 0  # extra tokens matched in the host tier beyond the device match


class MatchEnd(NamedTuple):
    length: int  # matched tokens (page-aligned)
    node: Any  # the node holding the last matched token (the root for no match)
    offset: int  # tokens of ``node`` matched (its whole length unless the match ends inside)


class InsertResult(NamedTuple):
    prefix_len: int  # tokens of the key that were already cached (duplicates to free)
    last_node: Any


class CacheListener(Protocol):
    """Told of every change to a radix tree that can change where a match ends (the
    incremental matcher of ``radixsched.native`` listens)."""

    def on_child(self, parent: Any, child_key: Any) -> None:
        """A new node now hangs under ``parent`` at ``child_key``."""

    def on_split(self, upper: Any, lower: Any) -> None:
        """``lower``'s first ``len(upper.key)`` tokens became ``upper``, which took its place
        under its parent (same child key); ``lower`` hangs under ``upper`` now."""

    def on_evict(self, leaf: Any, keep: int) -> None:
        """``leaf`` lost its tokens past ``keep`` (``keep == 0``: removed from the tree)."""

    def on_reset(self) -> None:
        """The tree was emptied."""


class SlotFreer(Protocol):
    def free(self, slots: SlotArray, *, checked: bool = True) -> None: ...


class BasePrefixCache(ABC):
    page_size: int
    disabled: bool

    @property
    @abstractmethod
    def root(self) -> Any: ...

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def match_prefix(self, key: CacheKey) -> MatchResult: ...

    @abstractmethod
    def match_len(self, key: CacheKey) -> int: ...

    def match_node(self, key: CacheKey) -> MatchResult:
        """``match_prefix`` (the same recency refresh and splits) for callers that need the
        matched length and ``last_node`` only: ``indices`` may be left empty."""
        return self.match_prefix(key)

    @abstractmethod
    def prefix_slots(self, node: Any, length: int, out: SlotArray | None = None) -> SlotArray:
        """The ``indices`` ``match_prefix`` gives for a match of ``length`` tokens ending at
        ``node`` (a new array, or written into ``out``, an int64 array of ``length`` the
        caller owns, and returned), gathered later: the caller matched with ``match_node``
        and has held a lock on ``node`` since."""

    @abstractmethod
    def insert(
        self,
        key: CacheKey,
        values: SlotArray,
        priority: int = 0,
        *,
        inserted_len: int = 0,
        start: Any = None,
        from_start: bool = False,
        adopt: bool = False,
    ) -> InsertResult: ...

    @abstractmethod
    def touch_prefix(self, key: CacheKey) -> None: ...

    def touch_prefixes(self, keys: Iterable[CacheKey]) -> None:
        """``touch_prefix`` of each key, in order."""
        for key in keys:
            self.touch_prefix(key)

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> int: ...

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> int: ...

    def move_lock(self, old: Any, new: Any) -> None:
        """``inc_lock_ref(new)``, then ``dec_lock_ref(old)`` unless ``old`` is None."""
        self.inc_lock_ref(new)
        if old is not None:
            self.dec_lock_ref(old)

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    def evict_reclaim(self, num_tokens: int) -> list[SlotArray]:
        """``evict(num_tokens)``, but the freed slots are handed to the caller (who then owns
        them, as allocated slots) instead of going back to the allocator: a caller that
        evicts to allocate at once skips a round trip through the free list. The slots come
        as segments (whole pages each) in eviction order: their concatenation is what
        ``evict`` would free. A cache that cannot do this frees them as usual and returns no
        segments."""
        self.evict(num_tokens)
        return []

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def total_size(self) -> int: ...

    def match_end(self, key: CacheKey) -> MatchEnd:
        """Where the match of ``key`` ends, read-only (no split, no recency update)."""
        return MatchEnd(0, self.root, 0)

    @abstractmethod
    def dfs_weight_order(self, nodes: list[Any]) -> list[int]: ...

    def dfs_weight_order_at(self, ends: Sequence[tuple[Any, int]]) -> list[int]:
        """The DFS-weight order of matches ending ``offset`` tokens into ``node``."""
        return self.dfs_weight_order([node for node, _ in ends])

    @abstractmethod
    def check_integrity(self) -> None: ...

    def supports_prefix_sharing(self) -> bool:
        return not self.disabled

    def all_values(self) -> SlotArray:
        """Every KV slot the cache holds (for conservation checks)."""
        return np.zeros(0, dtype=np.int64)


class IntegrityError(AssertionError):
    """Accounting is off; the message carries the numbers."""
