"""Incremental waiting-queue orders (radixsched mode): a round costs O(changed requests).

Every radixsched order is a stable sort of the waiting list by a per-request key: requests
with equal keys keep their order in the list being sorted, which is the previous round's
result with the requests that left removed and arrivals appended. ``StableOrder`` keeps that
result between rounds and, each round, moves only the requests whose key changed, giving
exactly the list a full stable sort would give. ``HrrnOrder`` serves hrrn, whose key depends
on the processed-token clock for every request: every round recomputes the ratios in numpy over
columns maintained per request, and its order is a total one (ties by request id) handed out
lazily (``HrrnRound``): the admission loop reads a handful of requests, so only the head is
selected and sorted. ``LazyShuffle`` does the same for random.

``QueueLog`` records what the scheduler's hooks (``SchedulePolicy.on_enqueue`` /
``on_dequeue`` / ``forget``) said since the last round, and tells whether the list handed to
``calc_priority`` is exactly the one those hooks describe; when it is not (a caller without
hooks, a request re-inserted mid-list), the round recomputes the order from scratch.
``AdmissionWatch`` covers the one field write outside the policy that a key reads (the
scheduler's admission match on a request it then leaves waiting).

The engines at the end bind these to the policies: ``KeyedEngine`` (lpm, shortest-prefill-
first, lof, fcfs with priorities: a key per request), ``RoutingKeyEngine``, ``HrrnEngine``,
``DfsWeightEngine`` (the cache-tree DFS split into top-level subtrees) and ``FairEngine``.

Equivalence with the full computation is a tested property (tests/test_queue_index.py).
"""

from __future__ import annotations

import bisect
import operator
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from radixsched.cache.radix import RadixCache
from radixsched.request import Req

Key = tuple[Any, ...]

_FIRST = operator.itemgetter(0)
_ROUTING_KEY = operator.attrgetter("routing_key")


def reorder(items: Sequence[Any], perm: Sequence[int]) -> list[Any]:
    """``[items[i] for i in perm]`` at C speed."""
    if len(perm) == 0:
        return []
    if len(perm) == 1:
        return [items[perm[0]]]
    return list(operator.itemgetter(*perm)(items))


class QueueLog:
    """Hook-fed changes to the waiting list since the last round.

    Invariant while ``synced``: the scheduler's list is ``members + added``, where
    ``members`` is the order the last round left (the owner's list, minus the requests that
    left since) and ``added`` the arrivals in the order they were appended. ``dirty`` holds
    members whose output changed while queued (``forget``); ``removed`` the members that
    left (the match and dedup indexes drop them)."""

    def __init__(self) -> None:
        self.synced = False
        self.added: list[Req] = []
        self.removed: list[Req] = []
        self.dirty: list[Req] = []

    def desync(self) -> None:
        """Forget everything: the next round recomputes from the list it is given."""
        self.synced = False
        self._fresh()

    def settle(self) -> None:
        """A round consumed the log (it may keep the lists): the list is exactly the owner's
        order now."""
        self.synced = True
        self._fresh()

    def _fresh(self) -> None:
        self.added = []
        self.removed = []
        self.dirty = []

    def matches(self, queue: list[Req], members: list[Req]) -> bool:
        """Whether ``queue`` is exactly ``members + added``. Identity compares at C speed, and no
        copy of the list (a copy would touch every request's reference count)."""
        n = len(members)
        if not self.synced or len(queue) != n + len(self.added):
            return False
        if not self.added:
            return queue == members
        members.extend(self.added)
        try:
            return queue == members
        finally:
            del members[n:]

    def drop_added(self, r: Req) -> bool:
        """``r`` left before any round saw it."""
        for i, a in enumerate(self.added):
            if a is r:
                del self.added[i]
                return True
        return False


