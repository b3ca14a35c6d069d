"""``NativeRadixCache``: the radix cache of ``radixsched.cache.radix`` with its tree in C++
(``radixsched/_native/radix.cpp``), for the native core.

Same contract, same results: the same matches, the same splits, the same logical clock and the
same evictions in the same order (tests/test_native_radix.py drives both side by side), and the
listener and ``on_evict`` are told of the same changes at the same points. Nodes are handles
to C++ nodes (``parent``, ``len(node)``, ``child_key``, ``slot``, ``lock_ref``, ... as on
``TreeNode``; ``key`` and ``value`` read as copies). A handle keeps its node alive: an evicted
node is detached (``parent is None``), never freed under a holder.

Namespaces cross as ids (``radixsched.native.namespace_id``). Only the built-in eviction
strategies exist natively (``NATIVE_EVICTION``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from radixsched.cache.base import (
    BasePrefixCache,
    CacheKey,
    CacheListener,
    InsertResult,
    MatchEnd,
    MatchResult,
    SlotFreer,
)
from radixsched.cache.evict import DEFAULT_EVICTION_POLICY, EvictionStrategy, get_strategy
from radixsched.native import NAMESPACES, namespace_id, required
from radixsched.request import EMPTY_SLOTS, SlotArray, TokenArray

if TYPE_CHECKING:
    from radixsched.config import SchedulerConfig
    from radixsched.request import Req

NATIVE_EVICTION = frozenset({"lru", "mru", "fifo", "filo", "lfu", "priority", "slru"})


def as_tokens(tokens: TokenArray) -> TokenArray:
    """``tokens`` as a contiguous int32 array (itself when it is one already)."""
    if tokens.dtype != np.int32 or not tokens.flags.c_contiguous:
        return np.ascontiguousarray(tokens, dtype=np.int32)
    return tokens


def _slots(values: SlotArray) -> SlotArray:
    if values.dtype != np.int64 or not values.flags.c_contiguous:
        return np.ascontiguousarray(values, dtype=np.int64)
    return values


class _LeafSet:
    """The tree's evictable-leaf set, as far as tests read and corrupt it."""

    def __init__(self, cache: NativeRadixCache) -> None:
        self._cache = cache

    def __iter__(self) -> Iterator[Any]:
        tree = self._cache.tree
        return (n for n in tree.nodes() if tree.leaf_member(n))

    def add(self, node: Any) -> None:
        self._cache.tree.leaf_set(node, True)

    def discard(self, node: Any) -> None:
        self._cache.tree.leaf_set(node, False)


