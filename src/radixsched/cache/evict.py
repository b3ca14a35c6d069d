"""Eviction strategies for the radix cache, registered by name.

A strategy maps an evictable leaf to a sort key; the cache evicts the leaf with the smallest key
first, as SGLang's do. Times are values of the cache's logical clock (one tick per cache
operation), never wall-clock time, so eviction order is a pure function of the operation
sequence. The cache breaks remaining ties by node id (creation order), also deterministic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol


class EvictableNode(Protocol):
    """The node fields a strategy may read."""

    last_access_time: int
    creation_time: int
    hit_count: int
    priority: int


class EvictionStrategy(ABC):
    name: ClassVar[str]
    # A node's priority never decreases while it lives (access times, hit counts and node
    # priorities only grow): the cache may then keep one lazily updated heap across evictions.
    monotone: ClassVar[bool] = True

    @abstractmethod
    def priority(self, node: EvictableNode) -> Any:
        """Sort key: the leaf with the smallest key is evicted first."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LRUStrategy(EvictionStrategy):
    """Least recently used first."""

    name = "lru"

    def priority(self, node: EvictableNode) -> int:
        return node.last_access_time


class MRUStrategy(EvictionStrategy):
    """Most recently used first."""

    name = "mru"
    monotone = False  # -last_access_time decreases on every access

    def priority(self, node: EvictableNode) -> int:
        return -node.last_access_time


class FIFOStrategy(EvictionStrategy):
    """Oldest created first. A split keeps the creation time (unless SGLang compat is on)."""

    name = "fifo"

    def priority(self, node: EvictableNode) -> int:
        return node.creation_time


class FILOStrategy(EvictionStrategy):
    """Newest created first."""

    name = "filo"

    def priority(self, node: EvictableNode) -> int:
        return -node.creation_time


class LFUStrategy(EvictionStrategy):
    """Fewest insert hits first, then least recently used."""

    name = "lfu"

    def priority(self, node: EvictableNode) -> tuple[int, int]:
        return (node.hit_count, node.last_access_time)


class PriorityStrategy(EvictionStrategy):
    """Lower node priority first (a node's priority is the max over the inserts through it),
    then least recently used: higher priority is kept longer."""

    name = "priority"

    def priority(self, node: EvictableNode) -> tuple[int, int]:
        return (node.priority, node.last_access_time)


class SLRUStrategy(EvictionStrategy):
    """Segmented LRU: the probationary segment (hit_count < protected_threshold) goes first,
    LRU within each segment."""

    name = "slru"

    def __init__(self, protected_threshold: int = 2) -> None:
        if protected_threshold < 0:
            raise ValueError(f"protected_threshold must be >= 0, got {protected_threshold}")
        self.protected_threshold = protected_threshold

    def priority(self, node: EvictableNode) -> tuple[int, int]:
        return (1 if node.hit_count >= self.protected_threshold else 0, node.last_access_time)

    def __repr__(self) -> str:
        return f"SLRUStrategy(protected_threshold={self.protected_threshold})"


EVICTION_STRATEGIES: dict[str, type[EvictionStrategy]] = {
    cls.name: cls
    for cls in (
        LRUStrategy,
        LFUStrategy,
        FIFOStrategy,
        FILOStrategy,
        MRUStrategy,
        PriorityStrategy,
        SLRUStrategy,
    )
}

DEFAULT_EVICTION_POLICY = "lru"


def get_strategy(name: str, **kwargs: Any) -> EvictionStrategy:
    """Build a strategy by (case-insensitive) name; keyword arguments go to its constructor."""
    cls = EVICTION_STRATEGIES.get(name.lower())
    if cls is None:
        valid = ", ".join(sorted(EVICTION_STRATEGIES))
        raise ValueError(f"Unknown eviction policy: {name!r} (valid: {valid})")
    return cls(**kwargs)