class StableOrder:
    """Requests in the order a stable sort by a key leaves them, maintained across rounds.

    Stored keys are ``(*key, t)`` with a unique tie number ``t``. Invariants: ``reqs`` is sorted
    by ``keys`` (so ``(key, t)`` is the total order a full stable sort produces), ``key_of``
    maps ``id(req)`` to ``(key, stored key)``, and every stored ``t`` lies strictly between
    ``lo`` and ``hi``.

    Why the tie numbers reproduce stability: among requests that end up with equal keys, a
    stable sort keeps their order in the list being sorted, which is this order (by old key,
    then t) with arrivals appended. A request whose key grew stood before every request that
    already had its new key, so it gets a t below all others; one whose key shrank stood after
    them, so it gets one above all others; arrivals come last, in append order. Several movers
    are numbered in their old order, so they also keep their order among themselves.
    """

    def __init__(self) -> None:
        self.reqs: list[Req] = []
        self.keys: list[Key] = []
        self.key_of: dict[int, tuple[Key, Key]] = {}
        self.lo = 0
        self.hi = 0

    def __len__(self) -> int:
        return len(self.reqs)

    def __contains__(self, r: Req) -> bool:
        return id(r) in self.key_of

    def key(self, r: Req) -> Key:
        """``r``'s key (without its tie number)."""
        return self.key_of[id(r)][0]

    def stored(self, r: Req) -> Key:
        """``r``'s stored key: its key and tie number (its place in the order)."""
        return self.key_of[id(r)][1]

    def remove(self, r: Req, mirror: list[Req] | None = None) -> bool:
        """Drop ``r`` if present (and from ``mirror``, a list equal to ``reqs``)."""
        entry = self.key_of.pop(id(r), None)
        if entry is None:
            return False
        i = bisect.bisect_left(self.keys, entry[1])
        del self.keys[i], self.reqs[i]
        if mirror is not None:
            del mirror[i]
        return True

    def _insert(self, r: Req, key: Key, t: int, mirror: list[Req] | None) -> None:
        k = (*key, t)
        i = bisect.bisect_right(self.keys, k)
        self.keys.insert(i, k)
        self.reqs.insert(i, r)
        if mirror is not None:
            mirror.insert(i, r)
        self.key_of[id(r)] = (key, k)

    def reset(self, pre: Sequence[Req], keys: Sequence[Key]) -> None:
        """Stable-sort ``pre`` (the list as it stands) by ``keys`` (``keys[i]`` is ``pre[i]``'s)."""
        perm = sorted(range(len(pre)), key=keys.__getitem__)
        self.reqs = reorder(pre, perm)
        self.keys = [(*keys[i], t) for t, i in enumerate(perm)]
        self.key_of = {id(pre[i]): (keys[i], k) for i, k in zip(perm, self.keys, strict=True)}
        self.lo = -1
        self.hi = len(self.reqs)

    def update(
        self,
        changed: Iterable[tuple[Req, Key]],
        arrivals: Sequence[tuple[Req, Key]],
        mirror: list[Req] | None = None,
    ) -> None:
        """Re-key members (each at most once) and insert arrivals (in append order).
        ``mirror``: a list equal to ``reqs`` followed by the arrivals (the scheduler's queue);
        it receives the same edits, so it ends equal to ``reqs`` without being rewritten."""
        if mirror is not None and arrivals:
            del mirror[len(self.reqs) :]
        grew: list[tuple[Key, Req, Key]] = []
        shrank: list[tuple[Key, Req, Key]] = []
        key_of = self.key_of
        for r, new in changed:
            key, old = key_of[id(r)]
            if key == new:
                continue
            self.remove(r, mirror)
            (grew if key < new else shrank).append((old, r, new))
        grew.sort(key=_FIRST, reverse=True)  # the last of them in the old order numbered first
        for _, r, new in grew:
            self.lo -= 1
            self._insert(r, new, self.lo, mirror)
        shrank.sort(key=_FIRST)
        for _, r, new in shrank:
            self.hi += 1
            self._insert(r, new, self.hi, mirror)
        for r, new in arrivals:
            self.hi += 1
            self._insert(r, new, self.hi, mirror)


class LazyOrder(ABC):
    """A round's order handed out as the admission loop reads it (``calc_priority(lazy=True)``):
    a round that reads ``k`` requests pays for ``k``, not for ordering the whole queue, and a
    round that reads none pays nothing. The order is exactly the one the eager round would
    leave in the list; only the requests nobody reads stay where they were."""

    @abstractmethod
    def position(self, i: int) -> int | None:
        """Where (an index into the queue list as it stands) the round's ``i``-th request is;
        None past the end. The caller reads ``i = 0, 1, 2, ...`` in turn and does not edit the
        list until it is done."""

    @abstractmethod
    def head(self, k: int) -> list[Req]:
        """The round's first ``k`` requests, in order."""


