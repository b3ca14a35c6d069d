"""The in-batch prefix dedup (``WaitingQueue.dedup``), maintained across rounds: a round
re-decides only the groups whose members joined, left or were re-matched."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixsched.cache.base import Namespace
from radixsched.policies import dedup_rep_key
from radixsched.request import Req

GroupKey = tuple[Namespace, bytes]


class DedupIndex:
    """Groups (requests with a device match of at most ``check`` tokens, by their first
    ``width`` tokens) and their representatives. Invariant: ``deferred`` is the union of the
    non-representatives of every group, the reference dedup's answer for the tracked set."""

    def __init__(self, check: int, width: int, device: Callable[[Req], int]) -> None:
        self.check = check
        self.width = width
        self.device = device  # a tracked request's uncapped device match
        self.reset()

    def reset(self) -> None:
        """Forget every request."""
        self.groups: dict[GroupKey, dict[str, Req]] = {}
        self.group_of: dict[str, GroupKey] = {}
        self.dup_of: dict[GroupKey, set[str]] = {}
        self._deferred: set[str] = set()  # the union of dup_of's sets
        self.deferred: frozenset[str] = frozenset()
        self.flipped: list[Req] = []  # members whose deferred status changed in the last update

    def _key(self, r: Req) -> GroupKey | None:
        if r.fill_len < self.width:
            return None  # shares fewer than ``width`` tokens with anything
        return (r.namespace, r.fill_slice(0, self.width).tobytes())

    def _leave(self, rid: str, touched: set[GroupKey]) -> None:
        g = self.group_of.pop(rid, None)
        if g is not None:
            del self.groups[g][rid]
            touched.add(g)

    def update(self, changed: Sequence[Req], gone: Sequence[Req]) -> frozenset[str]:
        """Apply a round's changes (``changed``: joined or re-matched; ``gone``: left)."""
        self.flipped = []
        if not changed and not gone:
            return self.deferred
        touched: set[GroupKey] = set()
        for r in gone:
            self._leave(r.rid, touched)
        for r in changed:
            self._leave(r.rid, touched)
            g = self._key(r) if self.device(r) <= self.check else None
            if g is not None:
                self.groups.setdefault(g, {})[r.rid] = r
                self.group_of[r.rid] = g
                touched.add(g)
        flips: set[str] = set()
        for g in touched:
            old = self.dup_of.pop(g, set())
            members = self.groups.get(g)
            dup: set[str] = set()
            if not members:
                self.groups.pop(g, None)
            elif len(members) > 1:
                rep = min(members.values(), key=dedup_rep_key).rid  # a total order
                dup = {rid for rid in members if rid != rep}
                self.dup_of[g] = dup
            if old != dup:
                self._deferred -= old
                self._deferred |= dup
                flips |= old ^ dup
        if flips:
            self.deferred = frozenset(self._deferred)
            self.flipped = [self.groups[self.group_of[k]][k] for k in flips if k in self.group_of]
        return self.deferred
