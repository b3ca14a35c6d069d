"""Waiting-queue schedule policies: which waiting request the prefill adder tries first.

``SchedulePolicy.calc_priority`` runs once per prefill round. It matches every waiting request
against the prefix cache, runs the in-batch prefix dedup, sorts the queue **in place** (stable:
ties keep the order the previous round left) and returns a ``PriorityResult``. Policies live in
the ``POLICIES`` registry (the CLI's choices come from it):

====================== =========== =========================================================
name                   kind        order (first = tried first)
====================== =========== =========================================================
fcfs                   agnostic    arrival; with priority scheduling (priority, arrival)
lof                    agnostic    longest ``max_new_tokens`` first (priority first if on)
random                 agnostic    shuffle seeded by ``config.seed`` (radixsched: drawn lazily)
routing-key            agnostic    routing keys frequent in the running batch first
lpm                    cache-aware longest matched prefix first (optional starvation bound)
dfs-weight             cache-aware depth-first over the cache tree, heaviest subtree first
hrrn                   cache-aware highest response ratio waited/uncached, aged in tokens
shortest-prefill-first cache-aware least uncached work (prompt + output - match) first
fair                   tenant      virtual token counter across tenants, longest match
                                   first within a tenant
====================== =========== =========================================================

Incremental orders (radixsched; ``queue_order.py``): every radixsched order is a stable sort of
the waiting list by a per-request key, so the order is kept across rounds and each round only
re-places the requests whose key changed: new arrivals, requests re-matched because their cache
subtree changed, requests whose dedup status flipped. The scheduler reports arrivals and
departures through ``on_enqueue`` / ``on_dequeue`` (and ``forget``); a round checks (identity
compares) that the list it is handed is exactly what those hooks described and otherwise
recomputes everything from the list as it stands, so callers without hooks get the same answer.
hrrn re-orders every round (its ratio moves with the clock) in numpy; fair interleaves tenants
every round; compat mode, plain fcfs and lpm's starvation bound sort the whole list as before.

Lazy rounds (radixsched): the scheduler reads the queue front to back and stops after a few
requests, so random and hrrn hand their order out as it is read (``calc_priority(lazy=True)``,
``PriorityResult.lazy``, ``queue_order.LazyOrder``): random draws one position at a time (a
front-to-back Fisher-Yates), hrrn selects its head with a partition and sorts only that. The
order read is exactly the eager one; the list itself is left as it stands.

Matching (what ``calc_priority`` writes on each ``Req``):

- Every policy records ``num_matched_prefix_tokens = min(match, max_prefix_len)`` for every
  waiting request whenever the cache can share prefixes: it is the load snapshot a data-parallel
  router reads, and the sort key of the cache-aware policies.
- The default matcher is the cache's read-only ``match_len`` (no node split, no recency bump, no
  index array). The adder re-matches at admission anyway, so a ``last_node`` computed here would
  be stale work. Only ``dfs-weight`` needs nodes; it (and every cache-aware policy under
  ``compat="sglang"``, which reproduces SGLang's side effects) uses ``match_prefix`` and then also
  sets ``prefix_len``, ``last_node`` and ``host_hit_len``.
- Because ``match_len`` does not refresh recency, the waiting-prefix touch (spec 1.10: every 32
  eligible rounds, touch ``reversed(queue[:128])`` under LRU eviction) runs whenever this
  round's matching did not refresh recency itself. Under ``compat="sglang"`` that is exactly
  SGLang's rule (cache-agnostic policies only).

In-batch prefix dedup (cache-aware policies, spec 1.5): among requests whose cache match is at
most ``in_batch_prefix_check_threshold`` tokens, those sharing their first
``in_batch_prefix_deprioritize_threshold`` tokens (same namespace) form a group; one
representative per group is scheduled normally, the others are *deprioritized* (sorted last).
Sharing "at least T leading tokens with some earlier candidate" is equality of the T-token
prefix, so a dict keyed on that prefix gives exactly the answer of SGLang's temporary page-1
radix tree, without building one. radixsched picks the representative that is overdue (lpm
starvation bound), then cheapest (least uncached work), then oldest, and the others are
``deferred``: the scheduler must not admit them this round, so the shared prefix is computed
once and the duplicates hit it next round. The cheapest member is the one most likely to fit,
so a group is never blocked behind a member that cannot be admitted while a cheaper one could.
``dfs-weight`` uses the dedup too (duplicates move to the back of the DFS order and are
deferred): requests with tiny matches all end at the root, where DFS order gives them no
locality. Under ``compat="sglang"`` the first candidate in list order represents its group,
nothing is deferred, and ``dfs-weight`` ignores the set.

Fair policy (virtual token counter, Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024). Each tenant (``Req.tenant_key``) has a counter of service received:
``FAIR_PREFILL_WEIGHT`` x prefill tokens actually computed (cache hits are free) plus
``FAIR_DECODE_WEIGHT`` x decode tokens, charged by the scheduler through ``on_service`` after
each step. Each round, tenants take turns in order of least counter; a tenant's turn admits its
next request (longest cached prefix first, then arrival, for cache affinity) and raises its
*projected* counter by that request's uncached prefill, so one round's order already
interleaves tenants the way VTC's one-request-at-a-time selection would. A tenant that becomes
active (has waiting or running requests) after being idle has its counter lifted to the least
counter of the tenants that stayed active (or the last such floor when none did): idle time
banks no credit, and a returning tenant cannot monopolise the engine. Guarantee (the paper's
analysis, which carries over because a tenant is only chosen while its counter is the least):
for any two tenants that stay backlogged over an interval, the difference in weighted service
they receive in it is bounded by a constant, ``2 * (FAIR_PREFILL_WEIGHT * L_in +
FAIR_DECODE_WEIGHT * M)`` with ``L_in`` the longest prompt and ``M`` the most tokens the running
batch can hold, independent of the interval's length and of how much either tenant sends. Here
counters are charged once per step rather than per admission, which adds at most one prefill
batch (``max_prefill_tokens``) to that bound.

Deviations from SGLang 0.5.23 (``config.compat == "sglang"`` restores each):

- no 128-request cap for lpm/hrrn unless ``max_prefix_match_queue`` is set; above the cap the
  fallback sorts by arrival (SGLang leaves the last cache-aware order, spec 8.23);
- every remaining tie breaks by arrival (queue entry time, then arrival time, then list order;
  hrrn: then rid, a total order its lazy rounds rely on); SGLang breaks hrrn ties by rid alone
  and orders non-matching routing keys by key string; fcfs sorts
  by queue entry time, so a retracted request whose seniority the scheduler kept regains its
  place (SGLang: fcfs is "current list order");
- hrrn's uncached work counts output tokens like spf (SGLang: prompt only, so a long replay can
  reach "no work, drain immediately");
- in-batch dedup is binding and cost-aware (above);
- spf's chunk limit does not reserve room for deferred requests (they cannot be admitted);
- cache-aware scoring is read-only (``match_len``) except for dfs-weight (above).

Validation is identical in both modes: unknown names (including SGLang's dead ``priority``
choice) raise ``ValueError`` listing the valid names; a cache-aware policy without prefix
caching falls back to fcfs with a WARNING (SGLang: silently); spf without prefix caching raises
``ValueError`` saying so; priority scheduling requires fcfs or lof.
"""