class LazyShuffle(LazyOrder):
    """A uniformly random order of a list, drawn one position at a time (radixsched random).

    Front-to-back Fisher-Yates, in place: position ``i`` takes a uniform pick among positions
    ``[i, n)``. Whatever order the list starts in, its first ``k`` positions are then a uniform
    random ``k``-sequence of its requests, so a round that reads ``k`` requests costs ``k``
    draws, and drawing every position is a full shuffle with the same first ``k`` positions for
    the same generator state. Invariant: ``queue[:done]`` is final for this round."""

    __slots__ = ("done", "queue", "rng")

    def __init__(self, rng: random.Random, queue: list[Any]) -> None:
        self.rng = rng
        self.queue = queue
        self.done = 0

    def draw(self, end: int) -> None:
        """Make positions ``[0, end)`` final (``end`` is clipped to the list)."""
        i = self.done
        if i >= end:
            return
        queue = self.queue
        n = len(queue)
        stop = min(end, n - 1)  # the last position has one candidate: no draw
        pick = self.rng.randrange
        while i < stop:
            j = i + pick(n - i)
            if j != i:
                queue[i], queue[j] = queue[j], queue[i]
            i += 1
        self.done = max(i, min(end, n))

    def position(self, i: int) -> int | None:
        if i >= len(self.queue):
            return None
        self.draw(i + 1)
        return i

    def head(self, k: int) -> list[Req]:
        self.draw(k)
        return self.queue[:k]


class HrrnRound(LazyOrder):
    """One hrrn round's order over ``reqs`` (the queue list as it stands): ascending
    ``(ratio, queue entry, arrival, rid)``, a total order, where ``ratio`` is minus the response
    ratio (+inf for deprioritized requests, -inf for those with no prefill work left). The head
    is selected with ``argpartition`` (every request tied with the last one selected is
    included, so the selection is a prefix of the total order) and sorted; a reader that gets
    past it doubles it. Columns are aligned with ``reqs``."""

    __slots__ = ("arrival", "entry", "picked", "ratio", "reqs")

    FIRST = 16  # the first selection: most rounds admit a handful of requests

    def __init__(
        self,
        reqs: list[Req],
        ratio: npt.NDArray[np.float64],
        entry: npt.NDArray[np.float64],
        arrival: npt.NDArray[np.float64],
    ) -> None:
        self.reqs = reqs
        self.ratio = ratio
        self.entry = entry
        self.arrival = arrival
        self.picked: list[int] = []

    def _select(self, need: int) -> None:
        n = len(self.reqs)
        k = min(n, max(need, 2 * len(self.picked), self.FIRST))
        if k >= n:
            cand = np.arange(n)
        else:
            ratio = self.ratio
            bound = ratio[np.argpartition(ratio, k - 1)[k - 1]]
            cand = np.flatnonzero(ratio <= bound)
        self.picked = self._sorted(cand)

    def _sorted(self, cand: npt.NDArray[np.int64]) -> list[int]:
        r, e, a = self.ratio[cand], self.entry[cand], self.arrival[cand]
        perm = np.lexsort((a, e, r))
        out: list[int] = cand[perm].tolist()
        if len(out) < 2:
            return out
        r, e, a = r[perm], e[perm], a[perm]
        tied = (r[1:] == r[:-1]) & (e[1:] == e[:-1]) & (a[1:] == a[:-1])
        if tied.any():  # equal (ratio, entry, arrival): by request id
            reqs = self.reqs
            flags = tied.tolist()
            i = 0
            while i < len(flags):
                if not flags[i]:
                    i += 1
                    continue
                j = i
                while j < len(flags) and flags[j]:
                    j += 1
                out[i : j + 1] = sorted(out[i : j + 1], key=lambda x: reqs[x].rid)
                i = j
        return out

    def position(self, i: int) -> int | None:
        if i >= len(self.picked):
            if i >= len(self.reqs):
                return None
            self._select(i + 1)
        return self.picked[i]

    def head(self, k: int) -> list[Req]:
        k = min(k, len(self.reqs))
        if k > len(self.picked):
            self._select(k)
        reqs = self.reqs
        return [reqs[j] for j in self.picked[:k]]

    def full(self) -> list[int]:
        """Every position, in the round's order."""
        self.head(len(self.reqs))
        return self.picked


