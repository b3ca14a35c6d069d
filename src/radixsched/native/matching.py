"""``NativeMatcher``: incremental matching of the waiting queue, run in C++ inside the native
tree (``radixsched/_native/matcher.cpp``, where the invariants are spelled out).

Each waiting request is re-matched only when its own match can have changed: a match ends at a
point of the tree, and it can change only when the tree changes at the edge where it would
continue (a new child there, an eviction of the node it ends in or past, a split of the node
it ends inside, a reset). The tree tells the matcher of every change directly, without a call
into Python; the queue reads it through ``track``, ``untrack``, ``round`` (a round's
re-matching, matched lengths, dedup and, for lpm, its kept order's advance, in one call:
``_native/round.cpp``), ``memo[id(r)]`` and ``dirty``. Every memo equals what ``match_end`` of the request's fill returns on the
Python reference tree (tests/test_native_radix.py, tests/test_native_parts.py).

The C++ side borrows each tracked request's fill tokens: ``_fills`` keeps them alive until the
request is untracked or tracked again.

The in-batch prefix dedup (the reference's ``WaitingQueue.dedup``) lives there too
(``radixsched/_native/dedup.cpp``), when ``dedup_on`` turned it on: it follows every track,
untrack and re-match, and a round re-decides only the groups whose members changed."""

from __future__ import annotations

from typing import Any, NamedTuple

from radixsched.native import namespace_id, required
from radixsched.native.radix import NativeRadixCache, as_tokens
from radixsched.request import Req, TokenArray


class NativeMemo(NamedTuple):
    """Where a request's match ends: ``n`` tokens, ``offset`` tokens into ``node`` (``full``:
    at its end)."""

    n: int
    node: Any
    offset: int
    full: bool


class _Memos:
    """``memo[id(r)]`` and ``memo.get(id(r))`` over the C++ memos."""

    __slots__ = ("_tree",)

    def __init__(self, tree: Any) -> None:
        self._tree = tree

    def __getitem__(self, k: int) -> NativeMemo:
        got = self._tree.memo(k)
        if got is None:
            raise KeyError(k)
        return NativeMemo(*got)

    def get(self, k: int, default: NativeMemo | None = None) -> NativeMemo | None:
        got = self._tree.memo(k)
        return default if got is None else NativeMemo(*got)


class _Dirty:
    """The dirty set: ``id(r) in dirty``, ``bool(dirty)``, iteration in dirty order."""

    __slots__ = ("_tree",)

    def __init__(self, tree: Any) -> None:
        self._tree = tree

    def __contains__(self, k: object) -> bool:
        return isinstance(k, int) and bool(self._tree.is_dirty(k))

    def __bool__(self) -> bool:
        return bool(self._tree.any_dirty())

    def __iter__(self) -> Any:
        return iter(self._tree.dirty_keys())


class NativeMatcher:
    """Tracks waiting requests' matches against one native tree (which it listens to)."""

    def __init__(self, cache: NativeRadixCache) -> None:
        self.cache = cache
        self.page = cache.page_size
        tree = cache.tree
        self._tree = tree
        tree.matcher_on()
        cache.adopt_listener(self)
        self.reqs: dict[int, Req] = {}
        self._fills: dict[int, TokenArray] = {}
        self.memo = _Memos(tree)
        self.dirty = _Dirty(tree)
        self.deferred: frozenset[str] = frozenset()  # the dedup's last verdict
        self._core = required("the native matcher")
        # What SGLang's compat round reads of each tracked request's fill (its length,
        # namespace and first tokens: ``compat_keys_on``), kept with the memos; None: not kept.
        self.keys: Any = None

    def dedup_on(self, check: int, width: int) -> None:
        """Keep the in-batch dedup of requests matching at most ``check`` tokens, grouped by
        their first ``width`` fill tokens (before any request is tracked)."""
        self._tree.dedup_on(check, width)

    def compat_keys_on(self, width: int) -> None:
        """Keep, for each tracked request, what ``compat_round`` reads of its fill (the compat
        dedup's groups: its first ``width`` tokens), from its next track on."""
        self.keys = self._core.CompatKeys(width)

    def dedup_round(self, afresh: bool) -> tuple[frozenset[str], list[Req]]:
        """The deferred rids (the reference dedup's answer for the tracked requests) and the
        grouped requests whose status flipped since the last round (``afresh``: every
        deferred one, as if none was before)."""
        self.deferred, flipped = self._core.dedup_verdict(
            self._tree, self.reqs, afresh, self.deferred
        )
        return self.deferred, flipped

    def round(
        self,
        queue: list[Req],
        added: list[Req],
        moved: dict[int, Req],
        tried: dict[int, Req],
        matched: bool,
        dedup: bool,
        order: Any,
        key: int = 0,
    ) -> tuple[frozenset[str], list[Req], bool]:
        """The queue's round up to its order, in one native call (``_native/round.cpp``):
        re-match the dirty requests (those whose match moved join ``moved``); set the matched
        length of the requests whose key inputs may have changed (``matched``: ``moved``,
        ``tried`` (then emptied) and ``added``; else all of ``queue``); with ``dedup``, the
        dedup's verdict; with ``order`` (a kept ``StableOrder``, keyed by lpm's key, ``key``
        0, or spf's, 1; or dfs-weight's order), the order advanced when the list is in sync
        with it and few requests move (a ``Req``'s ``fill_len`` read there, another type's
        asked of it). Returns (the deferred rids, the
        requests whose dedup status flipped, whether the order was advanced)."""
        deferred, flipped, done = self._core.queue_round(
            self._tree, self.reqs, queue, added, moved, tried, matched, dedup, self.deferred, order,
            key, Req
        )  # fmt: skip
        self.deferred = deferred
        return deferred, flipped, done

    def touch_ends(self, reqs: list[Req]) -> None:
        """Touch the tree where each of ``reqs``' memos ends, last to first (one native call)."""
        self._core.touch_memos(self._tree, reqs)

    def track(self, r: Req) -> NativeMemo:
        """Start tracking ``r`` (new to the queue, or back with new output): match it now."""
        k = id(r)
        fill = as_tokens(r.fill_ids())
        self._fills[k] = fill
        self.reqs.pop(k, None)
        self.reqs[k] = r
        if self.keys is not None:
            self.keys.put(k, fill, r.namespace)
        got = self._tree.track(
            k, fill, namespace_id(r.namespace), r.queue_entry_time, r.arrival_time, r.rid
        )
        return NativeMemo(*got)

    def track_many(self, reqs: list[Req]) -> list[int]:
        """``[self.track(r).n for r in reqs]``, in one native call while ``keys`` is off."""
        if self.keys is not None:
            return [self.track(r).n for r in reqs]
        got: list[int] = self._tree.track_many(
            reqs, self._fills, self.reqs, as_tokens, namespace_id
        )
        return got

    def untrack(self, r: Req) -> None:
        k = id(r)
        self._tree.untrack(k)
        if self.keys is not None:
            self.keys.drop(k)
        self._fills.pop(k, None)
        self.reqs.pop(k, None)

    def refresh(self) -> list[Req]:
        """Re-match the dirty requests; return those whose match (length or end) moved."""
        reqs = self.reqs
        return [reqs[k] for k in self._tree.refresh()]

    # ---- the cache's events that reach Python (the rest stay in C++) -------------------------
    def on_reset(self) -> None:
        self._tree.matcher_reset()
