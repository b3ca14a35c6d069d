"""The waiting queue: the list of requests waiting for a prefill, and each round's order.

``WaitingQueue`` owns the list. Requests enter at the back (``add``), leave when admitted or
aborted (``remove``, ``take``) and come back after a retraction or preemption (``requeue``).
``begin_round`` runs one prefill round's policy work, in this order:

1. the active policy: a capped policy (lpm, hrrn) above the queue cap orders like fcfs;
2. matching, when the policy reads matches: every waiting request's cached prefix, read-only
   (``match_len``; under ``--compat sglang`` SGLang's ``match_prefix``, which refreshes recency
   and splits nodes);
3. the in-batch prefix dedup, when the policy reads it (below);
4. the order: a key policy sorts the list stably in place; an order policy reorders it;
5. the waiting-prefix refresh: every 32nd eligible round touches the first 128
   requests of the order, head last, so that they are evicted last under LRU; on a prefill
   instance of a split deployment the head of its bootstrap queue (``ahead``) is touched
   first, just before them.

In-batch dedup: among requests whose cache match is at most ``in_batch_prefix_check_threshold``
tokens, those sharing their first ``in_batch_prefix_deprioritize_threshold`` tokens (same
namespace) form a group; one represents the group and the others are *deferred*: sorted last
and, in radixsched mode, not admitted this round, so the shared prefix is computed once and the
others hit it next round. radixsched picks the representative overdue first (lpm's starvation
bound), then with least uncached work, then oldest; SGLang the first in list order, and there
the others are only sorted last.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, pairwise
from typing import Any

from radixsched.cache.base import BasePrefixCache, CacheKey, Namespace
from radixsched.config import SchedulerConfig
from radixsched.policies import (
    FCFS,
    POLICIES,
    SGLANG_PREFIX_MATCH_CAP,
    Policy,
    Reads,
    Round,
    VirtualTokenCounter,
    dedup_rep_key,
    get_policy,
    priority_term,
)
from radixsched.request import Req

logger = logging.getLogger(__name__)

REFRESH_INTERVAL = 32  # waiting-prefix refresh: every this many eligible rounds ...
REFRESH_SPAN = 128  # ... over the first this many requests of the order


def resolve_policy(config: SchedulerConfig, cache: BasePrefixCache) -> Policy:
    """The configured policy, validated against the cache and the priority settings."""
    base = get_policy(config.schedule_policy)
    if config.enable_priority_scheduling and not base.supports_priority:
        valid = ", ".join(n for n, p in POLICIES.items() if p.supports_priority)
        raise ValueError(
            f"--enable-priority-scheduling requires schedule policy {valid}; got {base.name!r}"
        )
    if cache.supports_prefix_sharing():
        return base
    if base.requires_cache:
        raise ValueError(
            f"schedule policy {base.name!r} requires prefix caching, but the radix cache is "
            "disabled"
        )
    if base.cache_aware:
        logger.warning(
            "schedule policy %r needs prefix caching, which is disabled; using 'fcfs'", base.name
        )
        return get_policy(FCFS)
    return base


class RoundOrder:
    """One round's order as admission reads it: ``position(i)`` is where (in the list as it
    stands) the round's ``i``-th request is, None past the end. Positions already produced are
    remembered, so the refresh's ``head`` and the admission loop read the same order."""

    def __init__(self, queue: list[Req], positions: Iterator[int]) -> None:
        self.queue = queue
        self._positions = positions
        self._seen: list[int] = []

    def position(self, i: int) -> int | None:
        seen = self._seen
        while len(seen) <= i:
            nxt = next(self._positions, None)
            if nxt is None:
                return None
            seen.append(nxt)
        return seen[i]

    def head(self, k: int) -> list[Req]:
        out = []
        for i in range(k):
            pos = self.position(i)
            if pos is None:
                break
            out.append(self.queue[pos])
        return out