class HrrnOrder:
    """Waiting requests for radixsched hrrn: per-request columns aligned with ``reqs``, which
    change only for the requests whose match, dedup status or membership changed; each round
    computes every request's ratio from them in a few whole-column numpy operations and hands
    out its order lazily (``HrrnRound``).

    Invariants: ``reqs`` is the queue list as the last round left it (its own order when the
    round was lazy, the full order otherwise) minus the requests that left, plus the arrivals
    of the round in progress; ``cols[:, i]`` and ``fixed[i]`` describe ``reqs[i]`` for
    ``i < len(reqs)``: the processed-token clock at queue entry, the uncached work where it is
    positive (else 1, unused), the ratio that overrides the computed one (+inf deprioritized,
    -inf no prefill work left) with ``fixed`` saying whether one does, queue entry time and
    arrival time.
    """

    _Q, _WORK, _OVERRIDE, _ENTRY, _ARRIVAL = range(5)

    def __init__(self) -> None:
        self.reqs: list[Req] = []
        self.members: set[int] = set()
        self.cols = np.zeros((5, 64), dtype=np.float64)
        self.fixed = np.zeros(64, dtype=bool)

    def __contains__(self, r: Req) -> bool:
        return id(r) in self.members

    def _keys(self, r: Req, deprioritized: frozenset[str], i: int) -> None:
        """Write the columns that move with ``r``'s match and dedup status at position ``i``."""
        work = len(r.prompt_ids) + len(r.output_ids) - r.num_matched_prefix_tokens
        cols = self.cols
        cols[self._WORK, i] = work if work > 0 else 1
        if r.rid in deprioritized:
            cols[self._OVERRIDE, i] = np.inf
            self.fixed[i] = True
        elif work <= 0:
            cols[self._OVERRIDE, i] = -np.inf
            self.fixed[i] = True
        else:
            self.fixed[i] = False

    def _append(self, arrivals: Sequence[Req], deprioritized: frozenset[str]) -> None:
        n = len(self.reqs)
        need = n + len(arrivals)
        cap = self.cols.shape[1]
        if need > cap:
            cap = max(2 * cap, need)
            cols = np.zeros((5, cap), dtype=np.float64)
            cols[:, :n] = self.cols[:, :n]
            fixed = np.zeros(cap, dtype=bool)
            fixed[:n] = self.fixed[:n]
            self.cols, self.fixed = cols, fixed
        cols = self.cols
        for i, r in enumerate(arrivals, n):
            self.members.add(id(r))
            cols[self._Q, i] = r.queue_entry_processed_tokens
            cols[self._ENTRY, i] = r.queue_entry_time
            cols[self._ARRIVAL, i] = r.arrival_time
            self._keys(r, deprioritized, i)
        self.reqs.extend(arrivals)

    def remove(self, r: Req) -> bool:
        if id(r) not in self.members:
            return False
        self.members.discard(id(r))
        i = self.reqs.index(r)  # identity compares (Req has no __eq__)
        n = len(self.reqs)
        del self.reqs[i]
        if i < n - 1:
            self.cols[:, i : n - 1] = self.cols[:, i + 1 : n]
            self.fixed[i : n - 1] = self.fixed[i + 1 : n]
        return True

    def reset(self) -> None:
        self.reqs = []
        self.members.clear()

    def begin(
        self,
        changed: Sequence[Req],
        arrivals: Sequence[Req],
        deprioritized: frozenset[str],
        processed_tokens: int,
    ) -> HrrnRound:
        """Re-key ``changed`` members and append ``arrivals`` (the list keeps its order: members
        then arrivals, as the scheduler's queue stands); the round's order, drawn lazily. The
        round reads the columns as they are now: it is used up before the list changes."""
        if changed:
            index = {id(r): i for i, r in enumerate(self.reqs)} if len(changed) > 8 else None
            for r in changed:
                i = index[id(r)] if index is not None else self.reqs.index(r)
                self._keys(r, deprioritized, i)
        if arrivals:
            self._append(arrivals, deprioritized)
        n = len(self.reqs)
        cols = self.cols[:, :n]
        # -(max(waited, 0) / work): float64 division of exactly representable integers
        # (< 2**53 tokens), the same correctly rounded quotient as Python's int / int in the
        # full sort; a request that has not waited scores 0 (as -0.0, which compares equal).
        ratio = processed_tokens - cols[self._Q]
        np.maximum(ratio, 0.0, out=ratio)
        np.divide(ratio, cols[self._WORK], out=ratio)
        np.negative(ratio, out=ratio)
        np.copyto(ratio, cols[self._OVERRIDE], where=self.fixed[:n])
        return HrrnRound(self.reqs, ratio, cols[self._ENTRY], cols[self._ARRIVAL])

    def apply(self, rnd: HrrnRound) -> list[Req]:
        """Sort the list by the round's whole order; return it."""
        perm = rnd.full()
        n = len(perm)
        self.reqs = reorder(self.reqs, perm)
        idx = np.asarray(perm, dtype=np.int64)
        self.cols[:, :n] = self.cols[:, idx]
        self.fixed[:n] = self.fixed[idx]
        return self.reqs


