"""Waiting-queue policies: which waiting request the prefill adder tries first.

A policy is one registered function, of one of two kinds:

- a **key** ``key(req, rnd) -> tuple``: the waiting list is stably sorted by it, in place, so
  requests with equal keys keep the order the previous round left (every radixsched key ends
  with the queue entry and arrival times, so such ties are rare);
- an **order** ``order(queue, rnd) -> Iterator[int]``: reorders ``queue`` in place into the
  round's order and returns the positions admission tries, in turn. The positions may be
  produced lazily, as admission reads them (random draws only what is read); everything else
  an order does (reordering, counters) happens before it returns.

``req`` is read through ``RequestView`` and the round through ``Round``; a policy declares
in ``reads`` everything of the round it reads, which tells the queue what to compute for it
(``MATCH``: every waiting request is matched against the cache first) and the accelerators
(``radixsched.native``) what can change its order between rounds. The SGLang 0.5.23 variant of
a policy is registered beside it (``sglang=``) and used under ``--compat sglang``.

====================== ==== ========================================================
name                   kind order (first = tried first)
====================== ==== ========================================================
fcfs                   key  queue entry, arrival (with priority scheduling: priority first)
lof                    key  longest ``max_new_tokens`` first
random                 ord  uniform (seeded): a front-to-back Fisher-Yates drawn as read
routing-key            ord  routing keys frequent in the running batch first
lpm                    key  longest cached prefix first (optional starvation bound)
dfs-weight             ord  depth-first over the cache tree, heaviest subtree first
hrrn                   key  highest response ratio (prefill tokens waited / uncached tokens)
shortest-prefill-first key  least uncached work first
fair                   ord  tenants by least virtual token counter, longest match within one
====================== ==== ========================================================

Fair (virtual token counter; Sheng et al., "Fairness in Serving Large Language Models", OSDI
2024): a tenant's counter grows by ``FAIR_PREFILL_WEIGHT`` per prefill token computed and
``FAIR_DECODE_WEIGHT`` per decode token. Each round tenants take turns by least counter,
projected forward by each turn's uncached prefill; a tenant that becomes active is lifted to
the least counter of those that stayed active, so idle time banks no credit. For two tenants
that stay backlogged, their weighted service differs by at most a constant.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import logging
import math
import operator
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixsched.config import SchedulerConfig

logger = logging.getLogger(__name__)

INF = math.inf
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
FAIR_PREFILL_WEIGHT = 1.0
FAIR_DECODE_WEIGHT = 2.0
# SGLang's hard-coded lpm/hrrn queue cap (compat only; radixsched: --max-prefix-match-queue).
SGLANG_PREFIX_MATCH_CAP = 128


class Reads(enum.Flag):
    """What of a round a policy reads (besides the request's own fixed fields)."""

    NONE = 0
    MATCH = enum.auto()  # req.num_matched_prefix_tokens, refreshed for every request each round
    DEDUP = enum.auto()  # rnd.deferred: the in-batch prefix dedup's verdict
    CLOCK = enum.auto()  # rnd.processed_tokens / rnd.now: moves every round for everyone
    RUNNING_KEYS = enum.auto()  # rnd.running_keys(): routing-key counts of the running batch
    TENANTS = enum.auto()  # rnd.fair, rnd.running: tenant counters (the scheduler charges them)
    TREE = enum.auto()  # rnd.tree_order: the cache tree's DFS over the requests' match ends
    RANDOM = enum.auto()  # rnd.rng


class RequestView(Protocol):
    """The fields of a waiting request a policy may read (``Req`` is one)."""

    @property
    def rid(self) -> str: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def fill_len(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def tenant_key(self) -> str: ...
    @property
    def queue_entry_time(self) -> float: ...
    @property
    def queue_entry_processed_tokens(self) -> int: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def num_matched_prefix_tokens(self) -> int: ...


@dataclass
class Round:
    """Everything a policy may read in one round besides the requests (see ``Reads``)."""

    config: SchedulerConfig
    deferred: frozenset[str] = frozenset()
    processed_tokens: int = 0
    now: float = 0.0
    running: Sequence[Any] = ()
    fair: VirtualTokenCounter | None = None
    rng: random.Random | None = None
    # TREE: the DFS order of the queue's positions over the cache tree (built by the queue).
    tree_order: Callable[[], list[int]] | None = None

    def running_keys(self) -> Counter[str]:
        """Routing-key counts of the running batch."""
        return Counter(filter(None, map(operator.attrgetter("routing_key"), self.running)))

    def overdue(self, r: RequestView) -> bool:
        """lpm's starvation bound (``--lpm-max-wait-s`` / ``--lpm-max-wait-tokens``)."""
        cfg = self.config
        if cfg.lpm_max_wait_s is not None and self.now - r.queue_entry_time > cfg.lpm_max_wait_s:
            return True
        waited = self.processed_tokens - r.queue_entry_processed_tokens
        return cfg.lpm_max_wait_tokens is not None and waited > cfg.lpm_max_wait_tokens


Key = tuple[Any, ...]
KeyFn = Callable[[Any, Round], Key]
OrderFn = Callable[[list[Any], Round], Iterator[int]]
ChunkLimitFn = Callable[[Any, Sequence[Any], int, int, frozenset[str]], "int | None"]


@dataclass(frozen=True)
class Policy:
    name: str
    help: str
    reads: Reads = Reads.NONE
    key: KeyFn | None = None
    order: OrderFn | None = None
    sglang: Policy | None = None  # the SGLang 0.5.23 variant (--compat sglang)
    cache_aware: bool = False  # falls back to fcfs (with a warning) without prefix caching
    requires_cache: bool = False  # refuses to run without prefix caching
    capped: bool = False  # falls back to fcfs above --max-prefix-match-queue waiting requests
    supports_priority: bool = False  # allowed with --enable-priority-scheduling
    # The in-flight chunk is capped so shorter waiting requests fit (spf); the round
    # is ordered before the continuation is planned, and no second request starts chunking.
    chunk_limit: ChunkLimitFn | None = None
    # ``--lpm-max-wait-s`` / ``--lpm-max-wait-tokens`` apply: overdue requests go first, and
    # the dedup picks overdue representatives first (the bound reads the clock).
    starvation_bound: bool = False
    # The order does not depend on the list's order (a total order, or uniform): re-queued
    # requests simply go to the back.
    list_order_free: bool = False

    @property
    def charges_service(self) -> bool:
        """Whether the scheduler must charge tenants for each step's service (``rnd.fair``)."""
        return Reads.TENANTS in self.reads

    def variant(self, config: SchedulerConfig) -> Policy:
        return self.sglang if config.sglang_compat and self.sglang is not None else self

    def bounded(self, config: SchedulerConfig) -> bool:
        """Whether the starvation bound is on for this policy."""
        limits = (config.lpm_max_wait_s, config.lpm_max_wait_tokens)
        return self.starvation_bound and limits != (None, None)

    def reads_for(self, config: SchedulerConfig) -> Reads:
        reads = self.variant(config).reads
        return reads | Reads.CLOCK if self.bounded(config) else reads


ENTRY_POINT_GROUP = "radixsched.policies"


class PolicyRegistry(Mapping[str, Policy]):
    """The policies by name. Other packages' policies come from the ``radixsched.policies``
    entry points (importing each entry point's object registers them), loaded on the first
    look-up of a name that is not built in or the first listing: an installed package's
    policy is a name ``simulate``, ``sweep`` and ``serve`` accept, and a run of built-in
    policies never scans the installed packages."""

    def __init__(self) -> None:
        self.by_name: dict[str, Policy] = {}  # what is registered so far (no plugin scan)
        self._loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            load_plugins()

    def __getitem__(self, name: str) -> Policy:
        if name not in self.by_name:
            self._load()
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(self.by_name)

    def __len__(self) -> int:
        self._load()
        return len(self.by_name)


def load_plugins() -> list[str]:
    """Import every ``radixsched.policies`` entry point; return the errors (one line each:
    a broken plugin is reported, and the built-in policies stay usable)."""
    from importlib.metadata import entry_points

    errors = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # a third party's import error must not break the registry
            errors.append(f"policy plugin {ep.name!r} ({ep.value}): {type(e).__name__}: {e}")
            logger.warning("%s", errors[-1])
    return errors


POLICIES: PolicyRegistry = PolicyRegistry()
FCFS = "fcfs"  # what capped policies above the cap, and cache-aware ones without a cache, use
LPM = "lpm"


def register(policy: Policy) -> Policy:
    """Add a policy to the registry (names are unique; the CLI's choices come from here)."""
    if policy.name in POLICIES.by_name:
        raise ValueError(f"schedule policy {policy.name!r} is already registered")
    if (policy.key is None) == (policy.order is None):
        raise ValueError(f"policy {policy.name!r} needs exactly one of key= and order=")
    if policy.name != policy.name.strip() or not policy.name or "," in policy.name:
        raise ValueError(f"policy name {policy.name!r} must be non-empty, without commas")
    POLICIES.by_name[policy.name] = policy
    return policy


def policy(name: str, help: str, *, reads: Reads = Reads.NONE, kind: str = "key", **kw: Any) -> Any:
    """Decorator registering ``fn`` as policy ``name``: ``kind="key"`` for a sort key
    ``fn(req, rnd) -> tuple`` (the queue is stably sorted by it), ``kind="order"`` for
    ``fn(queue, rnd) -> Iterator[int]``. ``reads`` declares what of the round ``fn`` reads
    (``Reads``); the other keywords are ``Policy`` fields. A key reading at most ``MATCH`` and
    ``DEDUP`` is kept incrementally by the accelerated queue with no more work."""

    def wrap(fn: Any) -> Policy:
        return register(Policy(name, help, reads, **{kind: fn}, **kw))

    return wrap


def sglang_variant(base: str, reads: Reads = Reads.NONE, kind: str = "key") -> Any:
    """Decorator attaching ``fn`` as the SGLang 0.5.23 variant of policy ``base``."""

    def wrap(fn: Any) -> Any:
        variant = Policy(fn.__name__, "", reads, **{kind: fn})
        POLICIES.by_name[base] = dataclasses.replace(POLICIES.by_name[base], sglang=variant)
        return fn

    return wrap


def get_policy(name: str) -> Policy:
    p = POLICIES.get(name)
    if p is None:
        valid = ", ".join(sorted(POLICIES))
        msg = f"unknown schedule policy {name!r}; valid policies: {valid}"
        if name == "priority":
            msg += " (priority is not a policy: use --enable-priority-scheduling with fcfs or lof)"
        raise ValueError(msg)
    return p


def policy_names() -> list[str]:
    return list(POLICIES)


# ---- shared quantities -------------------------------------------------------------------------


def prefill_work(r: RequestView) -> int:
    """Uncached tokens a (re)prefill of ``r`` computes, at least 1."""
    return max(1, r.fill_len - r.num_matched_prefix_tokens)


def priority_term(r: RequestView, config: SchedulerConfig) -> tuple[int, int]:
    """Priority sort term: explicit priorities by ``priority_sign``, then requests without
    one (``default_priority_value`` when set); ``req.priority`` is never modified."""
    p = r.priority if r.priority is not None else config.default_priority_value
    return (1, 0) if p is None else (0, p * config.priority_sign)


def prio_value(r: Any, sign: int) -> int:
    """A request's priority, None as the least important extreme."""
    return int(r.priority) if r.priority is not None else (INT64_MAX if sign > 0 else INT64_MIN)


def dedup_rep_key(r: RequestView) -> tuple[int, float, float, str]:
    """Which request of an in-batch dedup group represents it (radixsched): least uncached
    work, then oldest, then request id (a total order)."""
    return (prefill_work(r), r.queue_entry_time, r.arrival_time, r.rid)


def validate_priority(priority: int | None, config: SchedulerConfig) -> str | None:
    """Why a request with this priority is rejected at the door, or None."""
    if priority is None:
        return None
    if not INT64_MIN <= priority <= INT64_MAX:
        return f"priority {priority} is outside the signed 64-bit range"
    if not config.enable_priority_scheduling and config.abort_on_priority_when_disabled:
        return (
            "this server does not schedule by priority (--enable-priority-scheduling is off); "
            "send the request again without a priority"
        )
    return None


# ---- the policies --------------------------------------------------------------------------------


@policy(
    FCFS,
    "first come, first served (priority first with --enable-priority-scheduling)",
    supports_priority=True,
)
def fcfs(r: RequestView, rnd: Round) -> Key:
    return (r.queue_entry_time, r.arrival_time)


@sglang_variant(FCFS)
def fcfs_sglang(r: RequestView, rnd: Round) -> Key:
    # SGLang keeps the current list order, and sorts by entry time only under priorities.
    return (r.queue_entry_time,) if rnd.config.enable_priority_scheduling else ()


@policy("lof", "longest max_new_tokens first", supports_priority=True)
def lof(r: RequestView, rnd: Round) -> Key:
    return (-r.max_new_tokens, r.queue_entry_time, r.arrival_time)


@sglang_variant("lof")
def lof_sglang(r: RequestView, rnd: Round) -> Key:
    return (-r.max_new_tokens,)


@policy(
    "random",
    "random order (seeded by --seed)",
    reads=Reads.RANDOM,
    kind="order",
    list_order_free=True,
)
def random_order(queue: list[Any], rnd: Round) -> Iterator[int]:
    """Front-to-back Fisher-Yates in place: position i takes a uniform pick of [i, n). The
    first k positions read are a uniform k-sequence, drawn with k - 1 draws at most."""
    assert rnd.rng is not None
    n = len(queue)
    for i in range(n):
        if i < n - 1:
            j = i + rnd.rng.randrange(n - i)
            if j != i:
                queue[i], queue[j] = queue[j], queue[i]
        yield i


@sglang_variant("random", Reads.RANDOM, kind="order")
def random_sglang(queue: list[Any], rnd: Round) -> Iterator[int]:
    assert rnd.rng is not None
    rnd.rng.shuffle(queue)  # the whole list, every round
    return iter(range(len(queue)))


@policy(
    "routing-key",
    "routing keys frequent in the running batch first",
    reads=Reads.RUNNING_KEYS,
    kind="order",
)
def routing_key(queue: list[Any], rnd: Round) -> Iterator[int]:
    counts = rnd.running_keys()
    if counts:  # without a running key the list keeps its order

        def key(r: RequestView) -> Key:
            k = r.routing_key
            if k and k in counts:
                return (0, -counts[k], k, r.queue_entry_time, r.arrival_time)
            return (1, 0, "", r.queue_entry_time, r.arrival_time)

        queue.sort(key=key)
    return iter(range(len(queue)))


@sglang_variant("routing-key", Reads.RUNNING_KEYS, kind="order")
def routing_key_sglang(queue: list[Any], rnd: Round) -> Iterator[int]:
    counts = rnd.running_keys()
    if counts:

        def key(r: RequestView) -> Key:
            k = r.routing_key
            return (0, -counts[k], k) if k and k in counts else (1, 0, k or "")

        queue.sort(key=key)
    return iter(range(len(queue)))


@policy(
    LPM,
    "longest cached prefix first (starvation bound: --lpm-max-wait-s/-tokens)",
    reads=Reads.MATCH | Reads.DEDUP,
    cache_aware=True,
    capped=True,
    starvation_bound=True,
)
def lpm(r: RequestView, rnd: Round) -> Key:
    if rnd.overdue(r):  # the starvation bound: overdue requests first, by arrival
        return (0, r.queue_entry_time, r.arrival_time)
    deferred = r.rid in rnd.deferred
    return (1, deferred, -r.num_matched_prefix_tokens, r.queue_entry_time, r.arrival_time)


@sglang_variant(LPM, Reads.MATCH | Reads.DEDUP)
def lpm_sglang(r: RequestView, rnd: Round) -> Key:
    if rnd.overdue(r):
        return (0, r.queue_entry_time, r.arrival_time)
    return (1, INF if r.rid in rnd.deferred else -r.num_matched_prefix_tokens)


@policy(
    "dfs-weight",
    "depth-first over the cache tree, heaviest subtree first",
    reads=Reads.MATCH | Reads.DEDUP | Reads.TREE,
    kind="order",
    cache_aware=True,
)
def dfs_weight(queue: list[Any], rnd: Round) -> Iterator[int]:
    assert rnd.tree_order is not None
    order = rnd.tree_order()
    dep = rnd.deferred
    if dep:  # duplicates of the dedup go last (stably): their prefix is computed once
        order.sort(key=lambda i: queue[i].rid in dep)
    queue[:] = [queue[i] for i in order]
    return iter(range(len(queue)))


@sglang_variant("dfs-weight", Reads.MATCH | Reads.TREE, kind="order")
def dfs_weight_sglang(queue: list[Any], rnd: Round) -> Iterator[int]:
    assert rnd.tree_order is not None
    queue[:] = [queue[i] for i in rnd.tree_order()]
    return iter(range(len(queue)))


def _hrrn_ratio(r: RequestView, rnd: Round, uncached: int) -> float:
    """Minus the response ratio waited / uncached (lower sorts first)."""
    if r.rid in rnd.deferred:
        return INF
    if uncached <= 0:
        return -INF  # no prefill work left: drain immediately
    waited = rnd.processed_tokens - r.queue_entry_processed_tokens
    return -(waited / uncached) if waited > 0 else 0.0


@policy(
    "hrrn",
    "highest response ratio next (waited prefill tokens / uncached tokens)",
    reads=Reads.MATCH | Reads.DEDUP | Reads.CLOCK,
    cache_aware=True,
    capped=True,
    list_order_free=True,
)
def hrrn(r: RequestView, rnd: Round) -> Key:
    ratio = _hrrn_ratio(r, rnd, r.fill_len - r.num_matched_prefix_tokens)
    return (ratio, r.queue_entry_time, r.arrival_time, r.rid)


@sglang_variant("hrrn", Reads.MATCH | Reads.DEDUP | Reads.CLOCK)
def hrrn_sglang(r: RequestView, rnd: Round) -> Key:
    # SGLang counts the prompt only as uncached work and ties by request id.
    return (_hrrn_ratio(r, rnd, r.prompt_len - r.num_matched_prefix_tokens), r.rid)


def spf_chunk_limit(
    chunked: Any, queue: Sequence[Any], budget: int, page: int, deferred: frozenset[str]
) -> int | None:
    """Cap on the in-flight chunk so the shorter requests at the head of the sorted queue fit
    this round; None = no cap. The walk stops at a request the dedup defers (it
    cannot be admitted: reserving room for it would be waste)."""
    if budget < 2 * page:
        return None
    remaining = chunked.fill_len - chunked.prefix_len
    reserved = 0
    for r in queue:
        if r.rid in deferred:
            break
        work = prefill_work(r)
        charge = -(-work // page) * page
        if work >= remaining or reserved + charge > budget - page:
            break
        reserved += charge
    return None if reserved == 0 else (budget - reserved) // page * page


@policy(
    "shortest-prefill-first",
    "least uncached prefill work first",
    reads=Reads.MATCH | Reads.DEDUP,
    cache_aware=True,
    requires_cache=True,
    chunk_limit=spf_chunk_limit,
)
def shortest_prefill_first(r: RequestView, rnd: Round) -> Key:
    return (r.rid in rnd.deferred, prefill_work(r), r.queue_entry_time, r.arrival_time)


@sglang_variant("shortest-prefill-first", Reads.MATCH | Reads.DEDUP)
def spf_sglang(r: RequestView, rnd: Round) -> Key:
    return (r.rid in rnd.deferred, prefill_work(r), r.queue_entry_time)


@policy(
    "fair",
    "tenant fairness by virtual token counter, longest match first within a tenant",
    reads=Reads.MATCH | Reads.TENANTS,
    kind="order",
)
def fair(queue: list[Any], rnd: Round) -> Iterator[int]:
    assert rnd.fair is not None
    tenants = {r.tenant_key for r in queue} | {r.tenant_key for r in rnd.running}
    rnd.fair.observe_active(frozenset(tenants))
    by_tenant: dict[str, list[Any]] = {}
    for r in queue:
        by_tenant.setdefault(r.tenant_key, []).append(r)
    for reqs in by_tenant.values():
        reqs.sort(key=lambda r: (-r.num_matched_prefix_tokens, r.queue_entry_time, r.arrival_time))
    queue[:] = rnd.fair.merge(by_tenant)
    return iter(range(len(queue)))


# ---- fair policy state ---------------------------------------------------------------------------


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

    def merge(self, by_tenant: dict[str, list[Any]]) -> list[Any]:
        """Interleave per-tenant lists (each in its own order) by least projected counter;
        ties by the head's entry and arrival, then by the tenants' order in ``by_tenant``."""
        if len(by_tenant) == 1:
            return next(iter(by_tenant.values()))
        heap: list[tuple[float, float, float, int, str]] = []
        for seq, (tenant, reqs) in enumerate(by_tenant.items()):
            c = self.counters.get(tenant, 0.0)
            heap.append((c, reqs[0].queue_entry_time, reqs[0].arrival_time, seq, tenant))
        heapq.heapify(heap)
        pos = dict.fromkeys(by_tenant, 0)
        out: list[Any] = []
        while heap:
            c, _, _, seq, tenant = heapq.heappop(heap)
            reqs = by_tenant[tenant]
            i = pos[tenant]
            out.append(reqs[i])
            pos[tenant] = i + 1
            if i + 1 < len(reqs):
                nxt = reqs[i + 1]
                c += self.prefill_weight * prefill_work(reqs[i])
                heapq.heappush(heap, (c, nxt.queue_entry_time, nxt.arrival_time, seq, tenant))
        return out
