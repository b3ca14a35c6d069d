"""Multi-replica pieces: routers, the prefill delayer, the host KV tier and the prefill/decode
roles of a split deployment (``cluster.disagg``) (no torch, no ray)."""

from radixsched.cluster.delayer import (
    AllGather,
    DelayerConfig,
    DelayReason,
    LocalAllGather,
    LockstepRunner,
    PrefillDelayer,
    PrefillDelayerPass,
    PrefillStatus,
    RankInfo,
    RecentPrefillBatchSizeTracker,
    Verdict,
)
from radixsched.cluster.hicache import HostKVTier, host_capacity_tokens
from radixsched.cluster.routers import (
    DEFAULT_ROUTER,
    ROUTERS,
    ReplicaLoad,
    Router,
    create_router,
    default_router_name,
)

__all__ = [
    "DEFAULT_ROUTER",
    "ROUTERS",
    "AllGather",
    "DelayReason",
    "DelayerConfig",
    "HostKVTier",
    "LocalAllGather",
    "LockstepRunner",
    "PrefillDelayer",
    "PrefillDelayerPass",
    "PrefillStatus",
    "RankInfo",
    "RecentPrefillBatchSizeTracker",
    "ReplicaLoad",
    "Router",
    "Verdict",
    "create_router",
    "default_router_name",
    "host_capacity_tokens",
]
