"""Radix prefix cache: token-sequence prefixes -> KV slots, with lock counting and eviction.

Semantics follow SGLang 0.5.23's ``RadixCache`` (page-aligned keys, namespaces, splits on a
partial match, lock counting, leaf eviction by strategy) with these deliberate deviations:

- **Partial-leaf eviction.** ``evict(n)`` evicts whole leaves while they fit; when the last leaf
  needed is longer than the remainder, only its tail (rounded up to whole pages) is freed and the
  leaf is shortened in place, so a call frees less than one page more than asked. SGLang frees
  whole leaves and may overshoot by a whole leaf.
- **Creation time survives a split.** The upper fragment of a split keeps the original node's
  ``creation_time`` (as the production unified tree does), so FIFO/FILO see the age of the
  tokens, not of the split. SGLang's ``RadixCache`` gives the fragment a fresh time.
- **Logical clock.** Access and creation times are ticks of a per-cache counter (one tick per
  match/insert/touch call), never wall clock, so eviction order is deterministic.

``compat_sglang=True`` restores whole-leaf eviction and fresh creation times on split. The
logical clock stays (it only replaces timestamps, the relative order is the same).

Representation: each node stores its key as a contiguous int32 array and its value as an int64
array, both owned by the node (copied on insert and split, so a caller mutating its KV row can
never corrupt the tree; a partial-leaf eviction keeps prefix views of the node's own arrays).
Children are keyed by the bytes of their first page (the first token when ``page_size == 1``);
children of the root are keyed by ``(namespace, bytes)`` when the namespace is not the default
one, so namespaces share no node. Each node also remembers its own key in its parent's dict
(``child_key``) and the root-level key of its top-level subtree (``subtree_key``), so
eviction needs neither a byte conversion nor a walk up. A ``listener`` (``CacheListener``) is
told of every new node, split and eviction: what can move where a match ends. Token comparisons are bulk
byte comparisons (``bytes.startswith`` on the bytes of the query's span under the node plus
its next page, converted node by node, so a miss or a short match never converts the whole
query); the exact mismatch point is located with numpy only when a segment does not match
whole.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from radixsched.cache.base import (
    BasePrefixCache,
    CacheKey,
    CacheListener,
    InsertResult,
    IntegrityError,
    MatchEnd,
    MatchResult,
    Namespace,
    SlotFreer,
)
from radixsched.cache.evict import DEFAULT_EVICTION_POLICY, EvictionStrategy, get_strategy
from radixsched.request import EMPTY_SLOTS, EMPTY_TOKENS, SlotArray, TokenArray

_ROOT_PRIORITY = -(2**63)
_TOKEN_BYTES = 4  # int32


def longest_common_prefix(a: TokenArray, b: TokenArray) -> int:
    """Length of the common prefix of two token arrays (bulk numpy comparison)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    # Most pairs differ early: compare a short head before the rest.
    head = min(n, 256)
    neq = a[:head] != b[:head]
    i = int(neq.argmax())
    if neq[i]:
        return i
    if head == n:
        return n
    neq = a[head:n] != b[head:n]
    i = int(neq.argmax())
    return head + i if neq[i] else n