from __future__ import annotations

import heapq
import logging
import math
import operator
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from radixsched.cache.base import BasePrefixCache, CacheKey, Namespace
from radixsched.cache.radix import RadixCache
from radixsched.config import SchedulerConfig
from radixsched.queue_index import DedupIndex, MatchIndex
from radixsched.queue_order import (
    AdmissionWatch,
    DfsWeightEngine,
    FairEngine,
    HrrnEngine,
    Key,
    KeyedEngine,
    KeyFn,
    LazyOrder,
    LazyShuffle,
    OrderEngine,
    QueueLog,
    RoundInputs,
    RoutingKeyEngine,
)
from radixsched.request import Req

logger = logging.getLogger(__name__)

# SGLang's hard-coded lpm/hrrn cap (compat only; radixsched: config.max_prefix_match_queue).
SGLANG_PREFIX_MATCH_CAP = 128
# Waiting-prefix touch: every this many eligible rounds, over the first SPAN queued requests.
WAITING_PREFIX_REFRESH_INTERVAL = 32
WAITING_PREFIX_REFRESH_SPAN = 128
# spf logs the queue head's work on calls 1, 1 + N, 1 + 2N, ...
SPF_LOG_INTERVAL = 128
# Fair policy weights: a decode token costs twice a prefill token (memory-bound step).
FAIR_PREFILL_WEIGHT = 1.0
FAIR_DECODE_WEIGHT = 2.0

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

INF = math.inf


# ``Req.tenant_key`` as a C-level getter (mapped over whole queues and batches).
_TENANT_KEY: Callable[[Req], str] = operator.attrgetter("tenant_key")


class MatchMode(Enum):
    """How a round matches waiting requests against the cache."""

    NONE = "none"  # the cache cannot share prefixes: every match is 0, nothing is called
    LENGTH = "length"  # match_len: read-only, lengths only
    NODE = "node"  # match_prefix: last_node too; refreshes recency and may split a node
    # Cache-agnostic policies: no per-round matching (SGLang never runs its pre-match either).
    # The load snapshot keeps the matched length the scheduler records at queue entry.
    SKIP = "skip"


class PriorityResult(NamedTuple):
    """What one ``calc_priority`` round decided (the queue itself is sorted in place, except
    under ``lazy``)."""

    active_policy: str  # the policy that ordered this round (after fallbacks)
    deprioritized: frozenset[str]  # rids moved to the back by the in-batch dedup
    deferred: frozenset[str]  # rids the scheduler must not admit this round (compat: empty)
    prefix_matched: bool  # num_matched_prefix_tokens is an exact cache match this round
    # ``calc_priority(lazy=True)`` on radixsched random and hrrn: the queue is not sorted;
    # the caller reads the round's order through it (queue_order.LazyOrder).
    lazy: LazyOrder | None = None


@dataclass
class SortContext:
    """Everything a policy's sort function may read in one round."""

    config: SchedulerConfig
    tree_cache: BasePrefixCache
    deprioritized: frozenset[str]
    processed_tokens: int
    now: float
    running_batch: Sequence[Req] | None
    rng: random.Random
    fair: VirtualTokenCounter
    is_overdue: Callable[[Req], bool]
    # The caller guarantees the queue is already in (queue entry, arrival) order.
    entry_ordered: bool = False

    @property
    def compat(self) -> bool:
        return self.config.sglang_compat


SortFn = Callable[[list[Req], SortContext], None]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    sort: SortFn
    help: str
    cache_aware: bool = False  # orders on cache matches; falls back to fcfs without a cache
    requires_cache: bool = False  # no fallback: construction fails without a cache
    needs_last_node: bool = False  # match with match_prefix even in radixsched mode
    capped: bool = False  # subject to the lpm/hrrn queue-length fallback
    dedup: bool = False  # uses the in-batch dedup in radixsched mode
    compat_dedup: bool = False  # uses it under compat="sglang"
    supports_priority: bool = False  # allowed with --enable-priority-scheduling


# ---- per-request quantities ---------------------------------------------------------------


def _arrival(r: Req) -> tuple[float, float]:
    return (r.queue_entry_time, r.arrival_time)


_ARRIVAL = operator.attrgetter("queue_entry_time", "arrival_time")
_MATCHED = operator.attrgetter("num_matched_prefix_tokens")
_LAST_NODE = operator.attrgetter("last_node")


def dedup_rep_key(r: Req) -> tuple[int, float, float, str]:
    """Which request of an in-batch dedup group represents it (radixsched): least uncached
    work, then oldest, then request id (a total order, so the choice never depends on where
    the requests stand in the queue)."""
    work = len(r.prompt_ids) + len(r.output_ids) - r.num_matched_prefix_tokens
    return (work if work > 1 else 1, r.queue_entry_time, r.arrival_time, r.rid)


def prefill_work(r: Req) -> int:
    """Uncached tokens a (re)prefill of ``r`` computes, at least 1 (spec 1.8)."""
    return max(1, r.fill_len - r.num_matched_prefix_tokens)


def _hrrn_uncached(r: Req, compat: bool) -> int:
    if compat:  # SGLang counts the prompt only (spec 1.7)
        return max(0, r.prompt_len - r.num_matched_prefix_tokens)
    return max(0, r.fill_len - r.num_matched_prefix_tokens)


def _priority_term(r: Req, config: SchedulerConfig) -> tuple[int, int]:
    """Priority sort term: explicit priorities by ``priority_sign``, then requests without one.

    A missing priority takes ``default_priority_value`` when set, else it is the least
    important (spec 1.12); ``req.priority`` itself is never modified.
    """
    p = r.priority if r.priority is not None else config.default_priority_value
    if p is None:
        return (1, 0)
    return (0, p * config.priority_sign)