class AdmissionWatch:
    """Members whose sort input the scheduler's admission match may rewrite while they wait.

    The scheduler re-matches each request it tries to admit with the match capped at
    ``fill_len - 1`` (``Scheduler._match_for_admission``) and writes ``field`` (the matched
    length, or ``last_node``); a request it then leaves waiting keeps that value, and a full
    sort next round reads it. The capped match ends where the policy's own (uncapped, memoised)
    match ends unless the latter reaches past the last page boundary before ``fill_len``, i.e.
    the whole fill is cached: only those members are watched, so a round checks a handful of
    requests instead of reading the field of every waiting request. (On page-1 caches the
    capped matched length equals the policy's capped one even then: the policy watches matched
    lengths only on larger pages.) Invariant: ``watched`` maps ``id(r)`` to ``(r, field(r) when r was last keyed)`` for every
    member whose memoised match passes that page boundary."""

    def __init__(self, field: Callable[[Req], Any], page_size: int) -> None:
        self.field = field
        self.page = page_size
        self.watched: dict[int, tuple[Req, Any]] = {}

    def note(self, r: Req) -> None:
        """``r`` was (re)keyed on its current fields."""
        memo = r.match_memo
        edge = len(r.prompt_ids) + len(r.output_ids) - 1
        if memo is not None and memo[2] > edge - edge % self.page:
            self.watched[id(r)] = (r, self.field(r))
        else:
            self.watched.pop(id(r), None)

    def note_all(self, reqs: Iterable[Req]) -> None:
        self.watched.clear()
        for r in reqs:
            self.note(r)

    def drop(self, r: Req) -> None:
        self.watched.pop(id(r), None)

    def stale(self) -> list[Req]:
        """Watched members whose field changed since they were keyed."""
        field = self.field
        return [r for r, seen in self.watched.values() if field(r) is not seen and field(r) != seen]


# ---- the policies' incremental orders ------------------------------------------------------


class RoundInputs(NamedTuple):
    """What an incremental order may read in one round."""

    deprioritized: frozenset[str]
    processed_tokens: int
    running_batch: Sequence[Req] | None


class OrderEngine(ABC):
    """One policy's radixsched order kept across rounds (see queue_order.py).

    ``members()`` is the list as the last round left it, minus the requests that left since;
    while the hooks are in sync the scheduler's list is that plus the arrivals. Both ``rebuild``
    and ``advance`` leave the scheduler's list exactly as the policy's full sort of it would;
    ``advance`` touches only what changed. ``keeps_sync``: whether the engine follows the hooks
    after the round (False: the next round starts from the list as it then stands)."""

    keeps_sync = True

    @abstractmethod
    def members(self) -> list[Req]: ...

    @abstractmethod
    def holds(self, r: Req) -> bool: ...

    @abstractmethod
    def remove(self, r: Req) -> bool:
        """Drop ``r`` if it is a member; return whether it was."""

    @abstractmethod
    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        """Order ``queue`` (the list as it stands) from scratch."""

    @abstractmethod
    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        """Re-key ``changed`` members and place ``arrivals``; ``queue`` is ``members()`` followed
        by ``arrivals`` and is reordered in place."""

    def conclude(self, queue: list[Req], lazy: bool) -> LazyOrder | None:
        """After ``rebuild``/``advance``: an engine that orders lazily hands its round over
        (``lazy``) or sorts ``queue`` now; the others have sorted it already."""
        return None


class OrderBacked(OrderEngine):
    """An engine whose members are those of one ordered list (``StableOrder`` or
    ``HrrnOrder``)."""

    order: StableOrder | HrrnOrder

    def members(self) -> list[Req]:
        return self.order.reqs

    def holds(self, r: Req) -> bool:
        return r in self.order

    def remove(self, r: Req) -> bool:
        return self.order.remove(r)


KeyFn = Callable[[Req, RoundInputs], Key]
# Re-keying more than this many requests, and more than a quarter of the list, in one round:
# one stable sort of the list is cheaper.
_REBUILD_MIN = 32
_REBUILD_SHARE = 4


def _many(moving: int, total: int) -> bool:
    return moving > _REBUILD_MIN and _REBUILD_SHARE * moving > total


