"""Routers: which data-parallel replica receives an arriving request.

A router sees the request and a load snapshot of every replica (``ReplicaLoad``) and returns
the chosen replica's id. Routers never look inside a replica's cache: the cache-aware router
keeps its own approximate record of what it sent where.

Load (``ReplicaLoad.load``) is ``waiting_uncached_tokens + running_decode_tokens``: the prefill
tokens still to compute for queued requests (each request's ``fill_len`` minus its matched
prefix) plus the decode tokens running requests may still generate. Both are token counts of
outstanding work, so the sum ranks replicas by backlog; it deliberately ignores that decode
tokens of one batch run in parallel (a replica with many short decodes looks busier than its
step time suggests).

Registry: ``ROUTERS`` maps the ``--router`` names to classes; ``create_router(name, seed=...,
**options)`` builds one. ``DEFAULT_ROUTER`` (cache-aware) is the default when dp > 1.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from radixsched.cluster.pagehash import namespace_seed, page_hashes
from radixsched.request import Req


class ReplicaLoad(NamedTuple):
    """What a router knows about one replica at routing time."""

    replica_id: int
    # Sum over waiting requests of fill_len - num_matched_prefix_tokens (recorded under every
    # policy, fcfs included).
    waiting_uncached_tokens: int
    # Sum over running requests of their remaining decode budget.
    running_decode_tokens: int
    num_waiting: int
    num_running: int
    kv_usage: float  # fraction of KV slots in use, 0..1

    @property
    def load(self) -> int:
        return self.waiting_uncached_tokens + self.running_decode_tokens


def _least_loaded(replicas: Sequence[ReplicaLoad]) -> int:
    """Smallest load; ties go to the smallest replica id."""
    return min(replicas, key=lambda r: (r.load, r.replica_id)).replica_id


def _require_replicas(replicas: Sequence[ReplicaLoad]) -> None:
    if not replicas:
        raise ValueError("cannot route: no replicas")


class Router(ABC):
    """Chooses a replica for each request. ``route`` returns a ``ReplicaLoad.replica_id``."""

    name: ClassVar[str]

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    @abstractmethod
    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int: ...

    def on_finish(self, req: Req, replica_id: int) -> None:  # noqa: B027 - optional hook
        """Called when ``req`` finishes (or aborts) on ``replica_id``. Routers whose decisions
        only read the load snapshot need nothing here."""


class RoundRobinRouter(Router):
    name = "round-robin"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._next = 0

    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int:
        _require_replicas(replicas)
        choice = replicas[self._next % len(replicas)].replica_id
        self._next += 1
        return choice


class RandomRouter(Router):
    name = "random"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._rng = random.Random(seed)

    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int:
        _require_replicas(replicas)
        return replicas[self._rng.randrange(len(replicas))].replica_id


class LeastLoadRouter(Router):
    name = "least-load"

    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int:
        _require_replicas(replicas)
        return _least_loaded(replicas)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class ConsistentHashRouter(Router):
    """A hash ring with ``virtual_nodes`` points per replica (blake2b, stable across runs).

    The key is the request's ``routing_key``; without one it is the first
    ``fallback_prefix_tokens`` prompt tokens (plus the cache namespace), so requests that share
    their opening share a replica. Adding a replica to N moves about 1/(N+1) of the keys, all
    to the new replica. Load is ignored.
    """

    name = "consistent-hash"

    def __init__(
        self, *, seed: int = 0, virtual_nodes: int = 160, fallback_prefix_tokens: int = 256
    ) -> None:
        super().__init__(seed=seed)
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        if fallback_prefix_tokens < 1:
            raise ValueError("fallback_prefix_tokens must be >= 1")
        self.virtual_nodes = virtual_nodes
        self.fallback_prefix_tokens = fallback_prefix_tokens
        self._ring_ids: tuple[int, ...] = ()
        self._points: list[int] = []
        self._owners: list[int] = []

    def _build_ring(self, ids: tuple[int, ...]) -> None:
        if ids == self._ring_ids:
            return
        entries = sorted(
            (_hash64(f"replica-{rid}#{v}".encode()), rid)
            for rid in ids
            for v in range(self.virtual_nodes)
        )
        self._points = [p for p, _ in entries]
        self._owners = [rid for _, rid in entries]
        self._ring_ids = ids

    def key_hash(self, req: Req) -> int:
        if req.routing_key is not None:
            return _hash64(b"key\x00" + req.routing_key.encode())
        head = req.prompt_ids[: self.fallback_prefix_tokens].tobytes()
        ns = namespace_seed(req.namespace).to_bytes(8, "little")
        return _hash64(b"prefix\x00" + ns + head)

    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int:
        _require_replicas(replicas)
        self._build_ring(tuple(sorted(r.replica_id for r in replicas)))
        i = bisect.bisect_left(self._points, self.key_hash(req))
        return self._owners[i % len(self._owners)]


class CacheAwareRouter(Router):
    """Longest approximate prefix match, balanced by load.

    Record: per replica, an LRU set of chained page hashes (``pagehash.page_hashes``, pages of
    ``page_size`` tokens) of the prompts routed there, bounded to
    ``max_tokens_per_replica // page_size`` pages; the least recently routed pages go first,
    and a prompt's deeper pages are older than its shallower ones, so eviction trims prefixes
    from the end and a surviving page's ancestors normally survive with it. It approximates
    what each replica's radix cache holds (it never sees the replica's own evictions).

    Rule, in order (loads as in ``ReplicaLoad.load``):
    1. Imbalanced: ``max_load - min_load > balance_abs_threshold`` AND
       ``max_load > balance_rel_threshold * min_load`` -> the least-loaded replica.
    2. Otherwise, with ``best`` the longest match in tokens (ties: less load, then lower id):
       if ``best > 0`` and ``best >= cache_threshold * prompt_len`` -> that replica.
    3. Otherwise the least-loaded replica (ties: lower id).
    The chosen replica's record is then updated with the whole prompt.

    Defaults: ``balance_abs_threshold = 131072`` tokens (about four seconds of prefill for an
    8B model on one H100: long-context traffic has single prompts of 30-190k tokens, and a
    smaller threshold let one such prompt break affinity for everyone: on the Mooncake trace
    at dp=8, 32768 gave a 40.1% hit rate and 131072 gives 49.8%), ``balance_rel_threshold =
    1.5``, ``cache_threshold = 0.5`` (a replica must already hold at least half of the prompt
    to win on affinity alone) and a record of 2M tokens per replica (more than a large GPU's KV
    cache, so the record forgets after the cache does).
    """

    name = "cache-aware"

    def __init__(
        self,
        *,
        seed: int = 0,
        page_size: int = 16,
        max_tokens_per_replica: int = 1 << 21,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 131072,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        super().__init__(seed=seed)
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if max_tokens_per_replica < page_size:
            raise ValueError("max_tokens_per_replica must hold at least one page")
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError("balance thresholds: abs >= 0 and rel >= 1")
        self.page_size = page_size
        self.max_pages = max_tokens_per_replica // page_size
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self._pages_by_replica: dict[int, OrderedDict[int, None]] = {}

    def _pages_of(self, replica_id: int) -> OrderedDict[int, None]:
        tree = self._pages_by_replica.get(replica_id)
        if tree is None:
            tree = self._pages_by_replica[replica_id] = OrderedDict()
        return tree

    def _hashes(self, req: Req) -> list[int]:
        return page_hashes(req.prompt_ids, self.page_size, req.namespace)

    @staticmethod
    def _match_pages(tree: OrderedDict[int, None], hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in tree:
                break
            n += 1
        return n

    def match_len(self, req: Req, replica_id: int) -> int:
        """Tokens of ``req``'s prompt the record says ``replica_id`` holds (page-aligned)."""
        tree = self._pages_by_replica.get(replica_id)
        if tree is None:
            return 0
        return self._match_pages(tree, self._hashes(req)) * self.page_size

    def record_size(self, replica_id: int) -> int:
        """Tokens recorded for ``replica_id``."""
        return len(self._pages_by_replica.get(replica_id, ())) * self.page_size

    def is_imbalanced(self, replicas: Sequence[ReplicaLoad]) -> bool:
        loads = [r.load for r in replicas]
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo

    def route(self, req: Req, replicas: Sequence[ReplicaLoad], now: float) -> int:
        _require_replicas(replicas)
        hashes = self._hashes(req)
        if self.is_imbalanced(replicas):
            choice = _least_loaded(replicas)
        else:
            best_tokens, _, best_id = max(
                (
                    self._match_pages(self._pages_of(r.replica_id), hashes) * self.page_size,
                    -r.load,
                    -r.replica_id,
                )
                for r in replicas
            )
            if best_tokens > 0 and best_tokens >= self.cache_threshold * req.prompt_len:
                choice = -best_id
            else:
                choice = _least_loaded(replicas)
        self._record(choice, hashes)
        return choice

    def _record(self, replica_id: int, hashes: list[int]) -> None:
        tree = self._pages_of(replica_id)
        # Deepest first, so the prompt's shallow pages end up the most recently used.
        for h in reversed(hashes):
            tree[h] = None
            tree.move_to_end(h)
        while len(tree) > self.max_pages:
            tree.popitem(last=False)


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (
        RoundRobinRouter,
        RandomRouter,
        LeastLoadRouter,
        ConsistentHashRouter,
        CacheAwareRouter,
    )
}

DEFAULT_ROUTER = CacheAwareRouter.name


def default_router_name(dp: int) -> str:
    """The router used when ``--router`` is not given: cache-aware for dp > 1."""
    return DEFAULT_ROUTER if dp > 1 else RoundRobinRouter.name


def create_router(name: str, *, seed: int = 0, **options: Any) -> Router:
    """Build the router registered as ``name``; ``options`` are its keyword settings."""
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; choices: {', '.join(ROUTERS)}") from None
    return cls(seed=seed, **options)
