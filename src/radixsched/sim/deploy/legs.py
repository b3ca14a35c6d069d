"""The legs of a request through a split prefill/decode deployment, and each instance's load as
the routers of that deployment see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixsched.request import Req
from radixsched.sim.deploy.replicas import Replica

PREFILL, DECODE = "prefill", "decode"


# ---- one request's journey -------------------------------------------------------------------------


@dataclass(eq=False)
class Leg:
    """A request's two copies and the times it passed each stage (virtual seconds)."""

    req: Req  # the client's request: the decode instance's copy
    pre: Req  # the prefill instance's copy
    p: int  # prefill instance (index among prefill instances)
    d: int  # decode instance (index among decode instances)
    bootstrapped_s: float | None = None
    sent_s: float | None = None
    landed_s: float | None = None

    @property
    def prefilled_s(self) -> float | None:
        return self.pre.times.first_token


# ---- loads the routers see ---------------------------------------------------------------------------


def prefill_load(inst: Instance) -> Any:
    """A prefill instance's backlog: uncached prompt tokens queued (bootstrapping requests
    count whole) and in its chunked request."""
    from radixsched.cluster.disagg import prefill_role
    from radixsched.cluster.routers import ReplicaLoad

    s = inst.sched
    role = prefill_role(s)
    waiting = sum(max(r.fill_len - r.num_matched_prefix_tokens, 0) for r in s.waiting)
    waiting += role.bootstrap_tokens
    if s.chunked_req is not None:
        waiting += s.chunked_req.fill_len - s.chunked_req.prefix_len
    return ReplicaLoad(
        replica_id=inst.local,
        waiting_uncached_tokens=waiting,
        running_decode_tokens=0,
        num_waiting=len(s.waiting) + len(role.bootstrap),
        num_running=s.num_running() + len(role.inflight),
        kv_usage=s.kv_usage(),
    )


def decode_load(inst: Instance) -> Any:
    """A decode instance's load: KV tokens it holds or is asked for (used slots, prompts
    waiting for preallocation, offloaded requests) plus the decode tokens still to come."""
    from radixsched.cluster.disagg import decode_role
    from radixsched.cluster.routers import ReplicaLoad

    s = inst.sched
    role = decode_role(s)
    used = s.capacity - s.allocator.available_size() - s.cache.evictable_size()
    return ReplicaLoad(
        replica_id=inst.local,
        waiting_uncached_tokens=used + role.queued_kv,
        running_decode_tokens=sum(s.decode_tokens_to_go()) + role.pending_decode,
        num_waiting=len(role.prealloc) + len(role.offloaded),
        num_running=s.num_running() + len(role.transferring) + len(role.arrived),
        kv_usage=s.kv_usage(),
    )


class Instance(Replica):
    """A replica in a role: ``idx`` is its index among all instances (prefill instances
    first), ``local`` among its role's. ``blocked``: a prefill instance that could admit
    nothing while in-flight KV holds its memory, waiting for its next event."""

    def __init__(self, rep: Replica, role: str, local: int, cost: Any, capacity: int):
        super().__init__(rep.idx, rep.sched, rep.clock)
        self.role, self.local, self.gpu, self.tp = role, local, str(cost.gpu.name), int(cost.tp)
        self.capacity = capacity
        self.blocked = False