class TreeNode:
    """A tree segment. ``parent is None`` for the root and for nodes no longer in the tree."""

    __slots__ = (
        "child_key",
        "children",
        "creation_time",
        "hit_count",
        "id",
        "key",
        "last_access_time",
        "lock_ref",
        "namespace",
        "parent",
        "priority",
        "slot",
        "subtree_key",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: TokenArray,
        value: SlotArray,
        parent: TreeNode | None,
        namespace: Namespace,
        now: int,
        priority: int = 0,
        child_key: Hashable = None,
        subtree_key: Hashable = None,
    ) -> None:
        self.children: dict[Hashable, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority
        self.id = node_id
        self.namespace = namespace
        # Invariants while in the tree (both None for the root): ``parent.children[child_key]
        # is self``; ``subtree_key`` is the child_key of the top-level ancestor (self included),
        # which a split keeps (the upper part takes the same dict slot), so it never changes.
        self.child_key = child_key
        self.subtree_key = subtree_key
        # Orders siblings as their parent's dict does (a node's place in it is taken when the
        # first node at that key is created; the upper part of a split inherits it).
        self.slot = node_id

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = self.key[:4].tolist()
        more = "..." if len(self.key) > 4 else ""
        return f"TreeNode(id={self.id}, key={head}{more} len={len(self.key)}, lock={self.lock_ref})"


class _Query(NamedTuple):
    tokens: TokenArray  # page-aligned, contiguous int32
    namespace: Namespace


def _normalise_namespace(ns: Namespace) -> Namespace:
    """(None, None) and an empty cache salt mean the default namespace / no salt."""
    if ns is None:
        return None
    extra, salt = ns
    if salt == "":
        salt = None
    if extra is None and salt is None:
        return None
    return (extra, salt)


class RadixCache(BasePrefixCache):
    def __init__(
        self,
        allocator: SlotFreer | None,
        page_size: int = 1,
        eviction_policy: str = DEFAULT_EVICTION_POLICY,
        disable: bool = False,
        compat_sglang: bool = False,
        on_evict: Callable[[CacheKey, int], None] | None = None,
        split_copies: bool = True,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        # A split copies both halves, so that each owns its memory and an evicted half frees
        # it; a tree that never evicts (the optimal bound's) keeps views instead.
        self.split_copies = split_copies
        self.disabled = disable
        self.compat_sglang = compat_sglang
        self.on_evict = on_evict
        # A disabled tree always uses LRU (as SGLang's); the name is still validated.
        strategy = get_strategy(eviction_policy)
        self.eviction_policy = DEFAULT_EVICTION_POLICY if disable else strategy.name
        self.strategy: EvictionStrategy = (
            get_strategy(self.eviction_policy) if disable else strategy
        )
        self._ids = itertools.count()
        self._clock = 0
        self._root = self._new_root()
        self._evictable_size = 0
        self._protected_size = 0
        # Live nodes with lock_ref == 0 and no children (the root never).
        self._evictable_leaves: set[TreeNode] = set()
        # For monotone strategies, one heap of (priority, id, leaf) kept across evictions:
        # entries go stale (the leaf was locked, grew a child, was evicted, or its priority
        # rose) and are skipped or re-pushed when popped. Every evictable leaf always has an
        # entry whose priority is <= its current one, so the first valid pop is the minimum.
        self._heap: list[tuple[Any, int, TreeNode]] = []
        self._heap_persistent = self.strategy.monotone
        # Told of every change that can change a match (see ``CacheListener``).
        self.listener: CacheListener | None = None

    # ---- construction ---------------------------------------------------------------------
    def _new_root(self) -> TreeNode:
        root = TreeNode(next(self._ids), EMPTY_TOKENS, EMPTY_SLOTS, None, None, self._clock)
        root.priority = _ROOT_PRIORITY
        root.lock_ref = 1  # never evicted, never unlocked
        return root

    @property
    def root(self) -> TreeNode:
        return self._root

    def reset(self) -> None:
        """Drop the whole tree, returning every held slot to the allocator. Refuses while any
        node is locked (a running request still uses those slots)."""
        if self._protected_size:
            raise RuntimeError(
                f"reset with {self._protected_size} locked tokens: release all requests first"
            )
        values = self.all_values()
        for node in self._iter_nodes():
            node.parent = None  # stale handles are detected as "not in the tree"
        self._root = self._new_root()
        self._evictable_size = 0
        self._protected_size = 0
        self._evictable_leaves = set()
        self._heap = []
        if self.allocator is not None and values.size:
            self.allocator.free(values)
        if self.listener is not None:
            self.listener.on_reset()

    # ---- helpers -----------------------------------------------------------------------------
    def _query(self, key: CacheKey) -> _Query:
        tokens = key.tokens
        if tokens.dtype != np.int32 or not tokens.flags.c_contiguous:
            tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        p = self.page_size
        n = len(tokens)
        if n % p:
            tokens = tokens[: n - n % p]
        ns = key.namespace
        return _Query(tokens, None if ns is None else _normalise_namespace(ns))

    def subtree_key(self, key: CacheKey) -> Hashable | None:
        """The root-level child key ``key`` would be matched under (None: shorter than a
        page). Constant for a request whose prompt is at least one page long."""
        tokens = key.tokens
        p = self.page_size
        if len(tokens) < p:
            return None
        first = np.ascontiguousarray(tokens[:p], dtype=np.int32).tobytes()
        ns = key.namespace
        return first if ns is None else (_normalise_namespace(ns), first)

    def _mark_evictable(self, node: TreeNode) -> None:
        self._evictable_leaves.add(node)
        if self._heap_persistent:
            heapq.heappush(self._heap, (self.strategy.priority(node), node.id, node))

    def _child_key(self, parent: TreeNode, first_page: bytes, ns: Namespace) -> Hashable:
        if parent is self._root and ns is not None:
            return (ns, first_page)
        return first_page

    def _mismatch(self, tokens: TokenArray, pos: int, node: TreeNode) -> int:
        """Page-rounded match length of ``node.key`` against ``tokens[pos:]``, knowing the node
        does not match whole. At least one page (the child was found by its first page)."""
        m = longest_common_prefix(tokens[pos:], node.key)
        return m - m % self.page_size

    def _split(self, child: TreeNode, m: int, now: int) -> TreeNode:
        """Split ``child`` at ``m`` (0 < m < len, page-aligned); return the new upper node.

        The upper node takes the child's place in the parent's dict (same key, same position)
        and inherits lock_ref, priority and hit_count, so sizes, lock sums and the leaf set
        stay valid; the child keeps the tail and every handle to it stays meaningful."""
        parent = child.parent
        assert parent is not None
        key, value = child.key, child.value
        head_key, head_value, key, value = key[:m], value[:m], key[m:], value[m:]
        if self.split_copies:
            head_key, head_value = head_key.copy(), head_value.copy()
            key, value = key.copy(), value.copy()
        new = TreeNode(
            next(self._ids),
            head_key,
            head_value,
            parent,
            child.namespace,
            now,
            child.priority,
            child.child_key,
            child.subtree_key,
        )
        new.lock_ref = child.lock_ref
        new.hit_count = child.hit_count
        new.slot = child.slot
        if not self.compat_sglang:
            new.creation_time = child.creation_time
        parent.children[child.child_key] = new
        child.key, child.value = key, value
        child.parent = new
        child.child_key = child.key[: self.page_size].tobytes()
        new.children[child.child_key] = child
        if self.listener is not None:
            self.listener.on_split(new, child)
        return new

    def _walk(self, q: _Query, collect: bool) -> tuple[TreeNode, int, list[SlotArray]]:
        """The match walk shared by match_prefix and touch_prefix: refreshes access times,
        splits at a partial match. Returns (last node, matched length, value segments)."""
        self._clock += 1
        now = self._clock
        root = self._root
        root.last_access_time = now
        tokens, ns = q
        n = len(tokens)
        values: list[SlotArray] = []
        if n == 0:
            return root, 0, values
        p = self.page_size
        first = tokens[:p].tobytes()
        child = root.children.get(first if ns is None else (ns, first))
        node = root
        pos = 0
        while child is not None:
            child.last_access_time = now
            klen = len(child.key)
            # The query's span under this node plus its next page (absent at the query's end:
            # both n and pos + klen are page multiples, so a full next page exists or none).
            seg = tokens[pos : pos + klen + p].tobytes()
            if seg.startswith(child.key):  # type: ignore[arg-type]
                node = child
                pos += klen
                if collect:
                    values.append(child.value)
                if pos == n:
                    break
                child = node.children.get(seg[klen * _TOKEN_BYTES :])
            else:
                m = self._mismatch(tokens, pos, child)
                node = self._split(child, m, now)
                pos += m
                if collect:
                    values.append(node.value)
                break
        return node, pos, values

    # ---- match / touch / insert -------------------------------------------------------------
    def match_prefix(self, key: CacheKey) -> MatchResult:
        """Longest cached page-aligned prefix; refreshes recency and splits a partially matched
        node so ``last_node`` ends exactly at the match. Lock ``last_node`` before using
        ``indices``."""
        if self.disabled or len(key.tokens) == 0:
            return MatchResult(EMPTY_SLOTS, 0, self._root)
        node, pos, values = self._walk(self._query(key), collect=True)
        if not values:
            indices = EMPTY_SLOTS
        elif len(values) == 1:
            indices = values[0].copy()  # never hand out the node's own array
        else:
            indices = np.concatenate(values)
        return MatchResult(indices, pos, node)

    def match_node(self, key: CacheKey) -> MatchResult:
        """``match_prefix`` without gathering the matched slots (``indices`` is empty)."""
        if self.disabled or len(key.tokens) == 0:
            return MatchResult(EMPTY_SLOTS, 0, self._root)
        node, pos, _ = self._walk(self._query(key), collect=False)
        return MatchResult(EMPTY_SLOTS, pos, node)

    def prefix_slots(self, node: TreeNode, length: int, out: SlotArray | None = None) -> SlotArray:
        # The path's node values, root first: what _walk collected (a split since only cuts
        # a value in two, and the caller's lock keeps the path from eviction).
        root = self._root
        parts: list[SlotArray] = []
        held = 0
        while node is not root:
            parts.append(node.value)
            held += len(node.value)
            node = node.parent  # type: ignore[assignment]
        if held != length:
            raise IntegrityError(f"prefix of {length} tokens but its path holds {held}")
        if out is not None and len(out) != length:
            raise ValueError(f"prefix_slots: out holds {len(out)} slots for {length} tokens")
        if out is None:
            if not parts:
                return EMPTY_SLOTS.copy()
            if len(parts) == 1:
                return parts[0].copy()
            parts.reverse()
            return np.concatenate(parts)
        end = length
        for value in parts:  # deepest first: fill from the end
            out[end - len(value) : end] = value
            end -= len(value)
        return out

    def match_len(self, key: CacheKey) -> int:
        """Matched length only: no split, no indices, no recency update."""
        return self.match_end(key).length

    def match_end(self, key: CacheKey, start: tuple[TreeNode, int] | None = None) -> MatchEnd:
        """Where the match ends, read-only like ``match_len``: the node holding the match's last
        token (the root for no match) and how many of that node's tokens matched.
        ``start=(node, depth)``: a node in the tree whose path spells ``key``'s first ``depth``
        tokens (the caller knows it does); the walk compares from there on only."""
        root = self._root
        if self.disabled:
            return MatchEnd(0, root, 0)
        tokens, ns = self._query(key)
        n = len(tokens)
        node, pos = start if start is not None else (root, 0)
        if pos >= n:
            return MatchEnd(pos, node, len(node.key)) if n else MatchEnd(0, root, 0)
        p = self.page_size
        first = tokens[pos : pos + p].tobytes()
        child = node.children.get(first if ns is None or node is not root else (ns, first))
        while child is not None:
            klen = len(child.key)
            seg = tokens[pos : pos + klen + p].tobytes()
            if not seg.startswith(child.key):  # type: ignore[arg-type]
                m = self._mismatch(tokens, pos, child)
                return MatchEnd(pos + m, child, m)
            node, pos = child, pos + klen
            if pos == n:
                break
            child = node.children.get(seg[klen * _TOKEN_BYTES :])
        return MatchEnd(pos, node, len(node.key))

    def touch_at(self, node: TreeNode, offset: int) -> TreeNode:
        """What ``match_node`` (and ``touch_prefix``) of a key does when its match ends
        ``offset`` tokens into ``node`` (``match_end``'s answer, still current): a clock tick,
        the path's recency, and a split where the match ends inside a node. Returns the node
        that ends where the match ends (``match_node``'s ``last_node``)."""
        self._clock += 1
        now = self._clock
        root = self._root
        root.last_access_time = now
        cur = node
        while cur is not root:
            cur.last_access_time = now
            cur = cur.parent  # type: ignore[assignment]  # attached: reaches the root
        if offset < len(node.key):
            return self._split(node, offset, now)
        return node

    def touch_prefix(self, key: CacheKey) -> None:
        """Refresh recency along the matched path (may split, like match_prefix)."""
        if self.disabled or len(key.tokens) == 0:
            return
        self._walk(self._query(key), collect=False)

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
        """Insert the page-aligned key with ``values[:aligned_len]``.

        Returns ``prefix_len``: tokens that were already cached. The caller keeps ownership of
        ``values[:prefix_len]`` (duplicates: it must free them) and of anything past the aligned
        length; the cache owns ``values[prefix_len:aligned_len]`` from now on. ``priority``
        raises the priority of every node on the path (max, never lowered). ``inserted_len`` is
        how far this request already inserted: a node counts a hit only for tokens past it.

        ``start=(node, depth)``: a node the caller holds a lock on, whose path from the root
        spells the key's first ``depth`` tokens (a request's ``lock_node`` and its
        ``cache_protected_len``). The walk then compares tokens from there on only; the nodes
        above get exactly the updates a full walk gives them. The depth is checked against the
        path (IntegrityError), the tokens are not. ``from_start``: ``key`` and ``values`` hold
        only the positions from that depth on (the caller need not assemble the prefix the
        start node spells); lengths in the result still count from the root.

        ``adopt``: new nodes may keep views of ``key.tokens`` and ``values`` instead of copies.
        The caller promises never to write those positions of either array again (a request's
        prompt and its KV row's computed positions: slots are appended past them, never
        rewritten)."""
        if self.disabled:
            return InsertResult(0, self._root)
        if from_start and (start is None or start[0] is self._root):
            raise ValueError("insert(from_start=True) needs a start node below the root")
        base = start[1] if from_start else 0
        return self._insert(self._query(key), values, priority, inserted_len, start, base, adopt)

    def _insert(
        self,
        q: _Query,
        values: SlotArray,
        priority: int,
        inserted_len: int,
        start: tuple[TreeNode, int] | None = None,
        base: int = 0,
        adopt: bool = False,
    ) -> InsertResult:
        """The insert walk (``insert`` after its argument checks). ``q.tokens`` and ``values``
        hold the key's positions from ``base`` on (``base`` > 0 only with ``start`` at that
        depth); ``pos`` counts from the root, ``pos - base`` indexes them."""
        root = self._root
        tokens, ns = q
        n = base + len(tokens)
        if len(values) < n - base:
            raise ValueError(f"insert: {len(values)} values for a {n - base}-token (aligned) key")
        self._clock += 1
        now = self._clock
        root.last_access_time = now
        if priority > root.priority:
            root.priority = priority
        if n == 0:
            return InsertResult(0, root)
        p = self.page_size
        pb = p * _TOKEN_BYTES
        if start is not None and start[0] is not root and start[1] <= n:
            node, pos = start
            if pos < base:
                raise ValueError(f"insert: the key starts at {base}, past the start depth {pos}")
            self._touch_path_up(node, pos, now, priority, inserted_len)
            if pos == n:
                return InsertResult(pos, node)
            top_key = node.subtree_key
            ckey: Hashable = tokens[pos - base : pos - base + p].tobytes()
        elif base:
            raise ValueError(f"insert: a key starting at {base} needs a start node at that depth")
        else:
            first = tokens[:p].tobytes()
            ckey = first if ns is None else (ns, first)
            top_key = ckey
            node = root
            pos = 0
        child = node.children.get(ckey)
        while child is not None:
            child.last_access_time = now
            klen = len(child.key)
            rel = pos - base
            seg = tokens[rel : rel + klen + p].tobytes()  # span + next page, as in _walk
            split = not seg.startswith(child.key)  # type: ignore[arg-type]
            if split:
                m = self._mismatch(tokens, rel, child)
                node = self._split(child, m, now)
            else:
                m = klen
                node = child
            pos += m
            if priority > node.priority:
                node.priority = priority
            if pos > inserted_len:
                node.hit_count += 1
            if pos == n:
                return InsertResult(pos, node)
            # The next page lies inside seg: m + p <= klen after a split (both page multiples).
            off = m * _TOKEN_BYTES
            ckey = seg[off : off + pb]
            if split:
                break  # the remainder's first page differs from the split-off child's
            child = node.children.get(ckey)
        leaf_key = tokens[pos - base :]
        leaf_value = values[pos - base : n - base]
        if not adopt or leaf_value.dtype != np.int64:
            leaf_key = leaf_key.copy()
            leaf_value = np.array(leaf_value, dtype=np.int64)
        leaf = TreeNode(
            next(self._ids), leaf_key, leaf_value, node, ns, now, priority, ckey, top_key
        )
        if n > inserted_len:
            leaf.hit_count = 1
        if not node.children and node.lock_ref == 0:
            self._evictable_leaves.discard(node)
        node.children[ckey] = leaf
        if self.listener is not None:
            self.listener.on_child(node, ckey)
        self._evictable_size += n - pos
        self._mark_evictable(leaf)
        return InsertResult(pos, leaf)

    def _touch_path_up(
        self, node: TreeNode, depth: int, now: int, priority: int, inserted_len: int
    ) -> None:
        """What the insert walk does to each node from the root down to ``node`` (which ends
        at ``depth``), done from ``node`` up: recency, priority, hit counts."""
        if node.parent is None:
            raise IntegrityError(f"insert start {node!r} is not in the tree")
        root = self._root
        pos = depth
        while node is not root:
            node.last_access_time = now
            if priority > node.priority:
                node.priority = priority
            if pos > inserted_len:
                node.hit_count += 1
            pos -= len(node.key)
            node = node.parent  # attached: reaches the root
        if pos != 0:
            raise IntegrityError(f"insert start at depth {depth} ends at {depth - pos} tokens")

    # ---- locks -----------------------------------------------------------------------------
    def _check_attached(self, node: TreeNode) -> None:
        if node.parent is None and node is not self._root:
            raise ValueError(f"{node!r} is not in the tree (evicted, or from before a reset)")

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock ``node`` and its ancestors (excluding the root). Returns the change of
        ``evictable_size()`` (<= 0)."""
        if self.disabled:
            return 0
        self._check_attached(node)
        root = self._root
        if node is root:
            return 0
        if node.lock_ref == 0 and not node.children:
            self._evictable_leaves.discard(node)
        moved = 0
        while node is not root:
            if node.lock_ref == 0:
                moved += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # attached => reaches the root
        self._evictable_size -= moved
        self._protected_size += moved
        return -moved

    def move_lock(self, old: TreeNode | None, new: TreeNode) -> None:
        """``inc_lock_ref(new)`` then ``dec_lock_ref(old)`` (when ``old`` is not None), with the
        same result. When ``new`` lies below ``old`` (a request's lock moving down to the end
        of its latest checkpoint) only the nodes in between change, and the path above ``old``
        is not walked twice."""
        if old is None or old is new or self.disabled:
            super().move_lock(old, new)
            return
        self._check_attached(new)
        root = self._root
        between: list[TreeNode] = []
        node = new
        while node is not old:
            if node is root:  # not below old: lock the new path, then release the old one
                super().move_lock(old, new)
                return
            between.append(node)
            node = node.parent  # type: ignore[assignment]  # attached => reaches the root
        if old.lock_ref <= 0:
            raise IntegrityError(f"dec_lock_ref on unlocked {old!r}")
        if new.lock_ref == 0 and not new.children:
            self._evictable_leaves.discard(new)
        moved = 0
        for node in between:
            if node.lock_ref == 0:
                moved += len(node.key)
            node.lock_ref += 1
        self._evictable_size -= moved
        self._protected_size += moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Release one lock taken by ``inc_lock_ref(node)``. Returns the change of
        ``evictable_size()`` (>= 0)."""
        if self.disabled:
            return 0
        self._check_attached(node)
        root = self._root
        if node is root:
            return 0
        if node.lock_ref <= 0:
            raise IntegrityError(f"dec_lock_ref on unlocked {node!r}")
        start = node
        moved = 0
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                moved += len(node.key)
            node = node.parent  # type: ignore[assignment]
        if start.lock_ref == 0 and not start.children:
            self._mark_evictable(start)
        self._evictable_size += moved
        self._protected_size -= moved
        return moved

    # ---- eviction ------------------------------------------------------------------------------
    def _path_key(self, node: TreeNode) -> CacheKey:
        parts: list[TokenArray] = []
        cur: TreeNode | None = node
        while cur is not None and cur is not self._root:
            parts.append(cur.key)
            cur = cur.parent
        parts.reverse()
        tokens = np.concatenate(parts) if parts else EMPTY_TOKENS
        return CacheKey(tokens, node.namespace)

    def evict(self, num_tokens: int) -> int:
        """Free at least ``min(num_tokens, evictable_size())`` tokens from unlocked leaves in
        strategy order; returns the number freed (see the module note for the overshoot)."""
        freed = self.evict_reclaim(num_tokens)
        if not freed:
            return 0
        out = freed[0] if len(freed) == 1 else np.concatenate(freed)
        if self.allocator is not None:
            # Node values are allocated slots by the tree's invariant (check_integrity).
            self.allocator.free(out, checked=False)
        return len(out)

    def evict_reclaim(self, num_tokens: int) -> list[SlotArray]:
        """The eviction of ``evict``; returns the evicted nodes' slots (segments, in eviction
        order) without freeing them."""
        if self.disabled or num_tokens <= 0 or not self._evictable_leaves:
            return []
        prio = self.strategy.priority
        leaves = self._evictable_leaves
        if not self._heap_persistent or len(self._heap) > 4 * len(leaves) + 64:
            self._heap = [(prio(leaf), leaf.id, leaf) for leaf in leaves]
            heapq.heapify(self._heap)
        heap = self._heap
        heappop = heapq.heappop
        heappush = heapq.heappush
        listener = self.listener
        on_evict = self.on_evict
        partial = not self.compat_sglang
        root = self._root
        p = self.page_size
        freed: list[SlotArray] = []
        evicted = 0
        while evicted < num_tokens and heap:
            stored, _, leaf = heappop(heap)
            if leaf not in leaves:
                continue  # stale: locked, grew a child or already evicted
            current = prio(leaf)
            if current != stored:
                heappush(heap, (current, leaf.id, leaf))
                continue
            length = len(leaf.key)
            remaining = num_tokens - evicted
            if length > remaining and partial:
                cut = -(-remaining // p) * p
                if cut < length:
                    # Evict only the tail: the leaf stays, shorter, still an evictable leaf.
                    if on_evict is not None:
                        on_evict(self._path_key(leaf), cut)
                    keep = length - cut
                    if listener is not None:
                        listener.on_evict(leaf, keep)
                    freed.append(leaf.value[keep:])
                    # Prefix views of the node's own arrays (no copy): nothing else refers to
                    # them, and the freed tail is only read by the allocator.
                    leaf.key = leaf.key[:keep]
                    leaf.value = leaf.value[:keep]
                    self._evictable_size -= cut
                    evicted += cut
                    heappush(heap, (current, leaf.id, leaf))
                    break
            if on_evict is not None:
                on_evict(self._path_key(leaf), length)
            freed.append(leaf.value)
            if listener is not None:
                listener.on_evict(leaf, 0)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.child_key]
            leaf.parent = None
            leaves.remove(leaf)
            self._evictable_size -= length
            evicted += length
            if parent is not root and not parent.children and parent.lock_ref == 0:
                leaves.add(parent)
                heappush(heap, (prio(parent), parent.id, parent))
        if not self._heap_persistent:
            self._heap = []  # rebuilt on every call: hold no nodes in between
        return freed

    # ---- sizes ---------------------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def num_evictable_leaves(self) -> int:
        return len(self._evictable_leaves)

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children (children in dict order)."""
        stack = list(reversed(self._root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    def num_nodes(self) -> int:
        return sum(1 for _ in self._iter_nodes())

    def all_values(self) -> SlotArray:
        parts = [node.value for node in self._iter_nodes()]
        return np.concatenate(parts) if parts else EMPTY_SLOTS.copy()

    # ---- DFS-weight order ----------------------------------------------------------------------
    def dfs_weight_order(self, nodes: list[TreeNode]) -> list[int]:
        """``dfs_weight_order_at`` of matches that end where each node ends."""
        return self.dfs_weight_order_at([(n, len(n.key) if n is not None else 0) for n in nodes])

    def dfs_weight_order_at(self, ends: Sequence[tuple[TreeNode, int]]) -> list[int]:
        """Permutation of ``range(len(ends))``, SGLang's dfs-weight order, for matches ending
        ``offset`` tokens into ``node``: depth-first from the root, children by descending
        request count (ties: child creation order); after a node's subtree, the matches ending
        at its end, then those ending inside it, deepest first, each group in original order.
        That is the order the tree would give had every match split its node where it ends (a
        split is a chain with one child per split point), without splitting. Handles not in the
        tree come last."""
        root = self._root
        at_end: dict[TreeNode, list[int]] = {}
        inside: dict[TreeNode, dict[int, list[int]]] = {}
        orphans: list[int] = []
        for i, (node, offset) in enumerate(ends):
            cur: TreeNode | None = node
            while cur is not root and cur is not None:
                cur = cur.parent
            if cur is not root or node is None:
                orphans.append(i)
            elif offset >= len(node.key):
                at_end.setdefault(node, []).append(i)
            else:
                inside.setdefault(node, {}).setdefault(offset, []).append(i)
        weight: dict[TreeNode, int] = {}
        for node in {*at_end, *inside}:
            c = len(at_end.get(node, ())) + sum(map(len, inside.get(node, {}).values()))
            cur = node
            while cur is not None:
                weight[cur] = weight.get(cur, 0) + c
                cur = cur.parent
        order: list[int] = []
        stack: list[tuple[TreeNode, bool]] = [(root, False)] if root in weight else []
        while stack:  # iterative post-order: (node, expanded?)
            node, expanded = stack.pop()
            if expanded:
                order.extend(at_end.get(node, ()))
                for offset in sorted(inside.get(node, {}), reverse=True):
                    order.extend(inside[node][offset])
                continue
            stack.append((node, True))
            kids = [c for c in node.children.values() if c in weight]
            kids.sort(key=lambda c: -weight[c])  # stable: ties keep creation order
            stack.extend((c, False) for c in reversed(kids))
        order.extend(orphans)
        return order

    # ---- integrity -----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Recompute everything by a walk and compare with the counters; raise with numbers."""
        root = self._root
        p = self.page_size
        if root.lock_ref != 1 or root.parent is not None or len(root.key):
            raise IntegrityError(f"root corrupt: lock_ref={root.lock_ref}, key len {len(root.key)}")
        if self.disabled:
            if root.children or self._evictable_size or self._protected_size:
                raise IntegrityError("disabled cache holds nodes or sizes")
            return
        evictable = protected = 0
        leaves: set[TreeNode] = set()
        n_values = 0
        for node in self._iter_nodes():
            parent = node.parent
            klen = len(node.key)
            if parent is None:
                raise IntegrityError(f"{node!r} in the tree has parent None")
            if klen == 0 or klen % p:
                raise IntegrityError(f"{node!r}: key length {klen} not a positive multiple of {p}")
            if len(node.value) != klen:
                raise IntegrityError(f"{node!r}: {len(node.value)} values for {klen} tokens")
            if node.key.dtype != np.int32 or node.value.dtype != np.int64:
                raise IntegrityError(f"{node!r}: dtypes {node.key.dtype}/{node.value.dtype}")
            ck = self._child_key(parent, node.key[:p].tobytes(), node.namespace)
            if parent.children.get(ck) is not node:
                raise IntegrityError(f"{node!r} not under its own first-page key in its parent")
            if node.child_key != ck:
                raise IntegrityError(f"{node!r}: stored child_key differs from its first page")
            top = ck if parent is root else parent.subtree_key
            if node.subtree_key != top:
                raise IntegrityError(f"{node!r}: stored subtree_key differs from its top's key")
            if parent is not root and parent.namespace != node.namespace:
                raise IntegrityError(f"{node!r}: namespace differs from its parent's")
            if node.lock_ref < 0:
                raise IntegrityError(f"{node!r}: negative lock_ref {node.lock_ref}")
            slots = [c.slot for c in node.children.values()]
            if any(map(operator.ge, slots, slots[1:])):
                raise IntegrityError(f"{node!r}: children's slots are not in dict order")
            child_locks = sum(c.lock_ref for c in node.children.values())
            if node.lock_ref < child_locks:
                raise IntegrityError(
                    f"{node!r}: lock_ref {node.lock_ref} < sum of children's {child_locks}"
                )
            if node.lock_ref == 0:
                evictable += klen
                if not node.children:
                    leaves.add(node)
            else:
                protected += klen
            n_values += klen
        if evictable != self._evictable_size or protected != self._protected_size:
            raise IntegrityError(
                f"sizes: walk evictable {evictable} / protected {protected}, counters "
                f"{self._evictable_size} / {self._protected_size}"
            )
        if leaves != self._evictable_leaves:
            raise IntegrityError(
                f"evictable leaves: walk {len(leaves)}, set {len(self._evictable_leaves)}, "
                f"missing {len(leaves - self._evictable_leaves)}, "
                f"extra {len(self._evictable_leaves - leaves)}"
            )
        values = self.all_values()
        n_unique = int(np.unique(values).size)
        if n_unique != n_values:
            raise IntegrityError(f"{n_values - n_unique} KV slot(s) held by two tree positions")

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, policy={self.eviction_policy}, "
            f"disabled={self.disabled}, compat_sglang={self.compat_sglang}, "
            f"evictable={self._evictable_size}, protected={self._protected_size})"
        )