def validate_priority(req: Req, config: SchedulerConfig) -> str | None:
    """Why the scheduler must reject ``req`` at the door for its priority, or None if it may enter."""
    p = req.priority
    if p is None:
        return None
    if not INT64_MIN <= p <= INT64_MAX:
        return f"priority {p} is outside the signed 64-bit range"
    if not config.enable_priority_scheduling and config.abort_on_priority_when_disabled:
        return (
            "this server does not schedule by priority (--enable-priority-scheduling is off); "
            "send the request again without a priority"
        )
    return None


# ---- sort functions (one per policy) --------------------------------------------------------


def _sort_fcfs(queue: list[Req], ctx: SortContext) -> None:
    cfg = ctx.config
    if cfg.enable_priority_scheduling:
        if ctx.compat:
            queue.sort(key=lambda r: (_priority_term(r, cfg), r.queue_entry_time))
        else:
            queue.sort(key=lambda r: (_priority_term(r, cfg), r.queue_entry_time, r.arrival_time))
    elif not ctx.compat and not ctx.entry_ordered:
        _sort_by_arrival(queue)
    # compat without priority: "current list order", no sort (spec 1.6)


def _sort_by_arrival(queue: list[Req]) -> None:
    """Sort by (queue entry, arrival). The scheduler appends in entry order and re-inserts
    retracted requests at their place, so the queue is nearly always sorted already: check
    that first (C-level passes over plain floats, no key tuples)."""
    keys = list(map(_ARRIVAL, queue))
    if all(map(operator.le, keys, keys[1:])):
        return  # already in order (a stable sort would change nothing)
    queue.sort(key=_ARRIVAL)


def _sort_arrival(queue: list[Req], ctx: SortContext) -> None:
    """The fallback of a capped policy above the cap (radixsched; compat leaves the order)."""
    if not ctx.compat:
        _sort_by_arrival(queue)


def _sort_lof(queue: list[Req], ctx: SortContext) -> None:
    cfg = ctx.config
    if cfg.enable_priority_scheduling:
        if ctx.compat:
            queue.sort(key=lambda r: (_priority_term(r, cfg), -r.max_new_tokens))
        else:
            queue.sort(key=lambda r: (_priority_term(r, cfg), -r.max_new_tokens, *_arrival(r)))
    elif ctx.compat:
        queue.sort(key=lambda r: -r.max_new_tokens)
    else:
        queue.sort(key=lambda r: (-r.max_new_tokens, *_arrival(r)))


def _sort_random(queue: list[Req], ctx: SortContext) -> None:
    """compat: SGLang's ``random.shuffle`` (back to front). radixsched: ``LazyShuffle`` drawn
    to the end, from the policy's own generator seeded by ``config.seed``; the scheduler draws
    only the positions it reads (``calc_priority(lazy=True)``), the same first positions."""
    if ctx.compat:
        ctx.rng.shuffle(queue)
    else:
        LazyShuffle(ctx.rng, queue).draw(len(queue))


def _sort_routing_key(queue: list[Req], ctx: SortContext) -> None:
    if ctx.running_batch is None:
        return
    counts = Counter(r.routing_key for r in ctx.running_batch if r.routing_key)
    if not counts:
        return
    if ctx.compat:

        def compat_key(r: Req) -> tuple[int, int, str]:
            k = r.routing_key
            if k and k in counts:
                return (0, -counts[k], k)
            return (1, 0, k or "")

        queue.sort(key=compat_key)
        return

    def key(r: Req) -> tuple[int, int, str, float, float]:
        k = r.routing_key
        if k and k in counts:
            return (0, -counts[k], k, r.queue_entry_time, r.arrival_time)
        return (1, 0, "", r.queue_entry_time, r.arrival_time)

    queue.sort(key=key)


def _sort_lpm(queue: list[Req], ctx: SortContext) -> None:
    overdue = ctx.is_overdue
    late: list[Req] = []
    if overdue is not _never:
        # The starvation bound: overdue requests go first, in arrival order.
        late = [r for r in queue if overdue(r)]
        if late:
            late_ids = {id(r) for r in late}
            queue[:] = [r for r in queue if id(r) not in late_ids]
            late.sort(key=_ARRIVAL)
    dep = ctx.deprioritized
    if ctx.compat:
        if dep:
            queue.sort(key=lambda r: INF if r.rid in dep else -r.num_matched_prefix_tokens)
        else:
            queue.sort(key=_MATCHED, reverse=True)  # reverse keeps ties stable
    else:
        # Layered stable sorts (C-level keys): (deprioritized, -matched, arrival).
        queue.sort(key=_ARRIVAL)
        queue.sort(key=_MATCHED, reverse=True)
        if dep:
            queue.sort(key=lambda r: r.rid in dep)
    if late:
        queue[:0] = late


def _sort_hrrn(queue: list[Req], ctx: SortContext) -> None:
    dep = ctx.deprioritized
    now_tokens = ctx.processed_tokens
    compat = ctx.compat

    def ratio_term(r: Req) -> float:
        """Minus the response ratio waited/uncached (lower sorts first)."""
        if dep and r.rid in dep:
            return INF
        uncached = _hrrn_uncached(r, compat)
        if uncached <= 0:
            return -INF  # no prefill work left: drain immediately
        waited = now_tokens - r.queue_entry_processed_tokens
        return -(waited / uncached) if waited > 0 else 0.0

    if compat:
        queue.sort(key=lambda r: (ratio_term(r), r.rid))
    else:
        # A total order: (ratio, queue entry, arrival, rid); deprioritized ones tie at +inf.
        queue.sort(key=lambda r: (ratio_term(r), r.queue_entry_time, r.arrival_time, r.rid))


def _sort_spf(queue: list[Req], ctx: SortContext) -> None:
    dep = ctx.deprioritized
    if ctx.compat:
        queue.sort(key=lambda r: (r.rid in dep, prefill_work(r), r.queue_entry_time))
        return
    # Layered stable sorts: (deprioritized, work, arrival).
    queue.sort(key=_ARRIVAL)
    queue.sort(key=prefill_work)
    if dep:
        queue.sort(key=lambda r: r.rid in dep)


def _sort_dfs_weight(queue: list[Req], ctx: SortContext) -> None:
    n = len(queue)
    if n == 0:
        return
    order = ctx.tree_cache.dfs_weight_order([r.last_node for r in queue])
    seen = bytearray(n)
    perm: list[int] = []
    for i in order:
        if 0 <= i < n and not seen[i]:
            seen[i] = 1
            perm.append(i)
    # A node no longer reachable from the root is never emitted: keep such requests (at the
    # end, in list order) rather than drop them from the queue.
    if len(perm) < n:
        perm.extend(i for i in range(n) if not seen[i])
    reordered = [queue[i] for i in perm]
    dep = ctx.deprioritized
    if dep and not ctx.compat:
        reordered.sort(key=lambda r: r.rid in dep)
    queue[:] = reordered


