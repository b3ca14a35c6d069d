"""``NativeWaitingQueue``: the reference ``WaitingQueue`` with its round's work made incremental.

Same list, same order, same fields on every request as the reference round leaves them (the
equivalence suite checks it bit for bit); a round costs what changed since the last one, and
for a policy that reads matches its matching, matched lengths and dedup take one native call
(``NativeMatcher.round``, ``_native/round.cpp``), which also advances lpm's kept order when the
list is in sync with it (else the engines below order the list, decided per round):

- matching: ``NativeMatcher`` (in C++, inside the native tree) re-matches a request only when
  the cache changed at its match's edge; the matched lengths of requests an admission attempt rewrote are restored;
- the dedup: kept by the matcher (``_native/dedup.cpp``), it re-decides only the groups whose
  members changed;
- the order: the policy's ``Engine`` (``orders.py``) re-places only the requests whose key
  inputs changed (matched length, dedup status), plus the arrivals; requests the reference
  puts back at their places in arrival order (a retraction) take those places in a key
  policy's kept order; fcfs skips its sort while the list is known to be in entry order;
  random's lazy Fisher-Yates runs natively (``LazyShuffle``, ``_native/lazy_shuffle.cpp``:
  the same swaps and draws, made on the ``random.Random`` object's own state as each
  position is read, the refresh's head included).

Under ``--compat sglang`` a policy whose compat round is its radixsched round (fair: no SGLang
variant, read-only matching, no dedup) runs the rounds above; spf's and dfs-weight's compat
rounds (SGLang's node matching of every request, its dedup, the order) run in one native call
(``compat_round``, ``_native/compat_round.cpp``), each match a touch where the matcher's memo
ends. Where an accelerator does not apply (any other compat round, lpm's starvation bound, a
clock-reading policy without an engine, a capped policy's fcfs rounds) the reference round
runs, on matches the matcher keeps current; SGLang's fcfs, lof and random orders there are
cheaper (``order``: the list left standing, a C-keyed sort, the native shuffle of
``_native/shuffle.cpp`` on the generator's state). Membership changes come through the queue's own
methods, so the engines see every arrival and departure; a round checks (identity compares)
that the list is what they describe and rebuilds when it is not. Admission's ``take`` (the
list edit, the untracking, the kept order's removal) and the reference refresh's touches each
run in one native call (``queue_take``, ``touch_fills``: ``_native/round.cpp``).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterator, Sequence
from random import Random
from typing import Any, cast

from radixsched.cache.base import CacheKey
from radixsched.config import SchedulerConfig
from radixsched.native import core, namespace_id, namespace_of
from radixsched.native.matching import NativeMatcher
from radixsched.native.orders import (
    DfsWeightEngine,
    Engine,
    FairEngine,
    HrrnEngine,
    KeyedEngine,
    RoutingKeyEngine,
    StableEngine,
)
from radixsched.native.radix import NativeRadixCache, as_tokens
from radixsched.policies import (
    FCFS,
    Policy,
    Reads,
    Round,
    dfs_weight_sglang,
    fcfs_sglang,
    lof_sglang,
    lpm,
    random_order,
    random_sglang,
    shortest_prefill_first,
    spf_sglang,
)
from radixsched.queue import REFRESH_INTERVAL, REFRESH_SPAN, RoundOrder, WaitingQueue, door_match
from radixsched.request import Req, SamplingParams

# Engines of the policies whose order reads more than the request, its match and its dedup
# status (any other key policy is kept by ``KeyedEngine``).
ENGINES: dict[str, Any] = {
    "routing-key": RoutingKeyEngine,
    "hrrn": HrrnEngine,
    "dfs-weight": DfsWeightEngine,
    "fair": FairEngine,
}
_KEYED_READS = Reads.MATCH | Reads.DEDUP
COMPAT_SPF, COMPAT_DFS = 1, 2  # compat_round's orders (_native/compat_round.hpp)
# The keys the native round builds for a kept ``StableOrder`` (``queue_round``'s ``key``:
# ``_native/round.cpp``'s lpm_key and spf_key, term for term, with nobody overdue).
KEPT_KEYS = {lpm.key: 0, shortest_prefill_first.key: 1}
FAIR_KEY = 2  # fair's key within one tenant (``FairEngine._key``; ``queue_round``'s fair_key)

_ENTRY = operator.attrgetter("queue_entry_time", "arrival_time")
_MAX_NEW = operator.attrgetter("sampling.max_new_tokens")  # ``Req.max_new_tokens``
_RANGE_ITERATOR = type(iter(range(0)))
_NO_RIDS: frozenset[str] = frozenset()  # (one, not one a round)
_RANDOM_ORDER = random_order.order  # the plain random policy's generator


def _lists(positions: Iterator[int], n: int) -> bool:
    """Whether ``positions`` is a fresh iterator over ``range(n)``: the round's order is then
    the list itself (its head is the list's head)."""
    return type(positions) is _RANGE_ITERATOR and positions.__reduce__()[1:] == ((range(n),), 0)


def _compat_is_plain(pol: Policy) -> bool:
    """Whether SGLang's compat round of ``pol`` is its radixsched round (so the accelerators
    apply): no SGLang variant (the same order), no node matching (not cache-aware: its
    matching is read-only there too), no dedup (compat defers none) and no queue cap (compat
    caps at its own bound). Requeues differ, and ``requeue`` follows the reference there."""
    reads_dedup = Reads.DEDUP in pol.reads
    return pol.sglang is None and not (pol.cache_aware or pol.capped or reads_dedup)


class NativeWaitingQueue(WaitingQueue):
    def __init__(self, config: SchedulerConfig, cache: Any) -> None:
        super().__init__(config, cache)
        # Accelerated over the native tree only (any other cache: the reference's rounds).
        native = isinstance(cache, NativeRadixCache)
        same = not config.sglang_compat or _compat_is_plain(self.policy)
        self.fast = same and native and self.matches
        # The reference round's matching (SGLang compat; a capped policy's fallback) over the
        # whole list natively, unless a subclass overrides the cache's match (then: its loop).
        self.native_nodes = native and type(cache).match_node is NativeRadixCache.match_node
        self.native_touch = native and type(cache).touch_at is NativeRadixCache.touch_at
        # (the native admission's in-flight guard matches natively: native.admit.covers)
        self.native_lens = native and type(cache).match_len is NativeRadixCache.match_len
        # SGLang's compat round in one native call (compat_round's order; None: not native).
        self.compat_kind = self._compat_kind(self.policy)
        # Only a policy that reads matches needs them kept (the door's is one walk); a native
        # compat round reads them too (its node matching: a touch where each memo ends).
        wants = Reads.MATCH in self.policy.reads
        tracks = (self.fast and wants) or self.compat_kind is not None
        self.matcher = NativeMatcher(cache) if tracks else None
        if self.matcher is not None and self.compat_kind == COMPAT_SPF:  # its key, its dedup
            self.matcher.compat_keys_on(config.in_batch_prefix_deprioritize_threshold)
        reads = self.policy.reads_for(config)
        bounded = self.policy.bounded(config)
        check, width = (
            config.in_batch_prefix_check_threshold,
            config.in_batch_prefix_deprioritize_threshold,
        )
        # The native dedup (else: the reference's, as the starvation bound picks by the clock).
        self.native_dedup = (
            self.fast
            and self.matcher is not None
            and check >= 0
            and not bounded
            and Reads.DEDUP in reads
        )
        if self.native_dedup:
            assert self.matcher is not None
            self.matcher.dedup_on(check, max(width, 0))
        self.engine = self._make_engine(reads) if self.fast and not bounded else None
        self.reads = reads  # a fast round's (its policy is the configured one)
        self._tree_reads = Reads.TREE in reads  # (an enum flag's test is a Python call)
        self.dedup_in_python = Reads.DEDUP in reads and not self.native_dedup
        self._core: Any = core() if self.fast else None
        # ``take`` in one native call (a native tree means the core is loaded).
        self._native_take = cast(Any, core()).queue_take if native else None
        # SGLang compat's lof sort natively (``sort_lof``; it declines what Python must sort).
        self._sort_lof = cast(Any, core()).sort_lof if native else None
        # The reference refresh's touches in one native call, over the native tree's own
        # touch_prefixes (a subclass's is called as the reference calls it); a ``Req``'s fill
        # read there (a subclass's fill_ids called).
        walks = native and type(cache).touch_prefixes is NativeRadixCache.touch_prefixes
        self._touch_fills = cast(Any, core()).touch_fills if walks else None
        self._walked: Any = cache.tree if walks else None  # the tree it walks (the matcher's)
        # ``add_many``'s pass after the matching in one native call (its matching is native:
        # the tree is, and so the core is loaded).
        self._queue_pass: Any = cast(Any, core()).queue_pass if native else None
        # How ``take`` removes a request from the engine: (its order: StableEngine's remove,
        # called natively, or None; else the engine's remove, or None without an engine). The
        # engine and its order are set here, once.
        engine = self.engine
        self._engine_removal: tuple[Any, Any] = (None, None)
        if isinstance(engine, StableEngine) and type(engine).remove is StableEngine.remove:
            self._engine_removal = (engine.order, None)
        elif engine is not None:
            self._engine_removal = (None, engine.remove)
        self._take_fixed = self._take_setup()
        # lpm's, spf's or dfs-weight's kept order, advanced inside the native round (None: the
        # engine's own advance); a key policy's order is keyed there by ``kept_key``'s key.
        self.kept_key = KEPT_KEYS[lpm.key]
        self.kept_order = self._kept_order()
        # fair's engine, whose one tenant's order the native round advances (None: not fair's).
        fair_kept = isinstance(self.engine, FairEngine) and self.matcher is not None
        self._fair_engine = cast(FairEngine, self.engine) if fair_kept else None
        if fair_kept:
            self.kept_key = FAIR_KEY
        self.synced = False  # the engine's members + ``added`` are the list
        self.matched = False  # every waiting request's matched length is current but ``moved``,
        # ``tried`` and ``added``; and the dedup's statuses are the last round's
        self.added: list[Req] = []  # arrivals since the last engine round, in append order
        self.moved: dict[int, Req] = {}  # re-matched since the last engine round
        self.tried: dict[int, Req] = {}  # matched lengths an admission attempt rewrote
        self.entry_ordered = True  # the list is in (queue entry, arrival) order
        self._last_entry = (float("-inf"), float("-inf"))
        self._arrival_known = True  # the list is known to be in arrival order (else: unknown)
        self._arrival_settled = False  # (inside ``requeue`` only) the test's answer is known
        # ``begin_round``'s reads of the frozen config and policy (``_plain_fcfs``, and whether
        # ``active_policy`` can pick another policy than the configured one).
        self._fcfs = self._plain_fcfs()
        # ``begin_round``'s plain fcfs round (``_fcfs_order``): nothing but the entry order.
        self._fcfs_round = (
            self.fast
            and self._fcfs
            and self.matcher is None
            and self.engine is None
            and not self.dedup_in_python
            and not self._tree_reads
        )
        self._capped = self.policy.capped and self.cap is not None
        # SGLang's random round (the whole list shuffled by ``self.rng``) natively.
        self._shuffle = cast(Any, core()).shuffle if native else None
        # The plain random round's lazy Fisher-Yates natively, drawing from ``self.rng``'s own
        # state in place (``_native/lazy_shuffle.cpp``; None: the reference generator). Its
        # layout check (once per process) runs for the plain random policy only.
        plain_random = self.policy.variant(config).order is _RANDOM_ORDER
        lazy = native and plain_random and cast(Any, core()).random_layout_ok()
        self._lazy_shuffle = cast(Any, core()).LazyShuffle if lazy else None
        # SGLang's random round on ``self.rng``'s own state in place (no state through Python).
        in_place = native and self.policy.variant(config).order is random_sglang
        in_place = in_place and cast(Any, core()).random_layout_ok()
        self._shuffle_in_place = cast(Any, core()).shuffle_in_place if in_place else None

    def _make_engine(self, reads: Reads) -> Engine | None:
        pol = self.policy
        factory = ENGINES.get(pol.name)
        if factory is DfsWeightEngine:
            assert isinstance(self.cache, NativeRadixCache)
            return DfsWeightEngine(pol, self.cache)
        if factory is HrrnEngine:  # lazy unless a capped fallback round may read the list
            return HrrnEngine(pol, lazy=self.cap is None)
        if factory is not None:
            engine: Engine = factory(pol)
            return engine
        if pol.key is not None and reads & ~_KEYED_READS == Reads.NONE and not self._plain_fcfs():
            return KeyedEngine(pol)
        return None

    def _kept_order(self) -> Any:
        """The kept order the native round advances (``queue_round``): lpm's or spf's
        ``StableOrder`` (its key ``kept_key``; declined: ``_order`` runs) or dfs-weight's
        ``DfsWeightOrder`` (always ordered there: its advance, else its rebuild, as ``_order``
        would); None: ``_order`` runs."""
        engine, cfg = self.engine, self.config
        if isinstance(engine, DfsWeightEngine) and self.matcher is not None:
            return engine.order
        unbounded = cfg.lpm_max_wait_s is None and cfg.lpm_max_wait_tokens is None
        kept = isinstance(engine, KeyedEngine) and engine.pol.key in KEPT_KEYS
        if kept and unbounded and not cfg.enable_priority_scheduling and self.matcher is not None:
            assert isinstance(engine, KeyedEngine)
            self.kept_key = KEPT_KEYS[engine.pol.key]
            return engine.order
        return None

    def _plain_fcfs(self) -> bool:
        return self.policy.name == FCFS and not self.config.enable_priority_scheduling

    def _device_match_len(self, r: Req) -> int:
        assert self.matcher is not None
        return self.matcher.memo[id(r)].n

    def _match_end(self, r: Req) -> tuple[Any, int]:
        assert self.matcher is not None
        m = self.matcher.memo[id(r)]
        return (m.node, len(m.node) if m.full else m.offset)

    # ---- membership --------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        if self.matcher is None:
            super().add(req)
        else:
            self._seq_of[id(req)] = self._next_seq
            self._next_seq += 1
            m = self.matcher.track(req)
            req.num_matched_prefix_tokens = door_match(req, m.n, self.cache.page_size)
            self.reqs.append(req)
        entry = _ENTRY(req)
        self.entry_ordered = len(self.reqs) == 1 or (
            self.entry_ordered and entry >= self._last_entry
        )
        self._last_entry = entry
        self.added.append(req)

    def add_many(self, reqs: list[Req]) -> None:
        """``add`` of each of ``reqs`` in order, their matching in one native call (nothing
        between two arrivals reads the queue, and a track changes only its own request's);
        without a matcher, the door's read-only match of each on the native tree (the
        reference ``add``'s ``match_len``, without its frames)."""
        m = self.matcher
        if not reqs or (m is None and not (self.matches and self.native_lens)):
            for r in reqs:
                self.add(r)
            return
        if m is not None:
            lens = m.track_many(reqs)
        else:  # NativeRadixCache.match_len of each fill (no side effects), in one native call
            tree = cast(NativeRadixCache, self.cache).tree
            lens = tree.match_lens(reqs, as_tokens, namespace_id)
        # One pass for the rest (the matching reads none of it): the arrival numbers, the door's
        # match, and ``add``'s entry-order test as the list grows one request at a time; in
        # one native call (``_core.queue_pass``: the same reads, tests and writes in order).
        queue = self.reqs
        self._next_seq, self.entry_ordered, self._last_entry = self._queue_pass(
            reqs, lens, self._seq_of, self._next_seq, self.cache.page_size, len(queue),
            self.entry_ordered, self._last_entry,
        )  # fmt: skip
        queue.extend(reqs)
        self.added.extend(reqs)

    def remove(self, req: Req) -> None:
        super().remove(req)
        self._untrack(req)

    def take(self, positions: Sequence[int]) -> list[Req]:
        """The reference's take, then each taken request untracked (``_untrack``), in one
        native call (``queue_take``, ``_native/round.cpp``: the same effects in the same
        order) unless the matcher keeps compat keys (then: here, request by request)."""
        fixed, native_take = self._take_fixed, self._native_take
        if fixed is None or native_take is None:  # (tests turn ``_native_take`` off)
            taken = super().take(positions)
            for r in taken:
                self._untrack(r)
            return taken
        tree, fills, reqs_of, order, remove = fixed
        got: list[Req] = native_take(
            self.reqs, positions, tree, fills, reqs_of, self.moved, self.tried, self.added, order,
            remove
        )  # fmt: skip
        return got

    def _take_setup(self) -> tuple[Any, Any, Any, Any, Any] | None:
        """``take``'s native call's arguments that are fixed for the run (the matcher's tree,
        fills and requests, or None without one; ``_engine_removal``), set once the queue is
        built (the matcher's compat keys are switched on in ``__init__`` only); None: the
        native take does not apply (no native tree, or compat keys kept)."""
        m = self.matcher
        if self._native_take is None or (m is not None and m.keys is not None):
            return None
        order, remove = self._engine_removal
        if m is None:
            return None, None, None, order, remove
        return m._tree, m._fills, m.reqs, order, remove

    def _untrack(self, r: Req) -> None:
        if self.matcher is not None:
            self.matcher.untrack(r)
        self.moved.pop(id(r), None)
        self.tried.pop(id(r), None)
        for i, a in enumerate(self.added):
            if a is r:
                del self.added[i]
                return
        if self.engine is not None:
            self.engine.remove(r)

    def requeue(self, reqs: Sequence[Req], now: float, processed_tokens: int) -> None:
        for r in reqs:  # their output changed: matched afresh
            if self.matcher is not None:
                self.matcher.track(r)
        n = len(self.reqs)
        # The reference's branch: placed by arrival (the list stays in arrival order) or appended.
        placed = not self.config.sglang_compat and not self.policy.list_order_free
        placed = placed and self._in_arrival_order()
        self._arrival_settled = True  # the reference's requeue asks again: the same answer
        ordered = self.entry_ordered
        engine = self.engine
        kept = engine is not None and engine.placeable and self.synced and self._in_sync(engine)
        try:
            super().requeue(reqs, now, processed_tokens)
        finally:
            self._arrival_settled = False  # the list changed
        self._arrival_known = placed
        self.entry_ordered = ordered and self._fit_entry_order(reqs, placed)
        if self.reqs:
            self._last_entry = _ENTRY(self.reqs[-1])
        if self.reqs[n:] == list(reqs):  # appended: arrivals to the kept order
            self.added.extend(reqs)
        elif not (kept and self._place_requeued(reqs)):  # re-inserted at their places
            self.added.extend(reqs)
            self.synced = False

    def _place_requeued(self, reqs: Sequence[Req]) -> bool:
        """Put requests the reference re-inserted into the sorted list into the kept order at
        their places (those among the arrivals join the arrivals there), so the order stays in
        sync; each placed one is re-keyed next round. False: the order must be rebuilt."""
        engine = self.engine
        assert engine is not None
        back = {id(r) for r in reqs}
        first_arrival = self.added[0] if self.added else None
        in_order = len(engine.members()) > 0  # the list's head is the kept order, then the arrivals
        j = 0
        arrivals: list[Req] = []
        for r in self.reqs:
            if r is first_arrival:
                in_order = False
            if not in_order:
                arrivals.append(r)
            elif id(r) not in back:
                j += 1
            elif engine.place(r, j):
                self.moved[id(r)] = r
                j += 1
            else:
                return False
        self.added = arrivals
        return True

    def _fit_entry_order(self, reqs: Sequence[Req], placed: bool) -> bool:
        """Whether each of ``reqs`` (just requeued into an entry-ordered list) sits in entry
        order with its neighbours: then the whole list is in entry order."""
        q, n = self.reqs, len(self.reqs)
        if placed:
            spots = [
                bisect.bisect_left(q, self._seq_of[id(r)], key=self._arrival_seq) for r in reqs
            ]
        else:
            spots = list(range(n - len(reqs), n))
        return all(
            (i == 0 or _ENTRY(q[i - 1]) <= _ENTRY(q[i]))
            and (i + 1 == n or _ENTRY(q[i]) <= _ENTRY(q[i + 1]))
            for i in spots
        )

    def _in_arrival_order(self) -> bool:
        """The reference's test, in C-level passes (every waiting request has its arrival
        number: ``add`` gives it, only leaving the queue drops it); known while the list keeps
        its order, and inside ``requeue`` when it is not (asked there twice)."""
        if not (self._arrival_known or self._arrival_settled):
            # Lazily, each pair once, stopping at the first out of order (a kept order's list
            # seldom is in arrival order): two tee'd passes over the arrival numbers.
            seqs, later = itertools.tee(map(self._seq_of.__getitem__, map(id, self.reqs)))
            next(later, None)
            self._arrival_known = all(map(operator.le, seqs, later))
        return self._arrival_known

    def admission_end(self, req: Req) -> tuple[Any, int, int] | None:
        """Where the admission's match (the fill capped at ``fill_len - 1``, whole pages) ends:
        (node, offset into it, length), from ``req``'s memo; None when it is not current."""
        if self.matcher is None or id(req) in self.matcher.dirty:
            return None
        m = self.matcher.memo.get(id(req))
        if m is None:
            return None
        node, offset = m.node, (len(m.node) if m.full else m.offset)
        cap = req.max_prefix_len() // self.cache.page_size * self.cache.page_size
        extra = m.n - cap  # the whole fill is cached: step back to the cap
        while extra > 0:
            if offset > extra:
                offset, extra = offset - extra, 0
            else:
                extra -= offset
                assert node.parent is not None
                node = node.parent
                offset = len(node)
        return node, offset, min(m.n, cap)

    def refresh(self, order: RoundOrder, head: list[Req] | None = None) -> None:
        """The reference's refresh, touching each request where its memo says its match ends
        (the walk's side effects, without the walk). ``head``: the order's head, when it is
        the list's (the round's positions are the list's)."""
        if not (self.refresh_on and self.matches and self.reqs):
            return
        matcher = self.matcher
        due = self._refresh_rounds % REFRESH_INTERVAL == 0
        if due and (matcher is None or not self.matched or matcher.dirty):
            if self._touch_fills is None:  # a cache subclass's touch_prefixes: called as there
                super().refresh(order)  # (a round that is not due only counts, there as here)
                return
            # The reference's refresh: the head read first, then the touches in one native call.
            self._refresh_rounds += 1
            span = self._head(order) if head is None else head[:REFRESH_SPAN]
            self._touch_fills(self._walked, self.ahead_of_refresh(), span, namespace_of, Req)
            return
        self._refresh_rounds += 1
        if due:
            assert matcher is not None
            ahead = self.ahead_of_refresh()
            if ahead:  # not waiting, so not matched: walked (a split keeps the memos current)
                self.cache.touch_prefixes(
                    CacheKey(r.fill_ids(), r.namespace) for r in reversed(ahead)
                )
            # Head last, each at its memo's end (in one native call unless the cache hooks its
            # touches: a subclass's touch_at is called for each).
            span = self._head(order) if head is None else head[:REFRESH_SPAN]
            if self.native_touch:
                matcher.touch_ends(span)
                return
            for r in reversed(span):
                m = matcher.memo[id(r)]
                matcher.cache.touch_at(m.node, len(m.node) if m.full else m.offset)

    def _head(self, order: RoundOrder) -> list[Req]:
        """``order.head(REFRESH_SPAN)``; a ``LazyShuffle``'s positions read natively into the
        order's remembered ones (as ``position`` reads them: the same draws)."""
        positions: Any = order._positions
        if self._lazy_shuffle is None or type(positions) is not self._lazy_shuffle:
            return order.head(REFRESH_SPAN)
        span: list[Req] = positions.head(order.queue, order._seen, REFRESH_SPAN)
        return span

    def note_tried(self, req: Req) -> None:
        """An admission attempt that failed rewrote ``req``'s matched length."""
        self.tried[id(req)] = req

    # ---- a round -----------------------------------------------------------------------------
    def begin_round(self, running: Sequence[Req], processed_tokens: int, now: float) -> RoundOrder:
        base = self.active_policy() if self._capped else self.policy
        known = self._arrival_known
        if not (self.fast and base is self.policy and self._fcfs and self.entry_ordered):
            self._arrival_known = False  # the round's order may permute the list
        if not self.fast or base is not self.policy:
            self.synced = self.matched = False
            compat = self._compat_round(base, running, processed_tokens, now)
            return compat or super().begin_round(running, processed_tokens, now)
        deferred: frozenset[str] = _NO_RIDS
        flipped: list[Req] = []
        if self.matcher is not None:  # the policy reads matches: the native round
            # The kept order the native round advances (none while out of sync; fair: its one
            # tenant's order, ``FairEngine.one_order``), keyed by ``kept_key``'s key.
            fair = self._fair_engine
            kept = self.kept_order if fair is None else fair.one_order(self.added)
            deferred, flipped, done = self.matcher.round(
                self.reqs, self.added, self.moved, self.tried, self.matched, self.native_dedup,
                kept if self.synced else None, self.kept_key,
            )  # (positional: matched, dedup, order, key)  # fmt: skip
            self.matched = True
            if done:  # the kept order advanced there: the list is the round's order
                if fair is not None:  # the rest of fair's advance (``added``: its arrivals)
                    fair.advanced(self.added, running, self.fair)
                self.added, self.moved = [], {}
                self.deprioritized = self.deferred = deferred
                order = RoundOrder(self.reqs, iter(range(len(self.reqs))))
                # (``refresh``'s test below; a matcher means the queue matches)
                if self._refresh_rounds % REFRESH_INTERVAL and self.refresh_on and self.reqs:
                    self._refresh_rounds += 1
                else:
                    self.refresh(order, head=self.reqs)
                return order
        elif self._fcfs_round:
            return self._fcfs_order()
        rnd = Round(self.config, deferred, processed_tokens, now, running)
        if self.dedup_in_python:
            rnd.deferred, flipped = self._dedup(rnd)
        if self._tree_reads:  # for a policy without an engine (built when it asks)
            rnd.tree_order = lambda: self.cache.dfs_weight_order_at(
                list(map(self._match_end, self.reqs))
            )
        self.deprioritized = self.deferred = rnd.deferred
        positions = self._order(base, self.reads, rnd, flipped)
        order = RoundOrder(self.reqs, positions)
        if self.engine is not None and not self.engine.permutes:
            self._arrival_known = known  # the engine left the list as it stood
        # A round that is not due: ``refresh`` only counts it (here without its call).
        due = self._refresh_rounds % REFRESH_INTERVAL == 0
        if not due and self.refresh_on and self.matches and self.reqs:
            self._refresh_rounds += 1
        else:
            self.refresh(order, head=self.reqs if _lists(positions, len(self.reqs)) else None)
        return order

    def _fcfs_order(self) -> RoundOrder:
        """``begin_round``'s accelerated round for plain fcfs without a matcher, an engine, a
        Python dedup or tree reads (``_fcfs_round``): nothing deferred, the list put in entry
        order (``_reference_order``), no ``Round`` built (nothing reads it), the list itself
        the round's order."""
        self.deprioritized = self.deferred = frozenset()
        positions = self._reference_order(self.policy, None)
        self.synced = False  # (``_order`` without an engine)
        self.added, self.moved = [], {}
        order = RoundOrder(self.reqs, positions)
        if (
            self._refresh_rounds % REFRESH_INTERVAL
            and self.refresh_on
            and self.matches
            and self.reqs
        ):
            self._refresh_rounds += 1  # not due: ``refresh`` only counts it
        else:
            self.refresh(order, head=self.reqs)
        return order

    def _compat_round(
        self, base: Policy, running: Sequence[Req], processed_tokens: int, now: float
    ) -> RoundOrder | None:
        """The reference's round under SGLang compat for a cache-aware policy whose order is
        native (spf's sort, dfs-weight's tree order) in one native call (``compat_round``,
        ``_native/compat_round.cpp``: its node matching, dedup and order); None elsewhere."""
        kind = self.compat_kind
        if kind is None or base is not self.policy:
            return None
        cfg, cache = self.config, self.cache
        assert isinstance(cache, NativeRadixCache)
        check = cfg.in_batch_prefix_check_threshold
        dedup = Reads.DEDUP in base.reads_for(cfg) and check >= 0
        threshold = cfg.in_batch_prefix_deprioritize_threshold
        native: Any = core()
        keys = None if self.matcher is None else self.matcher.keys
        deferred, ordered = native.compat_round(
            cache.tree, self.reqs, keys, cache.disabled, namespace_id, dedup, check, threshold, kind
        )
        self.deprioritized, self.deferred = deferred, frozenset()
        if ordered:
            return RoundOrder(self.reqs, iter(range(len(self.reqs))))
        # A queue entry time Python compares unlike a double: the reference's sort.
        rnd = Round(cfg, deferred, processed_tokens, now, running)
        return RoundOrder(self.reqs, self.order(base.variant(cfg), rnd))

    def _compat_kind(self, base: Policy) -> int | None:
        """``compat_round``'s order for ``base``'s compat round (1: spf's sort, 2: dfs-weight's
        tree order), or None where it does not apply (the reference round runs)."""
        cfg = self.config
        native = isinstance(self.cache, NativeRadixCache) and core() is not None
        if not (cfg.sglang_compat and base.cache_aware and self.matches and native):
            return None
        # A subclass's match_node (or touch_at, which admission would call for it from the
        # matcher's memo): the reference round, each hook called as there.
        if not (self.native_nodes and self.native_touch):
            return None
        pol = base.variant(cfg)
        if pol.key is spf_sglang and not cfg.enable_priority_scheduling:
            return COMPAT_SPF
        return COMPAT_DFS if pol.order is dfs_weight_sglang else None

    def match_all(self, rnd: Round, node_matching: bool, tree: bool) -> list[int]:
        """The reference's ``match_all``; over the native tree its node matching (SGLang compat:
        lpm's and hrrn's rounds) in one native call (the same walks, fields and ends as its
        loop). The read-only matching is the reference's: no built-in policy's accelerated
        queue reaches it (fair's compat round is its accelerated round)."""
        cache = self.cache
        if not (node_matching and self.native_nodes):
            return super().match_all(rnd, node_matching, tree)
        assert isinstance(cache, NativeRadixCache)
        device, ends = cache.match_nodes(self.reqs, tree)
        if ends is not None:
            rnd.tree_order = lambda: cache.dfs_weight_order_at(ends)
        return device

    def dedup(self, device: list[int], rnd: Round, *, bounded: bool = False) -> frozenset[str]:
        """The reference's dedup; under SGLang compat (a group's first member represents it)
        in one native call (``compat_dedup``: it reads the requests only, not the cache)."""
        cfg, native = self.config, core()
        check = cfg.in_batch_prefix_check_threshold
        if not (cfg.sglang_compat and native is not None and check >= 0):
            return super().dedup(device, rnd, bounded=bounded)
        threshold = cfg.in_batch_prefix_deprioritize_threshold
        return frozenset(native.compat_dedup(self.reqs, device, check, threshold))

    def _dedup(self, rnd: Round) -> tuple[frozenset[str], list[Req]]:
        """The reference's dedup where the native one is off (the starvation bound picks
        representatives by the clock)."""
        if self.config.in_batch_prefix_check_threshold < 0:
            return frozenset(), []  # off
        device = [self._device_match_len(r) for r in self.reqs]
        return super().dedup(device, rnd, bounded=self.policy.bounded(self.config)), []

    def order(self, pol: Policy, rnd: Round) -> Iterator[int]:
        """The reference's order with SGLang's plain rounds (the compat rounds) cheaper: fcfs
        without priorities sorts by an empty key (the stable sort moves nothing: the list
        stands); lof's stable sort by ``-max_new_tokens`` is the stable descending sort by
        ``max_new_tokens`` (``reverse`` keeps ties in their order), natively (``sort_lof``:
        the sorted head kept, the arrivals merged behind it) or keyed in C; random's
        ``rng.shuffle`` runs natively from and back to the generator's state. The plain random
        order's positions come from the native ``LazyShuffle``: the reference generator's
        swaps and draws, made on the generator's own state as each position is read."""
        reqs, priorities = self.reqs, self.config.enable_priority_scheduling
        if pol.key is fcfs_sglang and not priorities:
            return iter(range(len(reqs)))
        if pol.key is lof_sglang and not priorities:
            if self._sort_lof is None or not self._sort_lof(reqs, SamplingParams):
                reqs.sort(key=_MAX_NEW, reverse=True)
            return iter(range(len(reqs)))
        rng = self.rng  # Python's own generator (a subclass of it may draw otherwise)
        if pol.order is random_sglang and type(rng) is Random:
            if self._shuffle_in_place is not None:  # on the generator's own state
                self._shuffle_in_place(reqs, rng)
            elif self._shuffle is not None:
                version, state, gauss = rng.getstate()
                rng.setstate((version, self._shuffle(reqs, state), gauss))
            else:
                return super().order(pol, rnd)
            return iter(range(len(reqs)))
        if pol.order is _RANDOM_ORDER and self._lazy_shuffle is not None and type(rng) is Random:
            positions: Iterator[int] = self._lazy_shuffle(reqs, rng)
            return positions
        return super().order(pol, rnd)

    def _order(self, pol: Policy, reads: Reads, rnd: Round, flipped: list[Req]) -> Iterator[int]:
        rnd.rng, rnd.fair = self.rng, self.fair
        engine = self.engine
        if engine is None:
            positions = self._reference_order(pol, rnd)
        elif self.synced and self._in_sync(engine):
            changed = {id(r): r for r in flipped}
            changed.update(self.moved)
            for r in self.added:
                changed.pop(id(r), None)
            positions = engine.advance(list(changed.values()), self.added, rnd, self.reqs)
        else:
            positions = engine.rebuild(self.reqs, rnd)
        self.synced = engine is not None and engine.keeps_sync
        self.added, self.moved = [], {}
        return positions

    def _in_sync(self, engine: Engine) -> bool:
        """Whether the list is the engine's members followed by the arrivals (identity compares,
        in one native pass)."""
        in_sync: bool = self._core.in_sync(self.reqs, engine.members(), self.added)
        return in_sync

    def _reference_order(self, pol: Policy, rnd: Round | None) -> Iterator[int]:
        if self._fcfs:  # _plain_fcfs()
            if not self.entry_ordered:
                keys = list(map(_ENTRY, self.reqs))  # C-level passes, no key tuples built
                if not all(map(operator.le, keys, keys[1:])):
                    self.reqs.sort(key=_ENTRY)
                self.entry_ordered = True
                self._last_entry = _ENTRY(self.reqs[-1]) if self.reqs else self._last_entry
            return iter(range(len(self.reqs)))
        assert rnd is not None  # (only plain fcfs's round builds none)
        return self.order(pol, rnd)
