"""Kept orders: a policy's order maintained across rounds, so that a round costs what changed.

Every radixsched key policy is a stable sort of the waiting list by a per-request key. Requests
with equal keys keep their order in the list being sorted, which is the previous round's
result, minus the requests that left, plus the arrivals at the back. The native ``StableOrder``
(``_native/order.hpp``) keeps that result between rounds and moves only the requests whose key
changed, giving exactly the list a full stable sort gives, in one native call per round. ``KeyedEngine`` serves any key policy whose key reads only the request
and its match and dedup status (a user's policy included); the other engines serve the
policies whose order depends on more: hrrn (the clock; native columns, handed out lazily), routing-key
(the running batch), dfs-weight (the cache tree) and fair (tenant counters).

Every engine leaves the scheduler's list exactly as the reference round would (hrrn: the list
as it stands, its order being total), which tests/test_equivalence.py checks bit for bit.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from radixsched.native import required
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import Key, Policy, Round, lpm, priority_term, shortest_prefill_first
from radixsched.request import Req

_TENANT = operator.attrgetter("tenant_key")

# Re-keying more than this many requests, and more than a quarter of the list, in one round:
# one stable sort of the list is cheaper.
_REBUILD_MIN = 32
_REBUILD_SHARE = 4


def _worth_rebuilding(moving: int, total: int) -> bool:
    return moving > _REBUILD_MIN and _REBUILD_SHARE * moving > total


def stable_order() -> Any:
    """A new native ``StableOrder`` (``_native/order.hpp``): requests in the order a stable sort
    by a key leaves them, kept across rounds (``reset``, ``update``, ``place``, ``remove``;
    ``reqs`` is the sorted list, one Python list object that the native code edits)."""
    return required("the kept orders").StableOrder()


class Engine(ABC):
    """One policy's order kept across rounds. ``members()`` is the list as the last round left
    it, minus the requests that left since; while in sync the scheduler's list is that plus the
    arrivals. ``rebuild`` and ``advance`` order the list as the reference round does (or hand
    out that order lazily) and return the positions to read; ``keeps_sync`` False: the next
    round starts again from the list as it then stands; ``permutes`` False: the last round
    left the list as it stood."""

    keeps_sync = True
    permutes = True
    # Whether a request the reference put back into the sorted list can join the kept order
    # where it stands (``place``); it must then be re-keyed by the next ``advance``.
    placeable = False

    @abstractmethod
    def members(self) -> list[Req]: ...

    def place(self, r: Req, j: int) -> bool:
        """Insert ``r`` at position ``j`` of ``members()``; False (nothing changed) when it
        cannot stand there."""
        return False

    @abstractmethod
    def remove(self, r: Req) -> None: ...

    @abstractmethod
    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]: ...

    @abstractmethod
    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        """Re-key ``changed`` members and place ``arrivals``; ``queue`` is ``members()``
        followed by ``arrivals``."""


class StableEngine(Engine):
    order: Any  # a native StableOrder

    def members(self) -> list[Req]:
        return self.order.reqs

    def remove(self, r: Req) -> None:
        self.order.remove(r)

    def place(self, r: Req, j: int) -> bool:
        return self.order.place(r, j)


def key_fn(pol: Policy, rnd: Round) -> Callable[[Req], Key]:
    """The full sort key of a key policy (priority first under priority scheduling)."""
    key, cfg = pol.key, rnd.config
    assert key is not None
    if cfg.enable_priority_scheduling:
        return lambda r: (*priority_term(r, cfg), *key(r, rnd))
    return lambda r: key(r, rnd)


def _lpm_keys(queue: list[Req], rnd: Round) -> list[Key]:
    """lpm's keys of ``queue`` in one comprehension: ``policies.lpm``'s key, term for term, for
    a round where nobody is overdue (no starvation bound configured)."""
    deferred = rnd.deferred
    return [
        (1, r.rid in deferred, -r.num_matched_prefix_tokens, r.queue_entry_time, r.arrival_time)
        for r in queue
    ]


def _spf_keys(queue: list[Req], rnd: Round) -> list[Key]:
    """shortest-prefill-first's keys of ``queue`` in one comprehension: its key, term for term
    (``prefill_work`` inlined: ``max(1, fill_len - matched)``)."""
    deferred = rnd.deferred
    return [
        (
            r.rid in deferred,
            max(1, r.fill_len - r.num_matched_prefix_tokens),
            r.queue_entry_time,
            r.arrival_time,
        )
        for r in queue
    ]


def keys_of(pol: Policy, queue: list[Req], rnd: Round) -> list[Key]:
    """Every request's full sort key (``key_fn``'s), built without a call per request where
    the key is a built-in one that a batch builder mirrors."""
    cfg = rnd.config
    unbounded = cfg.lpm_max_wait_s is None and cfg.lpm_max_wait_tokens is None  # none overdue
    if pol.key is lpm.key and unbounded and not cfg.enable_priority_scheduling:
        return _lpm_keys(queue, rnd)
    if pol.key is shortest_prefill_first.key and not cfg.enable_priority_scheduling:
        return _spf_keys(queue, rnd)
    return list(map(key_fn(pol, rnd), queue))


class KeyedEngine(StableEngine):
    """A key policy whose key reads the request, its match and its dedup status."""

    placeable = True

    def __init__(self, pol: Policy) -> None:
        self.pol = pol
        self.order = stable_order()

    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        self.order.reset(queue, keys_of(self.pol, queue, rnd))
        queue[:] = self.order.reqs
        return iter(range(len(queue)))

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        if _worth_rebuilding(len(changed) + len(arrivals), len(queue)):
            return self.rebuild(queue, rnd)
        key = key_fn(self.pol, rnd)
        self.order.update([(r, key(r)) for r in changed], [(r, key(r)) for r in arrivals], queue)
        return iter(range(len(queue)))


class RoutingKeyEngine(StableEngine):
    """routing-key: only the members of routing keys whose running count changed are re-keyed.
    A round without running keys leaves the list as it is and drops the sync."""

    def __init__(self, pol: Policy) -> None:
        self.order = stable_order()
        self.counts: Counter[str] = Counter()  # the counts the stored keys were computed with
        self.by_key: dict[str, dict[int, Req]] = {}

    def _key(self, r: Req) -> Key:
        k = r.routing_key
        if k and k in self.counts:
            return (0, -self.counts[k], k, r.queue_entry_time, r.arrival_time)
        return (1, 0, "", r.queue_entry_time, r.arrival_time)

    def remove(self, r: Req) -> None:
        if self.order.remove(r) and r.routing_key:
            group = self.by_key[r.routing_key]
            del group[id(r)]
            if not group:
                del self.by_key[r.routing_key]

    def _place(self, reqs: Sequence[Req]) -> None:
        for r in reqs:
            if r.routing_key:
                self.by_key.setdefault(r.routing_key, {})[id(r)] = r

    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        counts = rnd.running_keys()
        self.by_key = {}
        self.keeps_sync = self.permutes = bool(counts)
        if not counts:  # nothing to sort by: the list stays as it is
            if len(self.order):
                self.order.reset([], [])
            return iter(range(len(queue)))
        self.counts = counts
        self.order.reset(queue, [self._key(r) for r in queue])
        self._place(self.order.reqs)
        queue[:] = self.order.reqs
        return iter(range(len(queue)))

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        counts = rnd.running_keys()
        if not counts:
            return self.rebuild(queue, rnd)
        self.permutes = True
        rekey = {id(r): r for r in changed}
        for k in self.counts.keys() | counts.keys():
            if self.counts.get(k) != counts.get(k):
                rekey.update(self.by_key.get(k, {}))
        self.counts = counts
        if _worth_rebuilding(len(rekey) + len(arrivals), len(queue)):
            return self.rebuild(queue, rnd)
        self.order.update(
            [(r, self._key(r)) for r in rekey.values()],
            [(r, self._key(r)) for r in arrivals],
            queue,
        )
        self._place(arrivals)
        return iter(range(len(queue)))


class HrrnEngine(Engine):
    """hrrn: per-request columns aligned with the list (native ``HrrnColumns``), changed only
    for the requests whose match, dedup status or membership changed; each round computes
    every ratio in one native pass and hands its order out lazily (native ``HrrnRound``:
    ascending (ratio, entry, arrival, rid), a total order). ``lazy``: the list is left as it
    stands (nothing else reads the list's order); else it is sorted as the reference sorts
    it."""

    def __init__(self, pol: Policy, *, lazy: bool = True) -> None:
        self.lazy = lazy
        self.cols = required("the kept orders").HrrnColumns()

    def members(self) -> list[Req]:
        reqs: list[Req] = self.cols.reqs
        return reqs

    def remove(self, r: Req) -> None:
        self.cols.remove(r)

    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        self.cols.clear()
        return self.advance([], list(queue), rnd, queue)

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        rnd_order: Iterator[int] = self.cols.advance(
            changed, arrivals, rnd.deferred, rnd.processed_tokens
        )
        if self.lazy:
            return rnd_order
        self.cols.apply(rnd_order)
        queue[:] = self.cols.reqs
        return iter(range(len(queue)))


class DfsWeightEngine(StableEngine):
    """dfs-weight as a kept order: the native ``DfsWeightOrder`` (``_native/dfs_order.hpp``
    states its invariants). Below a *base* node B that every member's match passes through or
    ends above, the order is a stable sort by ``(deferred, 0, -count(C), C.slot, position in
    C's own DFS)`` for a member under child C of B and ``(deferred, 1, -matched length)`` for
    the others; a child's own order is recomputed only when a member joined, left or moved
    under it. The native side reads each member's match end from the matcher's memo and keeps
    the whole bookkeeping; a member outside B's subtree, a detached B or a re-key of much of
    the list makes its ``advance`` decline, and the list is rebuilt around a new base."""

    placeable = True  # placed above the base, of no child's group: the next advance re-keys it

    def __init__(self, pol: Policy, cache: NativeRadixCache) -> None:
        self.order = required("the kept orders").DfsWeightOrder(cache.tree)

    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        self.order.rebuild(queue, rnd.deferred)
        return iter(range(len(queue)))

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        if not self.order.advance(changed, arrivals, rnd.deferred, queue):
            return self.rebuild(queue, rnd)
        return iter(range(len(queue)))


class FairEngine(Engine):
    """fair: each tenant's own order (longest match, then arrival) is a ``StableOrder``;
    tenants are interleaved by ``VirtualTokenCounter.merge``. With one tenant the merged order
    is that tenant's order itself."""

    def __init__(self, pol: Policy) -> None:
        self.by_tenant: dict[str, Any] = {}  # native StableOrders
        self.tenant_of: dict[int, str] = {}
        self.out: list[Req] = []
        # set.update of the tenants of a sequence's requests from an index on, natively
        # (``add_tenants``: the same adds in the same order).
        self._add_tenants: Callable[[set[str], Sequence[Req], int], None] = required(
            "the kept orders"
        ).add_tenants

    @staticmethod
    def _key(r: Req) -> Key:
        return (-r.num_matched_prefix_tokens, r.queue_entry_time, r.arrival_time)

    placeable = True

    def members(self) -> list[Req]:
        return self.out

    def place(self, r: Req, j: int) -> bool:
        """Only where the list is one tenant's order and ``r`` is that tenant's."""
        order = self.by_tenant.get(r.tenant_key)
        if order is None or len(self.by_tenant) != 1 or self.out is not order.reqs:
            return False
        if not order.place(r, j):
            return False
        self.tenant_of[id(r)] = r.tenant_key
        return True

    def remove(self, r: Req) -> None:
        tenant = self.tenant_of.pop(id(r), None)
        if tenant is None:
            return
        order = self.by_tenant[tenant]
        if self.out is not order.reqs:
            del self.out[self.out.index(r)]
        order.remove(r)
        if not len(order):
            del self.by_tenant[tenant]

    def _observe(self, queue: list[Req], rnd: Round) -> None:
        """The reference round's observation: the tenants of the list (the members' are
        ``by_tenant``'s keys, then the arrivals') and of the running batch, added to one set in
        the reference's order (the running batch's, then the arrivals', natively)."""
        assert rnd.fair is not None
        tenants = set(self.by_tenant)
        self._add_tenants(tenants, rnd.running, 0)
        self._add_tenants(tenants, queue, len(self.out))
        rnd.fair.observe_active(frozenset(tenants))

    def _merge(self, tenant_order: Sequence[str], queue: list[Req], rnd: Round) -> Iterator[int]:
        assert rnd.fair is not None
        self.out = (
            rnd.fair.merge({t: self.by_tenant[t].reqs for t in tenant_order})
            if tenant_order
            else []
        )
        queue[:] = self.out
        return iter(range(len(queue)))

    def rebuild(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        assert rnd.fair is not None
        tenants = set(map(_TENANT, queue))
        tenants.update(map(_TENANT, rnd.running))
        rnd.fair.observe_active(frozenset(tenants))
        return self.rebuild_observed(queue, rnd)

    def advance(
        self, changed: list[Req], arrivals: list[Req], rnd: Round, queue: list[Req]
    ) -> Iterator[int]:
        self._observe(queue, rnd)
        if _worth_rebuilding(len(changed) + len(arrivals), len(queue)):
            return self.rebuild_observed(queue, rnd)
        # Tenants by first appearance in the list as it stands (a tenant's first member heads
        # its own order: the merge keeps each tenant's order); one tenant (or none) needs no
        # sort.
        if len(self.by_tenant) < 2:
            tenant_order = list(self.by_tenant)
        else:
            firsts = sorted((self.out.index(o.reqs[0]), t) for t, o in self.by_tenant.items())
            tenant_order = [t for _, t in firsts]
        per: dict[str, tuple[list[tuple[Req, Key]], list[tuple[Req, Key]]]] = {}
        for r in changed:
            per.setdefault(self.tenant_of[id(r)], ([], []))[0].append((r, self._key(r)))
        for r in arrivals:
            if r.tenant_key not in self.by_tenant:
                self.by_tenant[r.tenant_key] = stable_order()
                tenant_order.append(r.tenant_key)
            self.tenant_of[id(r)] = r.tenant_key
            per.setdefault(r.tenant_key, ([], []))[1].append((r, self._key(r)))
        if len(tenant_order) == 1:  # one tenant: the queue is its order plus the arrivals
            order = self.by_tenant[tenant_order[0]]
            rekey, new = per.get(tenant_order[0], ([], []))
            order.update(rekey, new, queue)
            self.out = order.reqs
            return iter(range(len(queue)))
        for tenant, (rekey, new) in per.items():
            self.by_tenant[tenant].update(rekey, new)
        return self._merge(tenant_order, queue, rnd)

    def one_order(self, arrivals: list[Req]) -> Any:
        """The one tenant's ``StableOrder`` when the list is that order and every arrival is
        of that tenant (``advance`` then merges nothing: the native round can advance it by
        ``_key``'s key); else None."""
        if len(self.by_tenant) != 1:
            return None
        tenant, order = next(iter(self.by_tenant.items()))
        if self.out is not order.reqs or any(r.tenant_key != tenant for r in arrivals):
            return None
        return order

    def advanced(self, arrivals: list[Req], running: Sequence[Req], fair: Any) -> None:
        """What ``advance`` does besides the order's update, after the native round advanced
        ``one_order``'s order (its arrivals placed): the round's observation (the same
        tenants, added in the same order: the members', the running batch's, the arrivals')
        and the arrivals' tenants."""
        tenants = set(self.by_tenant)
        self._add_tenants(tenants, running, 0)
        self._add_tenants(tenants, arrivals, 0)
        fair.observe_active(frozenset(tenants))
        for r in arrivals:
            self.tenant_of[id(r)] = r.tenant_key

    def rebuild_observed(self, queue: list[Req], rnd: Round) -> Iterator[int]:
        """``rebuild`` after this round's tenant observation was made."""
        groups: dict[str, list[Req]] = {}
        for r in queue:
            groups.setdefault(r.tenant_key, []).append(r)
        self.by_tenant, self.tenant_of = {}, {}
        for tenant, reqs in groups.items():
            order = self.by_tenant[tenant] = stable_order()
            order.reset(reqs, [self._key(r) for r in reqs])
            self.tenant_of.update((id(r), tenant) for r in reqs)
        return self._merge(list(groups), queue, rnd)