class KeyedEngine(OrderBacked):
    """A policy whose order is a stable sort by a per-request key (lpm, spf, lof, fcfs with
    priorities)."""

    order: StableOrder

    def __init__(self, key: KeyFn) -> None:
        self.key = key
        self.order = StableOrder()

    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        key = self.key
        self.order.reset(queue, [key(r, rnd) for r in queue])
        queue[:] = self.order.reqs

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        if _many(len(changed) + len(arrivals), len(queue)):
            self.rebuild(queue, rnd)
            return
        key = self.key
        self.order.update(
            [(r, key(r, rnd)) for r in changed], [(r, key(r, rnd)) for r in arrivals], queue
        )


class RoutingKeyEngine(OrderBacked):
    """routing-key: the key depends on the running batch's routing-key counts, so only the
    members of routing keys whose count changed are re-keyed. A round without counts leaves
    the list as it is and drops the sync (``keeps_sync``): the next round with counts orders
    the list as it then stands."""

    order: StableOrder

    def __init__(self) -> None:
        self.order = StableOrder()
        self.counts: dict[str, int] = {}  # the counts the stored keys were computed with
        self.by_key: dict[str, dict[int, Req]] = {}  # ordered members per routing key

    def _key(self, r: Req) -> Key:
        k = r.routing_key
        if k and k in self.counts:
            return (0, -self.counts[k], k, r.queue_entry_time, r.arrival_time)
        return (1, 0, "", r.queue_entry_time, r.arrival_time)

    @staticmethod
    def _counts(rnd: RoundInputs) -> dict[str, int] | None:
        if rnd.running_batch is None:
            return None
        keys = list(filter(None, map(_ROUTING_KEY, rnd.running_batch)))  # C-level passes
        return dict(Counter(keys)) if keys else None

    def remove(self, r: Req) -> bool:
        if not super().remove(r):
            return False
        if r.routing_key:
            group = self.by_key[r.routing_key]
            del group[id(r)]
            if not group:
                del self.by_key[r.routing_key]
        return True

    def _place(self, reqs: Sequence[Req]) -> None:
        for r in reqs:
            if r.routing_key:
                self.by_key.setdefault(r.routing_key, {})[id(r)] = r

    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        counts = self._counts(rnd)
        self.by_key = {}
        if counts is None:  # nothing to sort by: the list stays as it is
            self.order.reset([], [])
            self.keeps_sync = False
            return
        self.keeps_sync = True
        self.counts = counts
        self.order.reset(queue, [self._key(r) for r in queue])
        self._place(self.order.reqs)
        queue[:] = self.order.reqs

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        counts = self._counts(rnd)
        if counts is None:
            self.rebuild(queue, rnd)
            return
        rekey = {id(r): r for r in changed}
        old = self.counts
        for k in old.keys() | counts.keys():
            if old.get(k) != counts.get(k):
                rekey.update(self.by_key.get(k, {}))
        self.counts = counts
        if _many(len(rekey) + len(arrivals), len(queue)):
            self.rebuild(queue, rnd)
            return
        self.order.update(
            [(r, self._key(r)) for r in rekey.values()],
            [(r, self._key(r)) for r in arrivals],
            queue,
        )
        self._place(arrivals)


class HrrnEngine(OrderBacked):
    """hrrn: re-ordered every round (the ratio moves with the clock), in numpy, and lazily:
    ``rebuild``/``advance`` leave the list as it stands and ``conclude`` hands out the round."""

    order: HrrnOrder

    def __init__(self) -> None:
        self.order = HrrnOrder()
        self.round: HrrnRound | None = None

    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        self.order.reset()
        self.round = self.order.begin([], queue, rnd.deprioritized, rnd.processed_tokens)

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        self.round = self.order.begin(changed, arrivals, rnd.deprioritized, rnd.processed_tokens)

    def conclude(self, queue: list[Req], lazy: bool) -> LazyOrder | None:
        rnd, self.round = self.round, None
        assert rnd is not None, "conclude() follows rebuild() or advance()"
        if lazy:
            return rnd
        queue[:] = self.order.apply(rnd)
        return None


