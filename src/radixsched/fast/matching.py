"""Incremental matching: each waiting request is re-matched only when its own match can have
changed, whatever the prefix structure (one shared system prompt included).

A request's match ends at a point of the tree: the end of a node it matched whole, or inside
a node (``MatchEnd``). Its *edge* is where the match would continue: ``(node, key of its next
page)`` after a whole node, ``(parent, child key)`` of the node it stops inside. The match can
change only when the tree changes at that edge, and the radix cache says so
(``CacheListener``):

- a new child at the edge (``on_child``): the match may grow;
- an eviction of the node the match ends in or past (``on_evict``): it may shrink;
- a split of the node the match ends inside (``on_split``): the length and the point are the
  same, but the point is now named by other nodes and the edge moves; no walk is needed;
- a reset: everything.

So a cache change under a shared system prompt re-matches only the requests whose next page
is the new branch's first page, not every request under the prompt. Invariant: every tracked
request is registered at exactly its current edge, and its ``Memo`` is what ``match_end`` of
its fill returns now, unless it is in ``dirty`` (it will be re-matched before it is read).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from radixsched.cache.base import CacheKey
from radixsched.cache.native_radix import RadixTree
from radixsched.cache.radix import TreeNode
from radixsched.request import Req


class Memo:
    """Where a request's match ends: ``n`` tokens, ending ``offset`` tokens into ``node``
    (``full``: at its end), and the edge it is registered at."""

    __slots__ = ("edge", "full", "n", "node", "offset")

    def __init__(self, n: int, node: TreeNode, offset: int, full: bool) -> None:
        self.n = n
        self.node = node
        self.offset = offset
        self.full = full
        self.edge: tuple[TreeNode, Hashable] | None = None


class IncrementalMatcher:
    """Tracks waiting requests' matches against one radix cache (it listens to it)."""

    def __init__(self, cache: RadixTree) -> None:
        self.cache = cache
        self.page = cache.page_size
        self.memo: dict[int, Memo] = {}  # id(req) -> its memo (tracked requests)
        self.reqs: dict[int, Req] = {}
        # edge node -> child key -> {id(req): req} registered there
        self.edges: dict[TreeNode, dict[Hashable, dict[int, Req]]] = {}
        self.dirty: dict[int, Req] = {}
        # Where a dirty request's re-match may start: a node on its path that the change left
        # in place, its depth, and its key length then (a shortened node is not trusted).
        self.hint: dict[int, tuple[TreeNode, int, int]] = {}
        cache.listener = self

    # ---- membership -------------------------------------------------------------------------
    def track(self, r: Req) -> Memo:
        """Start tracking ``r`` (new to the queue, or back with new output): match it now."""
        self.untrack(r)
        self.reqs[id(r)] = r
        return self._match(r)

    def untrack(self, r: Req) -> None:
        m = self.memo.pop(id(r), None)
        self.reqs.pop(id(r), None)
        self.dirty.pop(id(r), None)
        self.hint.pop(id(r), None)
        if m is not None:
            self._unregister(r, m)

    def refresh(self) -> list[Req]:
        """Re-match the dirty requests; return those whose match (length or end) moved."""
        moved = []
        dirty, self.dirty = self.dirty, {}
        hints, self.hint = self.hint, {}
        for k, r in dirty.items():
            old = self.memo[k]
            new = self._match(r, hints.get(k))
            if (old.n, old.node, old.offset, old.full) != (new.n, new.node, new.offset, new.full):
                moved.append(r)
        return moved

    # ---- matching ---------------------------------------------------------------------------
    def _match(self, r: Req, hint: tuple[TreeNode, int, int] | None = None) -> Memo:
        start = None
        if hint is not None:
            node, depth, klen = hint
            if node is self.cache.root or (node.parent is not None and len(node) == klen):
                start = (node, depth)
        end = self.cache.match_end(CacheKey(r.fill_ids(), r.namespace), start)
        m = Memo(end.length, end.node, end.offset, end.offset >= len(end.node))
        old = self.memo.get(id(r))
        if old is not None:
            self._unregister(r, old)
        self.memo[id(r)] = m
        self._register(r, m)
        return m

    def _register(self, r: Req, m: Memo) -> None:
        node: TreeNode = m.node
        if m.full:
            key = self._next_key(r, m.n, node)
            if key is None:  # the whole (aligned) fill matched: only an eviction can move it
                key = _END
        else:  # inside a node: the edge is that node's place under its parent
            assert node.parent is not None
            node, key = node.parent, node.child_key
        m.edge = (node, key)
        self.edges.setdefault(node, {}).setdefault(key, {})[id(r)] = r

    def _unregister(self, r: Req, m: Memo) -> None:
        if m.edge is None:
            return
        node, key = m.edge
        by_key = self.edges.get(node)
        if by_key is not None:
            regs = by_key.get(key)
            if regs is not None:
                regs.pop(id(r), None)
                if not regs:
                    del by_key[key]
                    if not by_key:
                        del self.edges[node]
        m.edge = None

    def _next_key(self, r: Req, n: int, node: TreeNode) -> Hashable | None:
        """The child key the match of ``r`` would continue at after ``n`` tokens (None: the
        page-aligned fill is exhausted)."""
        p = self.page
        if n + p > r.fill_len:
            return None
        page = r.fill_slice(n, n + p).tobytes()
        ns = r.namespace  # normalised already (Req drops an empty cache salt)
        if node is self.cache.root and ns is not None:
            return (ns, page)
        return page

    # ---- cache events (CacheListener) ---------------------------------------------------------
    def _mark_dirty(self, k: int, r: Req, node: TreeNode, depth: int) -> None:
        """``r`` must be re-matched; ``node`` (at ``depth``) is on its path and stays."""
        self.dirty[k] = r
        old = self.hint.get(k)
        if old is None or depth < old[1]:
            self.hint[k] = (node, depth, len(node))

    def on_child(self, parent: Any, child_key: Any) -> None:
        regs = self.edges.get(parent, {}).get(child_key)
        for k, r in (regs or {}).items():
            self._mark_dirty(k, r, parent, _edge_depth(self.memo[k]))

    def on_split(self, upper: Any, lower: Any) -> None:
        """Requests that stopped inside ``lower`` keep their length; re-point them (no walk)."""
        by_key = self.edges.get(upper.parent)
        regs = by_key.get(upper.child_key) if by_key else None
        if not regs:
            return
        cut = len(upper)
        for k, r in list(regs.items()):
            m = self.memo[k]
            if m.node is not lower or k in self.dirty:
                continue  # another node's registrant, or re-matched anyway
            self._unregister(r, m)
            if m.offset < cut:
                m.node = upper
            elif m.offset == cut:
                m.node, m.full = upper, True
            else:
                m.offset -= cut
            self._register(r, m)

    def on_evict(self, leaf: Any, keep: int) -> None:
        parent, size = leaf.parent, len(leaf)
        for at_leaf in self.edges.get(leaf, {}).values():  # matches through the whole leaf
            for k, r in at_leaf.items():
                self._mark_dirty(k, r, parent, _edge_depth(self.memo[k]) - size)
        inside = self.edges.get(parent, {}).get(leaf.child_key)
        for k, r in (inside or {}).items():  # matches inside the leaf, past what it keeps
            m = self.memo[k]
            if m.full or m.offset >= keep:
                self._mark_dirty(k, r, parent, _edge_depth(m))

    def on_reset(self) -> None:
        self.dirty.update(self.reqs)
        self.hint.clear()


_END = object()  # the edge key of a match that covers the whole aligned fill


def _edge_depth(m: Memo) -> int:
    """The depth at which ``m``'s edge node ends (the node itself, or the parent of the node
    the match stops inside)."""
    return m.n if m.full else m.n - m.offset
