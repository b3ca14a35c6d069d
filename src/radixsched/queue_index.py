"""Incremental per-round state for the cache-aware policies (radixsched mode).

SGLang re-matches every waiting request against the radix tree on every prefill round, and
rebuilds its in-batch dedup from scratch. Under load the queue holds hundreds or thousands of
requests and most of that work repeats last round's answer. Here a round only touches:

* requests new to the queue (or re-queued with new output: the scheduler calls
  ``SchedulePolicy.forget`` then);
* requests in a top-level cache subtree that changed since the last round (the radix cache
  logs every bump of a subtree: a new leaf, an eviction, a reset);
* requests that left the queue.

``MatchIndex.refresh`` returns exactly those, with ``num_matched_prefix_tokens`` and the
uncapped device match (``match_memo[2]``) up to date for every queued request. ``DedupIndex``
keeps the in-batch dedup groups (requests sharing their first ``width`` tokens among those with
a match of at most ``check`` tokens) and their representatives, re-deciding only the groups
those requests belong to.

Equivalence with the full recomputation is a tested property (tests/test_queue_index.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from radixsched.cache.base import BasePrefixCache, CacheKey, Namespace
from radixsched.request import Req


class MatchIndex:
    def __init__(self, cache: BasePrefixCache, need_node: bool = False) -> None:
        self.cache = cache
        # dfs-weight orders on the node each match ends at. A memoised node stays right while
        # its subtree is unchanged: a split keeps the matched node as the lower part, which
        # still ends where the match ends; inserts and evictions bump the subtree.
        self.need_node = need_node
        self.cursor = cache.change_cursor()
        # Keyed by object identity: the dict keeps every tracked request alive, so an id can
        # never be reused by another request while it is tracked.
        self.tracked: dict[int, Req] = {}
        self.by_subtree: dict[Hashable, set[int]] = {}
        # Requests whose prompt is shorter than a page have no stable subtree: redone each round.
        self.unkeyed: set[int] = set()
        # Tracked requests ``forget`` dropped since the last refresh: one no longer queued at
        # the refresh left the queue, and the dedup groups must hear of it like of any other.
        self.forgotten: dict[int, Req] = {}

    def forget(self, r: Req) -> None:
        """``r`` changed while out of sight (re-queued with new output): treat it as new."""
        if id(r) in self.tracked:
            self._drop(id(r))
            self.forgotten[id(r)] = r

    def _drop(self, key: int) -> None:
        r = self.tracked.pop(key)
        if key in self.unkeyed:
            self.unkeyed.discard(key)
            return
        bucket = self.by_subtree.get(r.subtree_key)
        if bucket is not None:
            bucket.discard(key)
            if not bucket:
                del self.by_subtree[r.subtree_key]

    def _match(self, r: Req) -> None:
        fill = r.fill_ids()
        if self.need_node:
            res = self.cache.match_node(CacheKey(fill, r.namespace))
            n = res.device_len
            r.prefix_len = n
            r.last_node = res.last_node
            r.host_hit_len = res.host_len
        else:
            n = self.cache.match_len(CacheKey(fill, r.namespace))
        cap = len(fill) - 1
        r.num_matched_prefix_tokens = n if n < cap else cap
        r.match_memo = (-1, len(r.output_ids), n)

    def refresh(self, queue: Sequence[Req]) -> tuple[list[Req], list[Req]]:
        """Bring every queued request's match up to date; return (requests whose match may
        have changed, new ones included; requests that left the queue). O(len(queue)): the
        queue is compared with the tracked set."""
        cur = {id(r): r for r in queue}
        tracked = self.tracked
        gone = [tracked[k] for k in tracked.keys() - cur.keys()]
        for r in gone:
            self._drop(id(r))
        gone.extend(r for k, r in self.forgotten.items() if k not in cur)
        self.forgotten = {}
        return self._rematch([cur[k] for k in cur.keys() - tracked.keys()]), gone

    def apply(self, added: Sequence[Req], removed: Sequence[Req]) -> list[Req]:
        """``refresh`` fed by the scheduler's hooks instead of a comparison: ``added`` are
        queued requests not tracked (new, or forgotten), ``removed`` left the queue, every
        other queued request is tracked. Returns the requests whose match may have changed."""
        for r in removed:
            if id(r) in self.tracked:
                self._drop(id(r))
        self.forgotten = {}  # those that left are in ``removed``
        return self._rematch(added)

    def _rematch(self, new: Sequence[Req]) -> list[Req]:
        """Track ``new`` and re-match it, plus every tracked request whose subtree changed."""
        tracked = self.tracked
        changes, self.cursor = self.cache.changes_since(self.cursor)
        todo: dict[int, Req]
        if changes is None:
            todo = dict(tracked)
        else:
            todo = {}
            by_subtree = self.by_subtree
            for key in set(changes):
                bucket = by_subtree.get(key)
                if bucket:
                    todo.update((k, tracked[k]) for k in bucket)
            if self.unkeyed:
                todo.update((k, tracked[k]) for k in self.unkeyed)
            if not todo and not new:
                return []
        page = self.cache.page_size
        cache = self.cache
        reuse = not self.need_node and cache.supports_match_memo
        fresh: list[Req] = []  # new requests whose memo (the scheduler's match at the door) holds
        for r in new:
            k = id(r)
            tracked[k] = r
            if r.subtree_key is None and len(r.prompt_ids) >= page:
                r.subtree_key = cache.subtree_key(CacheKey(r.prompt_ids, r.namespace))
            if r.subtree_key is None:
                self.unkeyed.add(k)
            else:
                self.by_subtree.setdefault(r.subtree_key, set()).add(k)
            memo = r.match_memo
            if (
                reuse
                and k not in todo
                and memo is not None
                and r.subtree_key is not None
                and memo[1] == len(r.output_ids)
                and memo[0] == cache.subtree_epoch(r.subtree_key)
            ):
                cap = len(r.prompt_ids) + memo[1] - 1
                r.num_matched_prefix_tokens = memo[2] if memo[2] < cap else cap
                fresh.append(r)
            else:
                todo[k] = r
        for r in todo.values():
            self._match(r)
        if fresh:
            return [*todo.values(), *fresh]
        return list(todo.values())


class DedupIndex:
    """Groups and representatives of the radixsched in-batch dedup (see ``policy``)."""

    def __init__(self, check: int, width: int, rep_key: Callable[[Req], Any]) -> None:
        self.check = check
        self.width = width
        self.rep_key = rep_key
        self.groups: dict[tuple[Namespace, bytes], dict[str, Req]] = {}
        self.group_of: dict[str, tuple[Namespace, bytes]] = {}
        self.deferred_by_group: dict[tuple[Namespace, bytes], set[str]] = {}
        self.deferred: set[str] = set()
        self._frozen: frozenset[str] = frozenset()  # == deferred, rebuilt only when it changes
        self.flipped: list[Req] = []

    def _key(self, r: Req) -> tuple[Namespace, bytes] | None:
        width = self.width
        if len(r.prompt_ids) >= width:
            cached = r.dedup_key
            if cached is None or cached[0] != width:
                cached = (width, (r.namespace, r.prompt_ids[:width].tobytes()))
                r.dedup_key = cached
            key: tuple[Namespace, bytes] = cached[1]
            return key
        if r.fill_len >= width:
            return (r.namespace, r.fill_ids()[:width].tobytes())
        return None

    def _leave(self, rid: str, touched: set[tuple[Namespace, bytes]]) -> None:
        g = self.group_of.pop(rid, None)
        if g is not None:
            members = self.groups[g]
            del members[rid]
            touched.add(g)

    def update(self, changed: Sequence[Req], gone: Sequence[Req]) -> frozenset[str]:
        """Apply this round's changes; return the deferred (= deprioritized) rids. Afterwards
        ``flipped`` lists the queued requests whose deferred status changed (not those that
        left every group: they are in ``changed``)."""
        if not changed and not gone:
            self.flipped = []
            return self._frozen
        touched: set[tuple[Namespace, bytes]] = set()
        group_of, groups, check = self.group_of, self.groups, self.check
        for r in gone:
            self._leave(r.rid, touched)
        for r in changed:
            rid = r.rid
            if rid in group_of:
                self._leave(rid, touched)
            memo = r.match_memo
            assert memo is not None
            if memo[2] > check:
                continue
            g = self._key(r)
            if g is None:
                continue
            groups.setdefault(g, {})[rid] = r
            group_of[rid] = g
            touched.add(g)
        flips: set[str] = set()
        empty: set[str] = set()
        by_group = self.deferred_by_group
        for g in touched:
            old = by_group.pop(g, empty)
            members = self.groups.get(g)
            dup = empty
            if not members:
                self.groups.pop(g, None)
            elif len(members) >= 2:
                # min keeps the first of equals: members are in insertion order, which is the
                # order they joined the queue's tracked state, not queue position; so the key
                # must be total (it ends with queue entry time, arrival time, and the rid).
                rep_rid = min(members.values(), key=self.rep_key).rid
                dup = {rid for rid in members if rid != rep_rid}
                by_group[g] = dup
            if old != dup:  # invariant: deferred is the union of by_group's sets
                self.deferred -= old
                self.deferred |= dup
                flips |= old ^ dup
        self.flipped = [
            self.groups[self.group_of[rid]][rid] for rid in flips if rid in self.group_of
        ]
        if flips:
            self._frozen = frozenset(self.deferred)
        return self._frozen
