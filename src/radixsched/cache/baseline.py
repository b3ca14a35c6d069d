"""The no-reuse baseline: a prefix cache that accepts every call and keeps nothing.

Exact behaviour (the ablation "same scheduler, zero prefix reuse", and a test oracle):

- ``match_prefix`` / ``match_len`` always match 0 tokens; ``last_node`` is ``root``.
- ``insert`` returns ``prefix_len = 0`` and takes ownership of NOTHING: every slot passed stays
  the caller's. Under the checkpoint protocol (insert, free ``[cache_protected_len,
  prefix_len)``, re-match, adopt the matched length as ``cache_protected_len``) the re-match
  returns 0, so the request keeps owning its whole KV row and frees it at release. Freeing the
  values here instead would free slots a running request still reads and double-free them at
  release.
- Holds no slots: every size is 0, ``all_values()`` is empty, ``evict`` frees 0.
- Locks accept the root handle and change nothing (delta 0).
- ``dfs_weight_order`` is the identity (every handle is the root).

Unlike ``RadixCache(disable=True)`` it reports ``disabled = False``: cache-aware policies are not
downgraded to FCFS, so the comparison isolates the effect of reuse from the choice of policy.
``supports_prefix_sharing()`` is True for the same reason. Hence callers that insert and then
expect the re-match to cover the inserted key (the checkpoint path) must accept a re-match of 0
here: the request then keeps ownership of its whole row.
"""

from __future__ import annotations

from typing import Any

from radixsched.cache.base import (
    BasePrefixCache,
    CacheKey,
    InsertResult,
    IntegrityError,
    MatchResult,
)
from radixsched.request import EMPTY_SLOTS, SlotArray


class NoReuseRoot:
    """The only node handle a NoReuseCache hands out."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NoReuseRoot()"


class NoReuseCache(BasePrefixCache):
    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.disabled = False
        self._root = NoReuseRoot()

    @property
    def root(self) -> NoReuseRoot:
        return self._root

    def reset(self) -> None:
        """Nothing is held, so nothing to drop."""

    def match_prefix(self, key: CacheKey) -> MatchResult:
        return MatchResult(EMPTY_SLOTS, 0, self._root)

    def match_len(self, key: CacheKey) -> int:
        return 0

    def prefix_slots(self, node: object, length: int, out: SlotArray | None = None) -> SlotArray:
        self._check_handle(node)  # every match ends at the root with no tokens
        if length:
            raise IntegrityError(f"prefix of {length} tokens but NoReuseCache matches none")
        return EMPTY_SLOTS.copy() if out is None else out

    def insert(
        self, key: CacheKey, values: SlotArray, priority: int = 0, **options: Any
    ) -> InsertResult:
        """Keeps nothing, whatever the options (``BasePrefixCache.insert``'s)."""
        return InsertResult(0, self._root)

    def touch_prefix(self, key: CacheKey) -> None:
        """No recency to refresh."""

    def _check_handle(self, node: object) -> None:
        if node is not self._root:
            raise ValueError(f"NoReuseCache only hands out its root, got {node!r}")

    def inc_lock_ref(self, node: object) -> int:
        self._check_handle(node)
        return 0

    def dec_lock_ref(self, node: object) -> int:
        self._check_handle(node)
        return 0

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def dfs_weight_order(self, nodes: list[object]) -> list[int]:
        return list(range(len(nodes)))

    def check_integrity(self) -> None:
        if not isinstance(self._root, NoReuseRoot):
            raise IntegrityError("NoReuseCache root replaced")

    def __repr__(self) -> str:
        return f"NoReuseCache(page_size={self.page_size})"