class DfsWeightEngine(OrderBacked):
    """dfs-weight: the DFS over the cache tree visits the root's children (top-level subtrees)
    by descending request count, ties in the root's child order, then the root's own requests
    (no match) in list order; the dedup then moves the deferred ones, stably, to the back. So
    the order is a stable sort by ``(deferred, 0, -count(T), child position of T, position in
    T's own DFS order)`` for a request in subtree T and ``(deferred, 1)`` for one at the root.
    A subtree's own order is recomputed (``dfs_weight_order`` over its members) only when a
    member joined, left or was re-matched, or the subtree moved among the root's children.

    Relies on the invariant ``MatchIndex`` keeps: every member's ``last_node`` is in the tree
    (a subtree that lost nodes is reported changed and its members re-matched)."""

    order: StableOrder

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.order = StableOrder()
        self.top_of: dict[int, Hashable | None] = {}  # None: the match ends at the root
        self.groups: dict[Hashable, dict[int, Req]] = {}  # members per top-level subtree
        self.segpos: dict[int, int] = {}  # position in its subtree's DFS order
        self.place: dict[Hashable, tuple[int, int]] = {}  # (count, child position) keyed on
        self.children: list[Hashable] = []  # the root's child keys, in the root's order
        self.touched: set[Hashable] = set()  # subtrees that lost a member since the last round

    def _top(self, r: Req) -> Hashable | None:
        """The top-level subtree ``r``'s match ends in (None: at the root)."""
        node = r.last_node
        if node is self.cache.root:
            return None
        top: Hashable = node.subtree_key
        return top

    def _key(self, r: Req, rnd: RoundInputs) -> Key:
        dep = r.rid in rnd.deprioritized
        top = self.top_of[id(r)]
        if top is None:
            return (dep, 1)
        count, pos = self.place[top]
        return (dep, 0, -count, pos, self.segpos[id(r)])

    def _join(self, r: Req, top: Hashable | None) -> None:
        self.top_of[id(r)] = top
        if top is not None:
            self.groups.setdefault(top, {})[id(r)] = r

    def _leave(self, r: Req) -> None:
        top = self.top_of.pop(id(r))
        self.segpos.pop(id(r), None)
        if top is None:
            return
        group = self.groups[top]
        del group[id(r)]
        if group:
            self.touched.add(top)
        else:
            del self.groups[top]
            self.place.pop(top, None)
            self.touched.discard(top)

    def _take_child_positions(self) -> set[Hashable]:
        """Refresh the root's child keys; return the subtrees (with members) whose position
        among them moved."""
        keys = list(self.cache.root.children)
        if keys == self.children:
            return set()
        self.children = keys
        return {t for t, (_, pos) in self.place.items() if keys.index(t) != pos}

    def _segment(self, top: Hashable, reqs: list[Req]) -> None:
        """Subtree ``top``'s own DFS order over its members, given in list order."""
        perm = self.cache.dfs_weight_order([r.last_node for r in reqs])
        for j, i in enumerate(perm):
            self.segpos[id(reqs[i])] = j
        self.place[top] = (len(reqs), self.children.index(top))

    def remove(self, r: Req) -> bool:
        if not super().remove(r):
            return False
        self._leave(r)
        return True

    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        self.top_of, self.groups, self.segpos, self.place = {}, {}, {}, {}
        self.touched = set()
        self.children = []
        self._take_child_positions()
        for r in queue:
            self._join(r, self._top(r))
        # One DFS over the whole list: within a subtree it visits the subtree's members in the
        # order a DFS over those members alone would (the weights inside are the same).
        seen: dict[Hashable, int] = {}
        top_of, segpos = self.top_of, self.segpos
        for i in self.cache.dfs_weight_order([r.last_node for r in queue]):
            k = id(queue[i])
            top = top_of[k]
            if top is not None:
                segpos[k] = seen.get(top, 0)
                seen[top] = segpos[k] + 1
        for top, group in self.groups.items():
            self.place[top] = (len(group), self.children.index(top))
        self.order.reset(queue, [self._key(r, rnd) for r in queue])
        queue[:] = self.order.reqs

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        if _many(len(changed) + len(arrivals), len(queue)):
            self.rebuild(queue, rnd)
            return
        touched = self.touched
        self.touched = set()
        for r in changed:
            old = self.top_of[id(r)]
            new = self._top(r)
            if new != old:
                self._leave(r)
                self._join(r, new)
            if old is not None:
                touched.add(old)
            if new is not None:
                touched.add(new)
        new_by_top: dict[Hashable, list[Req]] = {}
        for r in arrivals:
            top = self._top(r)
            self._join(r, top)
            if top is not None:
                new_by_top.setdefault(top, []).append(r)
        touched.update(new_by_top)
        touched |= self._take_child_positions()
        rekey = {id(r): r for r in changed}
        stored = self.order.stored
        for top in touched:
            group = self.groups.get(top)
            if group is None:
                continue
            fresh = new_by_top.get(top, [])
            fresh_ids = {id(r) for r in fresh}
            olds = [r for k, r in group.items() if k not in fresh_ids]
            olds.sort(key=stored)  # their order in the list as it stands
            self._segment(top, olds + fresh)
            rekey.update((id(r), r) for r in olds)
        self.touched.clear()  # every subtree that lost a member was just recomputed
        self.order.update(
            [(r, self._key(r, rnd)) for r in rekey.values()],
            [(r, self._key(r, rnd)) for r in arrivals],
            queue,
        )


