"""The deployment a run describes: co-located replicas (dp x tp GPUs) or a split prefill/decode
deployment, each role's hardware, its label, and the checks of the split's settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from radixsched.sim.settings.simconfig import SimConfig


@dataclass(frozen=True)
class RoleSpec:
    """One role's hardware: GPU preset, TP degree, KV capacity per instance."""

    gpu: str
    tp: int
    max_total_tokens: int | None

    def sim_config(self, base: SimConfig, *, host_tier: bool) -> SimConfig:
        return dataclasses.replace(
            base,
            gpu=self.gpu,
            tp=self.tp,
            max_total_tokens=self.max_total_tokens,
            dp=1,
            enable_hierarchical_cache=base.enable_hierarchical_cache and host_tier,
        )


def role_specs(sim: SimConfig) -> tuple[RoleSpec, RoleSpec]:
    """(prefill, decode) hardware: each role's own flags, else the shared ones."""

    def spec(gpu: str | None, tp: int | None, kv: int | None) -> RoleSpec:
        return RoleSpec(
            sim.gpu if gpu is None else gpu,
            sim.tp if tp is None else tp,
            sim.max_total_tokens if kv is None else kv,
        )

    return (
        spec(sim.prefill_gpu, sim.prefill_tp, sim.prefill_max_total_tokens),
        spec(sim.decode_gpu, sim.decode_tp, sim.decode_max_total_tokens),
    )


def gpu_count(sim: SimConfig) -> int:
    """GPUs the run's deployment uses (co-located: dp x tp)."""
    if not sim.disaggregation:
        return sim.dp * sim.tp
    pre, dec = role_specs(sim)
    return sim.prefill_instances * pre.tp + sim.decode_instances * dec.tp


def deployment_label(sim: SimConfig) -> str:
    """``2P:6D`` for a split deployment, ``co-located x8`` otherwise."""
    if sim.disaggregation:
        return f"{sim.prefill_instances}P:{sim.decode_instances}D"
    return f"co-located x{sim.dp}"


# Settings of the split deployment alone: set without --disaggregation, they would be ignored.
_SPLIT_ONLY = (
    "prefill_instances",
    "decode_instances",
    "prefill_gpu",
    "prefill_tp",
    "decode_gpu",
    "decode_tp",
    "prefill_max_total_tokens",
    "decode_max_total_tokens",
    "decode_router",
    "disaggregation_link",
    "disaggregation_link_bandwidth_gb_s",
    "disaggregation_link_latency_ms",
    "disaggregation_bootstrap_ms",
)

_SIM_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig)}


def check_disaggregation(sim: SimConfig) -> list[str]:
    """Problems of the disaggregation settings, one line each (none when it is off)."""
    from radixsched.cluster.routers import ROUTERS
    from radixsched.sim.cost.hardware import PresetError, get_link

    if not sim.disaggregation:
        return [
            f"--{name.replace('_', '-')} applies to --disaggregation only: add it, or drop this"
            for name in _SPLIT_ONLY
            if getattr(sim, name) != _SIM_DEFAULTS[name]
        ]
    errors = []
    for name in ("prefill_instances", "decode_instances"):
        if getattr(sim, name) < 1:
            errors.append(f"{name} must be >= 1, got {getattr(sim, name)}")
    for name in ("prefill_tp", "decode_tp"):
        value = getattr(sim, name)
        if value is not None and value < 1:
            errors.append(f"{name} must be >= 1, got {value}")
    if sim.dp != 1:
        errors.append(
            "--disaggregation sizes the deployment with --prefill-instances and "
            f"--decode-instances; --dp must stay 1, got {sim.dp}"
        )
    if sim.enable_dp_attention:
        errors.append("--disaggregation does not model --enable-dp-attention")
    if sim.max_concurrency is not None:
        errors.append(
            "--disaggregation takes open-loop arrivals (a rate or the trace's timestamps), "
            "not --max-concurrency clients"
        )
    if sim.decode_router is not None and sim.decode_router not in ROUTERS:
        errors.append(f"unknown decode_router {sim.decode_router!r}; valid: {', '.join(ROUTERS)}")
    try:
        get_link(sim.disaggregation_link)
    except PresetError as e:
        errors.append(str(e))
    bw = sim.disaggregation_link_bandwidth_gb_s
    if bw is not None and not bw > 0:
        errors.append(f"disaggregation_link_bandwidth_gb_s must be > 0, got {bw}")
    for name in ("disaggregation_link_latency_ms", "disaggregation_bootstrap_ms"):
        value = getattr(sim, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            errors.append(f"{name} must be >= 0 ms, got {value}")
    return errors