def _sort_fair(queue: list[Req], ctx: SortContext) -> None:
    queue[:] = ctx.fair.order(queue)


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec(
            "fcfs",
            _sort_fcfs,
            "first come, first served (by priority first with --enable-priority-scheduling)",
            supports_priority=True,
        ),
        PolicySpec("lof", _sort_lof, "longest max_new_tokens first", supports_priority=True),
        PolicySpec("random", _sort_random, "random order (seeded by --seed)"),
        PolicySpec(
            "routing-key", _sort_routing_key, "routing keys frequent in the running batch first"
        ),
        PolicySpec(
            "lpm",
            _sort_lpm,
            "longest cached prefix first (starvation bound: --lpm-max-wait-s/-tokens)",
            cache_aware=True,
            capped=True,
            dedup=True,
            compat_dedup=True,
        ),
        PolicySpec(
            "dfs-weight",
            _sort_dfs_weight,
            "depth-first over the cache tree, heaviest subtree first",
            cache_aware=True,
            needs_last_node=True,
            dedup=True,
        ),
        PolicySpec(
            "hrrn",
            _sort_hrrn,
            "highest response ratio next (waited prefill tokens / uncached tokens)",
            cache_aware=True,
            capped=True,
            dedup=True,
            compat_dedup=True,
        ),
        PolicySpec(
            "shortest-prefill-first",
            _sort_spf,
            "least uncached prefill work first",
            cache_aware=True,
            requires_cache=True,
            dedup=True,
            compat_dedup=True,
        ),
        PolicySpec(
            "fair",
            _sort_fair,
            "tenant fairness by virtual token counter, longest match first within a tenant",
        ),
    )
}

# The fallback order of a capped policy above its queue-length cap.
_FCFS_FALLBACK = PolicySpec("fcfs", _sort_arrival, "fallback: arrival order")


# ---- fair policy state ------------------------------------------------------------------------


@dataclass
class VirtualTokenCounter:
    """Per-tenant weighted service counters (VTC); see the module docstring."""

    prefill_weight: float = FAIR_PREFILL_WEIGHT
    decode_weight: float = FAIR_DECODE_WEIGHT
    counters: dict[str, float] = field(default_factory=dict)
    _active: frozenset[str] = frozenset()
    _floor: float = 0.0

    def charge(self, tenant: str, prefill_tokens: int, decode_tokens: int) -> None:
        self.counters[tenant] = (
            self.counters.get(tenant, 0.0)
            + self.prefill_weight * prefill_tokens
            + self.decode_weight * decode_tokens
        )

    def charge_decode(self, reqs: Sequence[Req], decode_tokens: int) -> None:
        """``charge(r.tenant_key, 0, decode_tokens)`` for every request of ``reqs``: the same
        float additions, in the same order per tenant (tenants are independent), grouped."""
        pre = self.prefill_weight * 0
        dec = self.decode_weight * decode_tokens
        counters = self.counters
        for tenant, n in Counter(map(_TENANT_KEY, reqs)).items():
            c = counters.get(tenant, 0.0)
            for _ in range(n):
                c = c + pre + dec  # charge's expression, term for term
            counters[tenant] = c

    def observe_active(self, tenants: frozenset[str]) -> None:
        """Lift tenants that just became active to the least counter of those that stayed."""
        newly = tenants - self._active
        if newly:
            stayed = tenants & self._active
            base = min(self.counters[t] for t in stayed) if stayed else self._floor
            for t in newly:
                self.counters[t] = max(self.counters.get(t, 0.0), base)
        self._active = tenants
        if tenants:
            self._floor = min(self.counters[t] for t in tenants)

    def order(self, queue: list[Req]) -> list[Req]:
        """Interleave tenants by least projected counter; longest match first within one."""
        by_tenant: dict[str, list[Req]] = {}
        for r in queue:
            by_tenant.setdefault(r.tenant_key, []).append(r)
        for reqs in by_tenant.values():
            # Layered stable sorts (C-level keys): longest match first, then arrival.
            reqs.sort(key=_ARRIVAL)
            reqs.sort(key=_MATCHED, reverse=True)
        return self.merge(by_tenant)

    def merge(self, by_tenant: dict[str, list[Req]]) -> list[Req]:
        """Interleave per-tenant lists (each already in its within-tenant order). The dict's
        order (tenants by first appearance in the queue) breaks the remaining ties. With one
        tenant, its own list is returned."""
        if len(by_tenant) == 1:
            return next(iter(by_tenant.values()))  # one tenant: nothing to interleave
        heap: list[tuple[float, float, float, int, str]] = []
        for seq, (tenant, reqs) in enumerate(by_tenant.items()):
            head = reqs[0]
            c = self.counters.get(tenant, 0.0)
            heap.append((c, head.queue_entry_time, head.arrival_time, seq, tenant))
        heapq.heapify(heap)
        pos = dict.fromkeys(by_tenant, 0)
        out: list[Req] = []
        while heap:
            c, _, _, seq, tenant = heapq.heappop(heap)
            reqs = by_tenant[tenant]
            i = pos[tenant]
            r = reqs[i]
            out.append(r)
            i += 1
            pos[tenant] = i
            if i < len(reqs):
                nxt = reqs[i]
                c += self.prefill_weight * prefill_work(r)
                heapq.heappush(heap, (c, nxt.queue_entry_time, nxt.arrival_time, seq, tenant))
        return out


# ---- incremental-order keys (radixsched; see queue_order.py) --------------------------------


def _lpm_key(r: Req, rnd: RoundInputs) -> Key:
    return (
        r.rid in rnd.deprioritized,
        -r.num_matched_prefix_tokens,
        r.queue_entry_time,
        r.arrival_time,
    )


def _spf_key(r: Req, rnd: RoundInputs) -> Key:
    return (r.rid in rnd.deprioritized, prefill_work(r), r.queue_entry_time, r.arrival_time)


def _lof_key(config: SchedulerConfig) -> KeyFn:
    if config.enable_priority_scheduling:
        return lambda r, _: (
            *_priority_term(r, config),
            -r.max_new_tokens,
            r.queue_entry_time,
            r.arrival_time,
        )
    return lambda r, _: (-r.max_new_tokens, r.queue_entry_time, r.arrival_time)