class FairEngine(OrderEngine):
    """fair: each tenant's own order (longest match, then arrival) is a ``StableOrder``; the
    tenants are interleaved by ``merge`` (``VirtualTokenCounter.merge``). With one tenant the
    merged order is that tenant's order itself (``out`` is then the same list object)."""

    def __init__(self, merge: Callable[[dict[str, list[Req]]], list[Req]]) -> None:
        self.merge = merge  # VirtualTokenCounter.merge: one tenant's own list comes back as is
        self.by_tenant: dict[str, StableOrder] = {}
        self.tenant_of: dict[int, str] = {}
        self.out: list[Req] = []  # the last round's order, minus the requests that left

    @staticmethod
    def _key(r: Req) -> Key:
        return (-r.num_matched_prefix_tokens, r.queue_entry_time, r.arrival_time)

    def members(self) -> list[Req]:
        return self.out

    def holds(self, r: Req) -> bool:
        return id(r) in self.tenant_of

    def remove(self, r: Req) -> bool:
        tenant = self.tenant_of.pop(id(r), None)
        if tenant is None:
            return False
        order = self.by_tenant[tenant]
        if self.out is not order.reqs:
            del self.out[self.out.index(r)]
        order.remove(r)
        if not len(order):
            del self.by_tenant[tenant]
        return True

    def tenants(self, arrivals: Sequence[Req]) -> set[str]:
        """Tenants with a waiting request (members and arrivals)."""
        tenants = set(self.by_tenant)
        tenants.update(r.tenant_key for r in arrivals)
        return tenants

    def _merge(self, tenant_order: Sequence[str], queue: list[Req]) -> None:
        self.out = self.merge({t: self.by_tenant[t].reqs for t in tenant_order})
        queue[:] = self.out

    def rebuild(self, queue: list[Req], rnd: RoundInputs) -> None:
        groups: dict[str, list[Req]] = {}
        for r in queue:
            groups.setdefault(r.tenant_key, []).append(r)
        self.by_tenant, self.tenant_of = {}, {}
        for tenant, reqs in groups.items():
            order = self.by_tenant[tenant] = StableOrder()
            order.reset(reqs, [self._key(r) for r in reqs])
            self.tenant_of.update((id(r), tenant) for r in reqs)
        if groups:
            self._merge(list(groups), queue)
        else:
            self.out = []

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: RoundInputs, queue: list[Req]
    ) -> None:
        if _many(len(changed) + len(arrivals), len(queue)):
            self.rebuild(queue, rnd)
            return
        # Tenants by first appearance in the list as it stands: a tenant's first member is
        # the head of its own order (the merge keeps each tenant's order).
        firsts = sorted((self.out.index(o.reqs[0]), t) for t, o in self.by_tenant.items())
        tenant_order = [t for _, t in firsts]
        per_tenant: dict[str, tuple[list[tuple[Req, Key]], list[tuple[Req, Key]]]] = {}
        for r in changed:
            per_tenant.setdefault(self.tenant_of[id(r)], ([], []))[0].append((r, self._key(r)))
        for r in arrivals:
            tenant = r.tenant_key
            if tenant not in self.by_tenant:
                self.by_tenant[tenant] = StableOrder()
                tenant_order.append(tenant)
            self.tenant_of[id(r)] = tenant
            per_tenant.setdefault(tenant, ([], []))[1].append((r, self._key(r)))
        if len(tenant_order) == 1:
            # One tenant: ``queue`` is its order followed by the arrivals; edit it in place.
            order = self.by_tenant[tenant_order[0]]
            rekey, new = per_tenant.get(tenant_order[0], ([], []))
            order.update(rekey, new, queue)
            self.out = order.reqs
            return
        for tenant, (rekey, new) in per_tenant.items():
            self.by_tenant[tenant].update(rekey, new)
        if tenant_order:
            self._merge(tenant_order, queue)
        else:
            self.out = []