class WaitingQueue:
    def __init__(self, config: SchedulerConfig, cache: BasePrefixCache) -> None:
        self.config = config
        self.cache = cache
        self.policy = resolve_policy(config, cache)
        self.reqs: list[Req] = []
        self.rng = random.Random(config.seed)
        self.fair = VirtualTokenCounter()
        # The last round's in-batch dedup: the requests it sorted last (``deprioritized``), and
        # those admission must skip this round (``deferred``: the same in radixsched mode,
        # none under SGLang's rules).
        self.deprioritized: frozenset[str] = frozenset()
        self.deferred: frozenset[str] = frozenset()
        self._seq_of: dict[int, int] = {}  # id(req) -> arrival sequence number
        self._next_seq = 0
        self._refresh_rounds = 0
        cap = config.max_prefix_match_queue
        if config.sglang_compat and cap is None:
            cap = SGLANG_PREFIX_MATCH_CAP
        self.cap = cap
        self.matches = cache.supports_prefix_sharing()
        self.refresh_on = config.enable_waiting_prefix_refresh and (
            config.radix_eviction_policy.lower() == "lru"
        )
        # Requests outside the queue whose prefixes a refresh touches first (a prefill
        # instance's bootstrap queue), oldest first.
        self.ahead: Callable[[], Sequence[Req]] | None = None

    def __len__(self) -> int:
        return len(self.reqs)

    # ---- membership --------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        """``req`` joins at the back. Its ``num_matched_prefix_tokens`` is the capped match at
        the door, the load snapshot a router reads until a round or an admission attempt
        refreshes it."""
        self._seq_of[id(req)] = self._next_seq
        self._next_seq += 1
        if self.matches:
            n = self.cache.match_len(CacheKey(req.fill_ids(), req.namespace))
            req.num_matched_prefix_tokens = door_match(req, n, self.cache.page_size)
        self.reqs.append(req)

    def remove(self, req: Req) -> None:
        """``req`` leaves the queue for good (aborted, or displaced by the queue limit)."""
        self.reqs.remove(req)
        self._seq_of.pop(id(req), None)

    def take(self, positions: Sequence[int]) -> list[Req]:
        """Remove the requests at ``positions`` (admitted this round); return them."""
        taken = [self.reqs[i] for i in positions]
        for i in sorted(positions, reverse=True):
            del self.reqs[i]
        return taken

    def forget(self, req: Req) -> None:
        """``req`` finished or was aborted after leaving the queue: drop its arrival number."""
        self._seq_of.pop(id(req), None)

    def requeue(self, reqs: Sequence[Req], now: float, processed_tokens: int) -> None:
        """Re-entry after retraction or preemption. radixsched keeps each request's seniority
        (queue entry, HRRN snapshot, place in arrival order) when the list is in arrival order
        and the policy reads it; SGLang appends them with fresh stamps (they may starve)."""
        if self.config.sglang_compat:
            for r in reqs:
                r.queue_entry_time = now
                r.queue_entry_processed_tokens = processed_tokens
                self.reqs.append(r)
        elif not self.policy.list_order_free and self._in_arrival_order():
            for r in reqs:  # each goes back to its place in arrival order
                pos = bisect.bisect_left(self.reqs, self._seq_of[id(r)], key=self._arrival_seq)
                self.reqs.insert(pos, r)
        else:
            self.reqs.extend(reqs)

    def _arrival_seq(self, r: Req) -> int:
        return self._seq_of[id(r)]

    def _in_arrival_order(self) -> bool:
        seqs = map(self._seq_of.__getitem__, map(id, self.reqs))
        return all(a <= b for a, b in pairwise(seqs))  # stops at the first one out of order

    # ---- a round -----------------------------------------------------------------------------
    def active_policy(self) -> Policy:
        """The policy that orders a queue of this length (a capped one: fcfs above the cap)."""
        if self.policy.capped and self.cap is not None and len(self.reqs) > self.cap:
            return get_policy(FCFS)
        return self.policy

    def begin_round(self, running: Sequence[Req], processed_tokens: int, now: float) -> RoundOrder:
        """Match, dedup and order the queue for one prefill round (see the module docstring)."""
        base = self.active_policy()
        pol = base.variant(self.config)
        reads = base.reads_for(self.config)
        rnd = Round(self.config, processed_tokens=processed_tokens, now=now, running=running)
        # SGLang scores cache-aware policies with match_prefix (recency refresh, node splits).
        node_matching = self.config.sglang_compat and base.cache_aware
        device: list[int] = []
        if Reads.MATCH & reads and self.matches:
            device = self.match_all(rnd, node_matching, Reads.TREE in reads)
        if Reads.DEDUP & reads and device:
            rnd.deferred = self.dedup(device, rnd, bounded=base.bounded(self.config))
        self.deprioritized = rnd.deferred
        self.deferred = rnd.deferred if not self.config.sglang_compat else frozenset()
        order = RoundOrder(self.reqs, self.order(pol, rnd))
        if not node_matching:  # SGLang's matching refreshed recency already
            self.refresh(order)
        return order

    def match_all(self, rnd: Round, node_matching: bool, tree: bool) -> list[int]:
        """Set every request's ``num_matched_prefix_tokens`` (capped at ``fill_len - 1``);
        return the uncapped device matches. ``tree``: also record where each match ends, for
        ``rnd.tree_order`` (the DFS of dfs-weight)."""
        cache = self.cache
        device: list[int] = []
        ends: list[tuple[Any, int]] = []
        for r in self.reqs:
            key = CacheKey(r.fill_ids(), r.namespace)
            if node_matching:  # also sets the request's prefix fields, as SGLang does
                m = cache.match_node(key)
                n, end = m.device_len, (m.last_node, len(m.last_node))
                r.prefix_len, r.last_node, r.host_hit_len = n, m.last_node, m.host_len
                total = n + m.host_len
            elif tree:
                n, node, offset = cache.match_end(key)
                total, end = n, (node, offset)
            else:
                n = total = cache.match_len(key)
            r.num_matched_prefix_tokens = min(total, r.fill_len - 1)
            device.append(n)
            ends.append(end if tree else (None, 0))
        if tree:
            rnd.tree_order = lambda: cache.dfs_weight_order_at(ends)
        return device

    def dedup(self, device: list[int], rnd: Round, *, bounded: bool = False) -> frozenset[str]:
        """The in-batch dedup's deferred (compat: deprioritized) request ids. ``bounded``:
        lpm's starvation bound is on, and overdue requests represent their groups first."""
        cfg = self.config
        check = cfg.in_batch_prefix_check_threshold
        threshold = cfg.in_batch_prefix_deprioritize_threshold
        if check < 0:
            return frozenset()
        cands = [r for r, n in zip(self.reqs, device, strict=True) if n <= check]
        if cfg.sglang_compat and threshold <= 0:
            return frozenset(r.rid for r in cands)  # SGLang: a >= 0-token match always holds
        groups: dict[tuple[Namespace, bytes], list[Req]] = {}
        width = max(threshold, 0)
        for r in cands:
            if r.fill_len >= width:
                groups.setdefault((r.namespace, r.fill_slice(0, width).tobytes()), []).append(r)
        dup: set[str] = set()
        for group in groups.values():
            if len(group) > 1:
                rep = group[0] if cfg.sglang_compat else min(group, key=_rep_key(rnd, bounded))
                dup.update(r.rid for r in group if r is not rep)
        return frozenset(dup)

    def order(self, pol: Policy, rnd: Round) -> Iterator[int]:
        """Put the list in the round's order (stable sort by a key, or the policy's order)."""
        if pol.order is not None:
            rnd.rng, rnd.fair = self.rng, self.fair
            return pol.order(self.reqs, rnd)
        key = pol.key
        assert key is not None
        if self.config.enable_priority_scheduling:
            cfg = self.config
            self.reqs.sort(key=lambda r: (*priority_term(r, cfg), *key(r, rnd)))
        else:
            self.reqs.sort(key=lambda r: key(r, rnd))
        return iter(range(len(self.reqs)))

    def refresh(self, order: RoundOrder) -> None:
        """The waiting-prefix refresh, in rounds whose matching is read-only (or
        absent) under LRU eviction."""
        if not (self.refresh_on and self.matches and self.reqs):
            return
        due = self._refresh_rounds % REFRESH_INTERVAL == 0
        self._refresh_rounds += 1
        if due:
            head = order.head(REFRESH_SPAN)
            reqs = chain(reversed(self.ahead_of_refresh()), reversed(head))
            self.cache.touch_prefixes(CacheKey(r.fill_ids(), r.namespace) for r in reqs)

    def ahead_of_refresh(self) -> Sequence[Req]:
        return () if self.ahead is None else self.ahead()


def door_match(req: Req, n: int, page: int) -> int:
    """The door's capped match: ``n`` cut to the whole pages of ``fill_len - 1``."""
    return min(n, req.max_prefix_len() // page * page)


def _rep_key(rnd: Round, bounded: bool) -> Any:
    if not bounded:
        return dedup_rep_key
    return lambda r: (not rnd.overdue(r), *dedup_rep_key(r))