def _fcfs_priority_key(config: SchedulerConfig) -> KeyFn:
    return lambda r, _: (*_priority_term(r, config), r.queue_entry_time, r.arrival_time)


# ---- the policy object ------------------------------------------------------------------------


def _unknown_policy_message(name: str) -> str:
    valid = ", ".join(sorted(POLICIES))
    msg = f"unknown schedule policy {name!r}; valid policies: {valid}"
    if name == "priority":
        msg += " (priority is not a policy: use --enable-priority-scheduling with fcfs or lof)"
    return msg


class SchedulePolicy:
    """Orders the waiting queue each round; see the module docstring for every policy."""

    def __init__(self, config: SchedulerConfig, tree_cache: BasePrefixCache) -> None:
        name = config.schedule_policy
        spec = POLICIES.get(name)
        if spec is None:
            raise ValueError(_unknown_policy_message(name))
        if config.enable_priority_scheduling and not spec.supports_priority:
            valid = ", ".join(n for n, s in POLICIES.items() if s.supports_priority)
            raise ValueError(
                f"--enable-priority-scheduling requires schedule policy {valid}; got {name!r}"
            )
        self.cache_enabled = not tree_cache.disabled and tree_cache.supports_prefix_sharing()
        if not self.cache_enabled:
            if spec.requires_cache:
                raise ValueError(
                    f"schedule policy {name!r} requires prefix caching, but the radix cache is "
                    "disabled"
                )
            if spec.cache_aware:
                logger.warning(
                    "schedule policy %r needs prefix caching, which is disabled; using 'fcfs'",
                    name,
                )
                spec = POLICIES["fcfs"]
        self.config = config
        self.tree_cache = tree_cache
        self.requested_policy_name = name
        self.spec = spec
        self.priority_sign = config.priority_sign
        self.active_policy_name = spec.name
        self.rng = random.Random(config.seed)
        self.fair = VirtualTokenCounter()
        self._spf_calls = 0
        self._refresh_calls = 0
        self._last_deferred: frozenset[str] = frozenset()
        # radixsched: matches and dedup groups are maintained incrementally across rounds
        # (queue_index.py); compat re-matches everything every round, as SGLang does.
        incremental = (
            not config.sglang_compat and self.cache_enabled and tree_cache.supports_match_memo
        )
        self._match_index = (
            MatchIndex(tree_cache, need_node=spec.needs_last_node) if incremental else None
        )
        bounded = config.lpm_max_wait_s is not None or config.lpm_max_wait_tokens is not None
        self._dedup_index = (
            DedupIndex(
                config.in_batch_prefix_check_threshold,
                max(config.in_batch_prefix_deprioritize_threshold, 0),
                dedup_rep_key,
            )
            if incremental and config.in_batch_prefix_check_threshold >= 0 and not bounded
            else None
        )
        if config.sglang_compat:
            cap = config.max_prefix_match_queue
            self._cap: int | None = SGLANG_PREFIX_MATCH_CAP if cap is None else cap
        else:
            self._cap = config.max_prefix_match_queue
        # radixsched: the order itself is kept across rounds too, fed by the scheduler's hooks
        # (on_enqueue / on_dequeue / forget); a round costs O(changed requests).
        self._spec_mode = self._match_mode(spec)  # static: config, cache and spec decide it
        self._spec_matches = self._spec_mode in (MatchMode.LENGTH, MatchMode.NODE)
        self._log = QueueLog()
        self._engine = self._make_engine(bounded)
        self._watch: AdmissionWatch | None = None
        if self._engine is not None and self._match_index is not None:
            if self.spec.needs_last_node:
                self._watch = AdmissionWatch(_LAST_NODE, tree_cache.page_size)
            elif tree_cache.page_size > 1:
                # On page-1 caches the admission's capped matched length equals the policy's
                # (both are min(match, fill_len - 1)): nothing to watch.
                self._watch = AdmissionWatch(_MATCHED, tree_cache.page_size)
        # Whether the order breaks ties by the waiting list's own order, so that where a
        # re-queued request goes changes later rounds. radixsched hrrn (ties by request id) and
        # random (uniform whatever the list) are total orders of their own: the scheduler
        # appends re-queued requests there, which keeps the incremental order in sync.
        self.uses_list_order = config.sglang_compat or spec.name not in ("hrrn", "random")
        # Whether an engine round touches waiting prefixes (its match mode is fixed).
        self._engine_touches = (
            self._spec_mode is not MatchMode.NONE
            and config.enable_waiting_prefix_refresh
            and config.radix_eviction_policy.lower() == "lru"
        )

    def _make_engine(self, bounded: bool) -> OrderEngine | None:
        """The policy's incremental order, or None where every round sorts the whole list
        (compat mode, plain fcfs, random, the lpm starvation bound, caches without memo)."""
        cfg = self.config
        if cfg.sglang_compat:
            return None
        name = self.spec.name
        if name == "lof":
            return KeyedEngine(_lof_key(cfg))
        if name == "fcfs":
            return KeyedEngine(_fcfs_priority_key(cfg)) if cfg.enable_priority_scheduling else None
        if name == "routing-key":
            return RoutingKeyEngine()
        if self._match_index is None:
            return None
        if name == "dfs-weight":
            if not isinstance(self.tree_cache, RadixCache) or not self._dedup_ready():
                return None
            return DfsWeightEngine(self.tree_cache)
        # With a host tier the admission match adds host hits to the matched length of every
        # request it tries, so any waiting request's sort input may change behind the policy's
        # back: those configurations sort the whole list each round, as before.
        if getattr(self.tree_cache, "on_evict", None) is not None:
            return None
        if name == "fair":
            return FairEngine(self.fair.merge)
        if not self._dedup_ready():
            return None
        if name == "lpm":
            return None if bounded else KeyedEngine(_lpm_key)
        if name == "shortest-prefill-first":
            return KeyedEngine(_spf_key)
        if name == "hrrn":
            return HrrnEngine()
        return None

    def _dedup_ready(self) -> bool:
        return self._dedup_index is not None or self.config.in_batch_prefix_check_threshold < 0

    # ---- introspection ---------------------------------------------------------------------
    @property
    def policy_name(self) -> str:
        """The configured policy after the no-cache fallback."""
        return self.spec.name

    @property
    def is_cache_aware(self) -> bool:
        return self.spec.cache_aware

    @property
    def prefix_match_cap(self) -> int | None:
        """Queue length above which lpm/hrrn fall back to arrival order (None = never)."""
        return self._cap

    def active_spec(self, queue_len: int) -> PolicySpec:
        """The policy that orders a queue of this length (spec 1.4: strictly greater)."""
        if self.spec.capped and self._cap is not None and queue_len > self._cap:
            return _FCFS_FALLBACK
        return self.spec

    # ---- the round ---------------------------------------------------------------------------
    def calc_priority(
        self,
        waiting_queue: list[Req],
        running_batch: Sequence[Req] | None = None,
        processed_tokens: int = 0,
        now: float = 0.0,
        *,
        entry_ordered: bool = False,
        lazy: bool = False,
    ) -> PriorityResult:
        """Match, dedup and sort ``waiting_queue`` in place (stable); see the module docstring.
        ``entry_ordered``: the caller guarantees the queue is in (queue entry, arrival) order,
        so fcfs has nothing to sort. ``lazy``: the caller reads the queue front to back through
        ``PriorityResult.lazy`` when it is set, so radixsched random and hrrn order only what
        is read."""
        spec = self.active_spec(len(waiting_queue))
        self.active_policy_name = spec.name
        if self._engine is not None:
            if spec is self.spec and self._engine_ready():
                return self._engine_round(
                    self._engine, waiting_queue, running_batch, processed_tokens, lazy
                )
            self._log.desync()  # e.g. the capped fallback orders this round
        compat = self.config.sglang_compat

        mode = self._match_mode(spec)
        is_overdue = self._overdue_fn(processed_tokens, now)
        dedup_on = (spec.compat_dedup if compat else spec.dedup) and mode in (
            MatchMode.LENGTH,
            MatchMode.NODE,
        )
        deprioritized: frozenset[str] = frozenset()
        deferred: frozenset[str] = frozenset()
        if mode in (MatchMode.LENGTH, MatchMode.NODE) and self._match_index is not None:
            # Incremental: only requests whose match may have changed are touched.
            changed, gone = self._match_index.refresh(waiting_queue)
            if dedup_on and self._dedup_index is not None and is_overdue is _never:
                deprioritized = self._dedup_index.update(changed, gone)
            elif dedup_on:
                lens = [r.match_memo[2] if r.match_memo else 0 for r in waiting_queue]
                deprioritized = self._in_batch_dedup(waiting_queue, lens, is_overdue)
            deferred = deprioritized
        else:
            device_lens = self._match_all(waiting_queue, mode)
            if dedup_on:
                deprioritized = self._in_batch_dedup(waiting_queue, device_lens, is_overdue)
                if not compat:
                    deferred = deprioritized

        if spec.name == "fair":
            self._observe_round_tenants(waiting_queue, running_batch)

        ctx = SortContext(
            config=self.config,
            tree_cache=self.tree_cache,
            deprioritized=deprioritized,
            processed_tokens=processed_tokens,
            now=now,
            running_batch=running_batch,
            rng=self.rng,
            fair=self.fair,
            is_overdue=is_overdue,
            entry_ordered=entry_ordered,
        )
        shuffle: LazyOrder | None = None
        if lazy and spec.name == "random" and not compat:
            shuffle = LazyShuffle(self.rng, waiting_queue)
        else:
            spec.sort(waiting_queue, ctx)

        if spec.name == "shortest-prefill-first":
            self._log_spf(waiting_queue)

        self._touch_waiting_prefixes(waiting_queue, mode, shuffle)
        self._last_deferred = deferred
        return PriorityResult(
            active_policy=spec.name,
            deprioritized=deprioritized,
            deferred=deferred,
            prefix_matched=mode in (MatchMode.LENGTH, MatchMode.NODE),
            lazy=shuffle,
        )

    def skip_round(
        self, waiting_queue: list[Req], running_batch: Sequence[Req] | None = None
    ) -> bool:
        """Account for a round whose order nobody reads (the batch is already full, so nothing
        can be admitted) without computing it, where that leaves every later round exactly as
        computing it would: radixsched orders are functions of the requests' current keys
        (ties by arrival); length matching is read-only (not so node matching, which refreshes
        recency); random only under the lazy draw (a round that reads no request draws
        nothing: the caller must use ``calc_priority(lazy=True)``); fair makes the round's
        tenant observation (``running_batch`` is the running batch, as for ``calc_priority``),
        the one part of its round with a lasting effect; and this round's waiting-prefix
        refresh is not due (the refresh counter advances as the round would have advanced it).
        Returns False, having done nothing, otherwise: the caller runs ``calc_priority``."""
        if self.config.sglang_compat:
            return False
        spec = self.active_spec(len(waiting_queue))
        if self._match_mode(spec) not in (
            MatchMode.LENGTH,
            MatchMode.SKIP,
        ):
            return False
        cfg = self.config
        if (
            waiting_queue
            and cfg.enable_waiting_prefix_refresh
            and cfg.radix_eviction_policy.lower() == "lru"
        ):
            if self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0:
                return False
            self._refresh_calls += 1
        if spec.name == "fair":
            self._observe_round_tenants(waiting_queue, running_batch)
        self.active_policy_name = spec.name
        return True

    def _observe_round_tenants(self, queue: list[Req], running_batch: Sequence[Req] | None) -> None:
        """The tenant observation a fair round makes (of the queue as it stands, whatever the
        hooks say), without the rest of the round."""
        engine = self._engine
        if engine is not None and self.spec.name == "fair" and self._engine_ready():
            log = self._log
            synced = log.matches(queue, engine.members())
            self._observe_tenants(engine, queue, log.added if synced else [], running_batch, synced)
            return
        tenants = set(map(_TENANT_KEY, queue))
        if running_batch is not None:
            tenants.update(map(_TENANT_KEY, running_batch))
        self.fair.observe_active(frozenset(tenants))

    def _engine_ready(self) -> bool:
        """The indexes the engine's rounds rely on are in place (callers may swap them out)."""
        if not self._spec_matches:
            return True
        if self._match_index is None:
            return False
        return not self.spec.dedup or self._dedup_ready()

    def _engine_round(
        self,
        engine: OrderEngine,
        queue: list[Req],
        running_batch: Sequence[Req] | None,
        processed_tokens: int,
        lazy: bool = False,
    ) -> PriorityResult:
        """One radixsched round through the policy's incremental order. When ``queue`` is
        exactly what the hooks described, only the requests that changed are re-matched,
        re-grouped and re-placed; otherwise everything is recomputed from ``queue`` as it
        stands. Either way the result is the full sort's."""
        spec = self.spec
        log = self._log
        synced = log.matches(queue, engine.members())
        mode = self._spec_mode
        matching = self._spec_matches
        arrivals = log.added if synced else []  # settle() starts new lists
        changed: list[Req] = []
        gone: list[Req] = []
        if synced:
            dirty = [r for r in log.dirty if engine.holds(r)] if log.dirty else []
            if matching:
                assert self._match_index is not None
                changed = self._match_index.apply(
                    arrivals + dirty if dirty else arrivals, log.removed
                )
                gone = log.removed
            else:
                changed = dirty
        elif matching:
            assert self._match_index is not None
            changed, gone = self._match_index.refresh(queue)
        if mode is MatchMode.NONE:
            self._match_all(queue, mode)
        deprioritized: frozenset[str] = frozenset()
        flipped: list[Req] = []
        if spec.dedup and matching and self._dedup_index is not None:
            deprioritized = self._dedup_index.update(changed, gone)
            flipped = self._dedup_index.flipped
        if spec.name == "fair":
            self._observe_tenants(engine, queue, arrivals, running_batch, synced)
        rnd = RoundInputs(deprioritized, processed_tokens, running_batch)
        watch = self._watch
        if synced:
            rekeyed = self._rekeyed(engine, changed, flipped, arrivals)
            engine.advance(rekeyed, arrivals, rnd, queue)
            if watch is not None:
                for r in rekeyed:
                    watch.note(r)
                for r in arrivals:
                    watch.note(r)
        else:
            engine.rebuild(queue, rnd)
            if watch is not None:
                watch.note_all(queue)
        order = engine.conclude(queue, lazy)
        if engine.keeps_sync:
            log.settle()
        else:
            log.desync()
        if spec.name == "shortest-prefill-first":
            self._log_spf(queue)
        if self._engine_touches and queue:  # _touch_waiting_prefixes's test, precomputed
            self._touch_round(queue, order)
        self._last_deferred = deprioritized
        return PriorityResult(
            active_policy=spec.name,
            deprioritized=deprioritized,
            deferred=deprioritized,
            prefix_matched=matching,
            lazy=order,
        )

    def _rekeyed(
        self, engine: OrderEngine, changed: list[Req], flipped: list[Req], arrivals: list[Req]
    ) -> list[Req]:
        """Members to re-key this round, each once: re-matched, dedup status flipped, or a
        watched field rewritten behind the policy's back. Arrivals are placed, not re-keyed."""
        stale = self._watch.stale() if self._watch is not None else []
        if not (stale or changed or flipped):
            return []
        moved = {id(r): r for r in stale}
        moved.update((id(r), r) for r in changed)
        moved.update((id(r), r) for r in flipped if engine.holds(r))
        for r in arrivals:
            moved.pop(id(r), None)
        return list(moved.values())

    def _observe_tenants(
        self,
        engine: OrderEngine,
        queue: list[Req],
        arrivals: list[Req],
        running_batch: Sequence[Req] | None,
        synced: bool,
    ) -> None:
        if synced and isinstance(engine, FairEngine):
            tenants = engine.tenants(arrivals)
        else:
            tenants = set(map(_TENANT_KEY, queue))
        if running_batch is not None:
            tenants.update(map(_TENANT_KEY, running_batch))
        self.fair.observe_active(frozenset(tenants))

    def _log_spf(self, queue: list[Req]) -> None:
        self._spf_calls += 1
        if self._spf_calls % SPF_LOG_INTERVAL == 1 and queue:
            logger.debug(
                "shortest-prefill-first: %d waiting, head needs %d uncached tokens",
                len(queue),
                prefill_work(queue[0]),
            )

    def on_enqueue(self, req: Req) -> None:
        """The scheduler appended or re-inserted ``req`` into its waiting queue."""
        if self._log.synced:
            self._log.added.append(req)

    def on_dequeue(self, req: Req) -> None:
        """``req`` left the scheduler's waiting queue (admitted, aborted or displaced)."""
        log = self._log
        if not log.synced:
            return
        assert self._engine is not None  # only an engine round settles the log
        if self._engine.remove(req):
            log.removed.append(req)
            if self._watch is not None:
                self._watch.drop(req)
        elif not log.drop_added(req):
            log.desync()  # not a request the hooks put there: recompute next round

    def forget(self, req: Req) -> None:
        """``req`` re-enters the queue with new output (retraction, preemption): its cached
        match is stale."""
        req.match_memo = None
        if self._match_index is not None:
            self._match_index.forget(req)
        log = self._log
        if log.synced and self._engine is not None and self._engine.holds(req):
            log.dirty.append(req)

    @property
    def tracks_service(self) -> bool:
        """Whether ``on_service`` does anything (callers skip it in hot loops otherwise)."""
        return self.spec.name == "fair"

    def on_service(self, req: Req, prefill_tokens: int, decode_tokens: int) -> None:
        """Charge ``req``'s tenant for one step's service (fair policy; no-op otherwise)."""
        if self.spec.name == "fair":
            self.fair.charge(req.tenant_key, prefill_tokens, decode_tokens)

    def on_decode_service(self, reqs: Sequence[Req], decode_tokens: int) -> None:
        """``on_service(r, 0, decode_tokens)`` for every request of a decode batch."""
        if self.spec.name == "fair":
            self.fair.charge_decode(reqs, decode_tokens)

    def shortest_prefill_chunk_limit(
        self, chunked_req: Req, waiting_queue: Sequence[Req], budget: int, page_size: int
    ) -> int | None:
        """Cap on the in-flight chunked request's next chunk so shorter requests fit (spec 1.9).

        None means no cap. In radixsched mode the walk also stops at the first request deferred
        by this round's dedup: it cannot be admitted, so reserving room for it would be waste.
        """
        if self.spec.name != "shortest-prefill-first" or budget < 2 * page_size:
            return None
        remaining = chunked_req.fill_len - chunked_req.prefix_len
        deferred = self._last_deferred
        reserved = 0
        for r in waiting_queue:
            if r.rid in deferred:
                break
            work = prefill_work(r)
            charge = -(-work // page_size) * page_size
            if work >= remaining or reserved + charge > budget - page_size:
                break
            reserved += charge
        if reserved == 0:
            return None
        return (budget - reserved) // page_size * page_size

    # ---- steps -------------------------------------------------------------------------------
    def _match_mode(self, spec: PolicySpec) -> MatchMode:
        if not self.cache_enabled:
            return MatchMode.NONE
        if not spec.cache_aware and spec.name != "fair":  # fair keeps affinity within a turn
            return MatchMode.SKIP
        if spec.needs_last_node or (spec.cache_aware and self.config.sglang_compat):
            return MatchMode.NODE
        return MatchMode.LENGTH

    def _match_all(self, queue: list[Req], mode: MatchMode) -> list[int]:
        """Set each request's match fields; return the uncapped device match lengths."""
        if mode is MatchMode.NONE:
            for r in queue:
                r.num_matched_prefix_tokens = 0
            return [0] * len(queue)
        if mode is MatchMode.SKIP:
            return []  # cache-agnostic policies never de-duplicate
        lens: list[int] = []
        append = lens.append
        if mode is MatchMode.LENGTH:
            cache = self.tree_cache
            match_len = cache.match_len
            memo_ok = cache.supports_match_memo
            table, base = cache.epoch_table()
            table_get = table.get
            for r in queue:
                # Hot loop (once per waiting request per round). A request's match can only
                # change when its top-level subtree changed: the memo skips the walk otherwise.
                out_len = len(r.output_ids)
                memo = r.match_memo
                epoch = -1
                if memo_ok:
                    sk = r.subtree_key
                    if sk is None:
                        sk = r.subtree_key = cache.subtree_key(CacheKey(r.prompt_ids, r.namespace))
                    if sk is not None:  # None: prompt shorter than a page
                        epoch = base + table_get(sk, 0)
                        if memo is not None and memo[0] == epoch and memo[1] == out_len:
                            n = memo[2]
                            cap = len(r.prompt_ids) + out_len - 1
                            r.num_matched_prefix_tokens = n if n < cap else cap
                            append(n)
                            continue
                fill = r.fill_ids() if out_len else r.prompt_ids
                ek, salt = r.extra_key, r.cache_salt
                n = match_len(CacheKey(fill, None if ek is None and salt is None else (ek, salt)))
                if epoch >= 0:
                    r.match_memo = (epoch, out_len, n)
                cap = len(fill) - 1
                r.num_matched_prefix_tokens = n if n < cap else cap
                append(n)
            return lens
        match_node = self.tree_cache.match_node
        for r in queue:
            fill = r.fill_ids()
            res = match_node(CacheKey(fill, r.namespace))
            r.prefix_len = res.device_len
            r.last_node = res.last_node
            r.host_hit_len = res.host_len
            cap = r.max_prefix_len(len(fill))
            total = res.device_len + res.host_len
            r.num_matched_prefix_tokens = total if total < cap else cap
            append(res.device_len)
        return lens

    def _overdue_fn(self, processed_tokens: int, now: float) -> Callable[[Req], bool]:
        """The lpm starvation bound as a predicate (always False when unset or not lpm)."""
        cfg = self.config
        max_s, max_tok = cfg.lpm_max_wait_s, cfg.lpm_max_wait_tokens
        if self.spec.name != "lpm" or (max_s is None and max_tok is None):
            return _never

        def overdue(r: Req) -> bool:
            if max_s is not None and now - r.queue_entry_time > max_s:
                return True
            return (
                max_tok is not None and processed_tokens - r.queue_entry_processed_tokens > max_tok
            )

        return overdue

    def _in_batch_dedup(
        self, queue: list[Req], device_lens: list[int], is_overdue: Callable[[Req], bool]
    ) -> frozenset[str]:
        """Rids of requests whose shared uncached prefix another queued request represents."""
        cfg = self.config
        check = cfg.in_batch_prefix_check_threshold
        if check < 0:
            return frozenset()
        threshold = cfg.in_batch_prefix_deprioritize_threshold
        compat = cfg.sglang_compat
        candidates = [r for r, n in zip(queue, device_lens, strict=True) if n <= check]
        if not candidates:
            return frozenset()
        if compat and threshold <= 0:
            # SGLang: a match of >= 0 tokens always holds, and nothing is ever inserted.
            return frozenset(r.rid for r in candidates)
        width = max(threshold, 0)
        # Group candidates by their first `width` tokens (in their namespace): requests in one
        # group share >= `width` leading tokens. Keys are cached per request (prompts never
        # change; a prompt shorter than `width` is keyed on prompt + output each round).
        groups: dict[tuple[Namespace, bytes], list[Req]] = {}
        for r in candidates:
            if len(r.prompt_ids) >= width:
                cached = r.dedup_key
                if cached is None or cached[0] != width:
                    cached = (width, (r.namespace, r.prompt_ids[:width].tobytes()))
                    r.dedup_key = cached
                key = cached[1]
            elif r.fill_len >= width:
                key = (r.namespace, r.fill_ids()[:width].tobytes())
            else:
                continue  # shares fewer than `threshold` tokens with anything
            group = groups.get(key)
            if group is None:
                groups[key] = [r]
            else:
                group.append(r)
        dup: set[str] = set()
        for group in groups.values():
            if len(group) < 2:
                continue
            if compat:
                rep = group[0]  # first in list order
            elif is_overdue is _never:
                # Least uncached work (prefill_work, inlined: hot), then oldest; queue position
                # breaks the remaining ties (min keeps the first of equals).
                rep = min(group, key=dedup_rep_key)
            else:
                # Overdue first, then as above.
                rep = min(group, key=lambda r: (not is_overdue(r), *dedup_rep_key(r)))
            dup.update(r.rid for r in group if r is not rep)
        return frozenset(dup)

    def _touch_waiting_prefixes(
        self, queue: list[Req], mode: MatchMode, lazy: LazyOrder | None = None
    ) -> None:
        """Keep queued prefixes warm under LRU when this round's matching did not (spec 1.10).
        The head touched is this round's order (a lazy round orders it first)."""
        cfg = self.config
        incremental_node = mode is MatchMode.NODE and self._match_index is not None
        if (
            (mode not in (MatchMode.LENGTH, MatchMode.SKIP) and not incremental_node)
            or not queue
            or not cfg.enable_waiting_prefix_refresh
            or cfg.radix_eviction_policy.lower() != "lru"
        ):
            return
        self._touch_round(queue, lazy)

    def _touch_round(self, queue: list[Req], lazy: LazyOrder | None = None) -> None:
        """One eligible round of the waiting-prefix touch: every INTERVAL-th touches the head."""
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if not refresh:
            return
        span = WAITING_PREFIX_REFRESH_SPAN
        head = queue[:span] if lazy is None else lazy.head(span)
        # Head last: it gets the newest access time, so it is evicted last.
        self.tree_cache.touch_request_prefixes(reversed(head))


def _never(r: Req) -> bool:
    return False


def policy_names() -> list[str]:
    """Valid ``--schedule-policy`` values (registry order)."""
    return list(POLICIES)