class NativeRadixCache(BasePrefixCache):
    def __init__(
        self,
        allocator: SlotFreer | None,
        page_size: int = 1,
        eviction_policy: str = DEFAULT_EVICTION_POLICY,
        disable: bool = False,
        compat_sglang: bool = False,
        on_evict: Callable[[CacheKey, int], None] | None = None,
        split_copies: bool = True,
        *,
        core: ModuleType | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        mod = core if core is not None else required("the native radix tree")
        strategy = get_strategy(eviction_policy)
        self.eviction_policy = DEFAULT_EVICTION_POLICY if disable else strategy.name
        self.strategy: EvictionStrategy = (
            get_strategy(self.eviction_policy) if disable else strategy
        )
        if self.eviction_policy not in NATIVE_EVICTION:
            raise ValueError(f"eviction policy {self.eviction_policy!r} has no native version")
        slru = int(getattr(self.strategy, "protected_threshold", 2))
        counts = bool(getattr(allocator, "counting", False))  # a counting pool's tree counts
        self.tree = mod.Tree(page_size, self.eviction_policy, slru, disable, compat_sglang, counts)
        mod.set_match_types(MatchResult, EMPTY_SLOTS, namespace_id)
        self._match: Callable[[CacheKey], MatchResult] = self.tree.match_key
        if type(self).match_prefix is NativeRadixCache.match_prefix:
            # Calls skip match_prefix's Python frame: the bound native method, which does all
            # it does, shadows it on the instance (a subclass's own match_prefix is kept).
            self.__dict__["match_prefix"] = self._match
        self._match_nodes: Callable[..., tuple[list[int], list[tuple[Any, int]] | None]] = (
            mod.match_nodes
        )
        self.allocator = allocator
        self._pool_type: type | None = getattr(mod, "Pool", None)  # evict frees natively to it
        self.page_size = page_size
        self.disabled = disable
        self.compat_sglang = compat_sglang
        self.split_copies = split_copies  # C++ nodes always own their arrays
        self._on_evict: Callable[[CacheKey, int], None] | None = None
        self._listener: CacheListener | None = None
        self.on_evict = on_evict

    # ---- hooks ---------------------------------------------------------------------------------
    @property
    def on_evict(self) -> Callable[[CacheKey, int], None] | None:
        return self._on_evict

    @on_evict.setter
    def on_evict(self, fn: Callable[[CacheKey, int], None] | None) -> None:
        self._on_evict = fn
        if fn is None:
            self.tree.set_host_evict(None)
            return
        hook = fn
        self.tree.set_host_evict(lambda toks, ns, n: hook(CacheKey(toks, NAMESPACES[ns]), n))

    @property
    def listener(self) -> CacheListener | None:
        return self._listener

    @listener.setter
    def listener(self, listener: CacheListener | None) -> None:
        self._listener = listener
        self.tree.set_listener(listener)

    def adopt_listener(self, listener: Any) -> None:
        """``listener`` listens in C++ already (a ``NativeMatcher``): it is only told of
        resets from here."""
        self._listener = listener

    @property
    def root(self) -> Any:
        return self.tree.root

    def reset(self) -> None:
        """Drop the whole tree, returning every held slot to the allocator (refused while any
        node is locked)."""
        values = self.tree.reset()
        if self.allocator is not None and values.size:
            self.allocator.free(values)
        if self._listener is not None:
            self._listener.on_reset()

    def subtree_key(self, key: CacheKey) -> Hashable | None:
        """The root-level child key ``key`` would be matched under (None: under a page)."""
        tokens = key.tokens
        p = self.page_size
        if len(tokens) < p:
            return None
        first = np.ascontiguousarray(tokens[:p], dtype=np.int32).tobytes()
        ns = NAMESPACES[namespace_id(key.namespace)]
        return first if ns is None else (ns, first)

    # ---- match / touch / insert --------------------------------------------------------------
    def match_prefix(self, key: CacheKey) -> MatchResult:
        # The hot path: one native call (``Tree.match_key``, bound once) builds the MatchResult:
        # a disabled tree or an empty key gives (EMPTY_SLOTS, 0, root) without a clock tick;
        # tokens of any int dtype are read or converted natively, as ``as_tokens`` would.
        return self._match(key)

    def match_node(self, key: CacheKey) -> MatchResult:
        tokens, ns = key
        if self.disabled or len(tokens) == 0:
            return MatchResult(EMPTY_SLOTS, 0, self.tree.root)
        node, pos = self.tree.walk_node(tokens, 0 if ns is None else namespace_id(ns))
        return MatchResult(EMPTY_SLOTS, pos, node)

    def match_nodes(
        self, reqs: list[Req], ends: bool
    ) -> tuple[list[int], list[tuple[Any, int]] | None]:
        """``match_node`` of every request's ``CacheKey(r.fill_ids(), r.namespace)``, in list
        order, in one native call (``_native/compat_match.cpp``): the same walks (clock ticks,
        touches, splits), and each request's ``prefix_len``, ``last_node``, ``host_hit_len``
        (0) and ``num_matched_prefix_tokens`` (capped at ``fill_len - 1``) set as the reference
        queue's ``match_all`` sets them. Returns the device lengths and, with ``ends``, each
        match's ``(last_node, len(last_node))`` (else None)."""
        return self._match_nodes(self.tree, reqs, ends, self.disabled, namespace_id)

    def prefix_slots(self, node: Any, length: int, out: SlotArray | None = None) -> SlotArray:
        slots: SlotArray = self.tree.prefix_slots(node, length, out)
        return slots

    def match_len(self, key: CacheKey) -> int:
        n: int = self.tree.match_len(as_tokens(key.tokens), namespace_id(key.namespace))
        return n

    def match_end(self, key: CacheKey, start: tuple[Any, int] | None = None) -> MatchEnd:
        node, depth = start if start is not None else (None, 0)
        return MatchEnd(
            *self.tree.match_end(as_tokens(key.tokens), namespace_id(key.namespace), node, depth)
        )

    def touch_at(self, node: Any, offset: int) -> Any:
        return self.tree.touch_at(node, offset)

    def touch_prefix(self, key: CacheKey) -> None:
        tokens, ns = key
        if self.disabled or len(tokens) == 0:
            return
        # A key whose first page is not cached only ticks the clock: what its walk does.
        self.tree.walk_node(tokens, 0 if ns is None else namespace_id(ns))

    def touch_prefixes(self, keys: Iterable[CacheKey]) -> None:
        # ``touch_prefix`` of each key, in order, in one native call (``Tree.touch_keys``).
        self.tree.touch_keys(keys)

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
    ) -> InsertResult:
        """``RadixCache.insert``; ``adopt`` changes nothing (C++ nodes own their arrays)."""
        tree = self.tree
        if self.disabled:
            return InsertResult(0, tree.root)
        base = 0
        if from_start:
            if start is None or start[0] is tree.root:
                raise ValueError("insert(from_start=True) needs a start node below the root")
            base = start[1]
        node, depth = start if start is not None else (None, 0)
        prefix_len, last = tree.insert(
            as_tokens(key.tokens),
            namespace_id(key.namespace),
            _slots(values),
            priority,
            inserted_len,
            node,
            depth,
            base,
        )
        return InsertResult(prefix_len, last)

    # ---- locks -----------------------------------------------------------------------------
    def inc_lock_ref(self, node: Any) -> int:
        moved: int = self.tree.inc_lock_ref(node)
        return moved

    def dec_lock_ref(self, node: Any) -> int:
        moved: int = self.tree.dec_lock_ref(node)
        return moved

    def move_lock(self, old: Any, new: Any) -> None:
        self.tree.move_lock(old, new)

    # ---- eviction ------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        pool = self.allocator
        if pool is not None and type(pool) is self._pool_type:
            # The native pool: evicted and freed (unchecked) in one native call, the slots
            # going from the tree to the pool without an int64 array in between.
            freed: int = self.tree.evict_free(pool, num_tokens)
            return freed
        # One array of the evicted slots in eviction order (evict_reclaim's segments, joined
        # natively: no array per evicted leaf).
        out = self.tree.evict_flat(num_tokens)
        if not len(out):
            return 0
        if self.allocator is not None:
            self.allocator.free(out, checked=False)
        return len(out)

    def evict_reclaim(self, num_tokens: int) -> list[SlotArray]:
        segments: list[SlotArray] = self.tree.evict(num_tokens)
        return segments

    # ---- sizes ---------------------------------------------------------------------------------
    def evictable_size(self) -> int:
        n: int = self.tree.evictable_size()
        return n

    def protected_size(self) -> int:
        n: int = self.tree.protected_size()
        return n

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def num_evictable_leaves(self) -> int:
        n: int = self.tree.num_evictable_leaves()
        return n

    def _iter_nodes(self) -> Iterator[Any]:
        return iter(self.tree.nodes())

    def num_nodes(self) -> int:
        return len(self.tree.nodes())

    def all_values(self) -> SlotArray:
        values: SlotArray = self.tree.all_values()
        return values

    # Test hooks: the Python tree's private counters, as its tests read and corrupt them.
    @property
    def _evictable_size(self) -> int:
        return self.evictable_size()

    @_evictable_size.setter
    def _evictable_size(self, value: int) -> None:
        self.tree.add_evictable_size(value - self.evictable_size())

    @property
    def _clock(self) -> int:
        return int(self.tree.clock)

    @property
    def _evictable_leaves(self) -> _LeafSet:
        return _LeafSet(self)

    @property
    def _heap_persistent(self) -> bool:
        return bool(self.tree.heap_persistent)

    @_heap_persistent.setter
    def _heap_persistent(self, value: bool) -> None:
        self.tree.heap_persistent = value

    # ---- DFS-weight order ----------------------------------------------------------------------
    def dfs_weight_order(self, nodes: list[Any]) -> list[int]:
        return self.dfs_weight_order_at([(n, len(n) if n is not None else 0) for n in nodes])

    def dfs_weight_order_at(self, ends: Sequence[tuple[Any, int]]) -> list[int]:
        order: list[int] = self.tree.dfs_weight_order_at(ends)
        return order

    def check_integrity(self) -> None:
        self.tree.check_integrity()

    def __repr__(self) -> str:
        return (
            f"NativeRadixCache(page_size={self.page_size}, policy={self.eviction_policy}, "
            f"disabled={self.disabled}, compat_sglang={self.compat_sglang}, "
            f"evictable={self.evictable_size()}, protected={self.protected_size()})"
        )


def make_pool(size: int, page_size: int = 1, counting: bool = False) -> Any:
    """The native KV slot pool (``_native/pool.cpp``): ``TokenAllocator``'s free list, the same
    slots in the same order, in C++, which the native tree's ``alloc_into`` and ``checkpoint``
    allocate from and free to without a call into Python; ``counting``: the same counts, no
    slot ids (for a runner that reads none; a cache over it counts too)."""
    return required("the native slot pool").Pool(size, page_size, counting)


def make_cache(
    config: SchedulerConfig,
    allocator: SlotFreer | None,
    *,
    on_evict: Callable[[CacheKey, int], None] | None = None,
) -> NativeRadixCache:
    """The native core's cache: the native radix tree (``build.build_scheduler`` builds the
    native core only where the extension is on and the eviction policy is a built-in one;
    anywhere else this raises)."""
    return NativeRadixCache(
        allocator,
        page_size=config.page_size,
        eviction_policy=config.radix_eviction_policy,
        disable=config.disable_radix_cache,
        compat_sglang=config.sglang_compat,
        on_evict=on_evict,
    )
