"""The preflight of a run: every setting checked against the others, the cost model and the
schedulers built once each, before anything is generated or simulated. One line per problem."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from radixsched.config import SchedulerConfig
from radixsched.sim.settings.limits import suggest
from radixsched.sim.settings.runconfig import RunSettings, _fields
from radixsched.sim.settings.simconfig import SimConfig

# Bytes of bookkeeping per KV page and instance: the reference allocator's free stack (int64)
# and two position maps (int32), which every scheduler builds, and the native pool's stack and
# position map (int32 each) that the accelerated core then uses (measured: 2.43 GB peak for a
# 1e8-token pool against 0.19 GB for 1e6). A run whose pools need more than the machine's
# memory is refused.
KV_BYTES_PER_PAGE = 24


def _unknown(what: str, name: str, valid: list[str]) -> str:
    """The line for a name that is not one of ``valid`` (a close one suggested)."""
    return f"unknown {what} {name!r}{suggest(name, valid)}; valid: {', '.join(valid)}"


def check(
    rs: RunSettings, policies: Sequence[str] | None = None, *, default_workload: str | None = None
) -> list[str]:
    """Every problem of a run that can be found without running it, one line each: config
    values, policy, eviction, router and preset names, the cost model (a model that does not
    fit), the workload spec and its trace file. ``policies`` overrides ``schedule_policy``."""
    from radixsched.cache.evict import EVICTION_STRATEGIES
    from radixsched.cluster.routers import ROUTERS
    from radixsched.policies import POLICIES
    from radixsched.sim.workloads.spec import check_workload_spec
    from radixsched.sim.workloads.tokens import WorkloadError

    errors: list[str] = []
    try:
        sched = rs.scheduler_config()
    except (TypeError, ValueError) as e:
        errors.append(str(e))
        sched = None
    try:
        sim = rs.sim_config()
    except (TypeError, ValueError) as e:
        errors.append(str(e))
        sim = None
    names = list(policies) if policies else [str(rs.sched.get("schedule_policy", "fcfs"))]
    errors += [_unknown("policy", name, list(POLICIES)) for name in names if name not in POLICIES]
    retraction = str(rs.sched.get("retraction_policy", "length"))
    retractions = list(_fields(SchedulerConfig)["retraction_policy"].metadata["choices"])
    if retraction not in retractions:
        errors.append(_unknown("retraction_policy", retraction, retractions))
    eviction = str(rs.sched.get("radix_eviction_policy", "lru"))
    if eviction.lower() not in EVICTION_STRATEGIES:
        errors.append(_unknown("radix_eviction_policy", eviction, list(EVICTION_STRATEGIES)))
    if sim is not None:
        if sim.dp < 1:
            errors.append(f"dp must be >= 1, got {sim.dp}")
        if sim.tp < 1:
            errors.append(f"tp must be >= 1, got {sim.tp}")
        if sim.router is not None and sim.router not in ROUTERS:
            errors.append(_unknown("router", sim.router, list(ROUTERS)))
        if sim.tp >= 1:
            errors.extend(_check_cost_model(sim))
        errors.extend(_check_sim_modes(sim, sched))
        errors.extend(_check_disaggregation(sim))
    if sched is not None and sched.disaggregation_mode != "null":
        errors.append(
            "disaggregation_mode is set per instance role; split a run with disaggregation: "
            "true, prefill_instances and decode_instances"
        )
    if sched is not None and sim is not None and not errors:
        errors.extend(_check_memory(sim, sched.page_size))
    if sched is not None and sim is not None and not errors:
        errors.extend(_check_schedulers(sched, sim, names))
    if (spec := rs.workload.spec or default_workload) is not None:
        try:
            check_workload_spec(spec)
        except WorkloadError as e:
            errors.append(str(e))
    return errors


def input_files(rs: RunSettings, default_workload: str) -> list[tuple[str, str, str]]:
    """(flag, what, path) of every file a run reads: its trace (``workload``, ``trace``), its
    model's config.json (``model``, ``config``) and its calibration file (``calibration``,
    ``file``)."""
    from radixsched.sim.cost.hfconfig import config_path

    files = []
    if (trace := trace_path(rs.workload.spec or default_workload)) is not None:
        files.append(("workload", "trace", trace))
    model = config_path(str(rs.sim["model"])) if rs.sim.get("model") else None
    if model is not None:
        files.append(("model", "config", str(model)))
    if rs.sim.get("calibration"):
        files.append(("calibration", "file", str(rs.sim["calibration"])))
    return files


def trace_path(spec: str) -> str | None:
    """The file a workload spec's trace is read from; None for a generated workload, or a spec
    that does not parse (``check`` reports it)."""
    from radixsched.sim.workloads.spec import parse_workload_spec
    from radixsched.sim.workloads.tokens import WorkloadError

    try:
        kind, params = parse_workload_spec(spec)
    except WorkloadError:
        return None
    return str(params["path"]) if kind.is_trace else None


def _check_sim_modes(sim: SimConfig, sched: SchedulerConfig | None) -> list[str]:
    """The engine mode, chunk alignment and closed loop (values a YAML file can give that
    argparse's choices never saw)."""
    from radixsched.sim.settings.engine_modes import (
        CHUNK_ALIGNMENT,
        ENGINE_MODES,
        EngineModeError,
        check_alignment,
        chunk_alignment,
    )

    errors = []
    if sim.engine_mode not in ENGINE_MODES:
        errors.append(_unknown("engine_mode", sim.engine_mode, list(ENGINE_MODES)))
    alignments = sorted(set(CHUNK_ALIGNMENT.values()))
    if sim.chunk_alignment is not None and sim.chunk_alignment not in alignments:
        errors.append(
            f"unknown chunk_alignment {sim.chunk_alignment!r}; valid: {', '.join(alignments)}"
        )
    elif sim.engine_mode in ENGINE_MODES and sched is not None:
        try:
            check_alignment(chunk_alignment(sim.engine_mode, sim.chunk_alignment), sched.page_size)
        except EngineModeError as e:
            errors.append(str(e))
    if sim.max_concurrency is not None:
        if sim.max_concurrency < 1:
            errors.append(f"max_concurrency must be >= 1, got {sim.max_concurrency}")
        elif sim.enable_dp_attention and sim.dp > 1:
            errors.append(
                "max_concurrency (closed-loop clients) is not supported with "
                "enable_dp_attention: the lockstep ranks take open-loop arrivals only"
            )
    return errors


def _check_cost_model(sim: SimConfig) -> list[str]:
    from radixsched.sim.cost.build import build_cost_model

    try:
        build_cost_model(sim)
    except ValueError as e:  # CostModelError, CalibrationError: one line with the reason
        return [str(e)]
    except OSError as e:
        return [f"calibration {sim.calibration}: {e.strerror or e}"]
    return []


def _check_disaggregation(sim: SimConfig) -> list[str]:
    """The split deployment's settings and each role's cost model (its GPU and TP)."""
    from radixsched.sim.settings.deployment import check_disaggregation, role_specs

    errors = check_disaggregation(sim)
    if sim.disaggregation and not errors:
        for role, spec in zip(("prefill", "decode"), role_specs(sim), strict=True):
            errors += [
                f"{role} instances: {e}"
                for e in _check_cost_model(spec.sim_config(sim, host_tier=False))
            ]
    return errors


def _physical_memory() -> int | None:
    """Bytes of memory this machine has (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(sim: SimConfig, page_size: int) -> list[str]:
    """A run whose KV pools' page tables alone exceed this machine's memory (a huge
    max_total_tokens or dp) would fail allocating them, or be killed, mid-run: refuse it."""
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.settings.deployment import role_specs

    memory = _physical_memory()
    if memory is None:
        return []
    if sim.disaggregation:
        pools = [
            (
                getattr(sim, f"{role}_instances"),
                build_cost_model(spec.sim_config(sim, host_tier=False)).kv_capacity_tokens(),
            )
            for role, spec in zip(("prefill", "decode"), role_specs(sim), strict=True)
        ]
    else:
        pools = [(sim.dp, build_cost_model(sim).kv_capacity_tokens())]
    need = sum(n * (tokens // page_size) for n, tokens in pools) * KV_BYTES_PER_PAGE
    if need <= memory:
        return []
    sizes = " + ".join(f"{n:,} x {tokens:,}" for n, tokens in pools)
    return [
        f"the simulated KV pools ({sizes} tokens) need {need / 2**30:,.1f} GiB for their page "
        f"tables alone, more than this machine's {memory / 2**30:,.1f} GiB: lower "
        "max_total_tokens or dp"
    ]


def _check_schedulers(sched: SchedulerConfig, sim: SimConfig, names: Sequence[str]) -> list[str]:
    """Build one scheduler per policy (no request): the scheduler's own checks of a flag
    combination (a policy that needs the prefix cache, say) run now, not after loading. They
    read the flags, never the pool's size, so each gets a pool of one page (the run's pool
    is 14 MB of tables per million tokens to fault in and free; a negative capacity stays
    negative, refused as before)."""
    from radixsched.clock import VirtualClock
    from radixsched.scheduler import Scheduler
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    cost = build_cost_model(sim)
    errors = []
    for name in names:
        try:
            cfg = dataclasses.replace(sched, schedule_policy=name)
            Scheduler(
                cfg,
                CostModelRunner(cost, seed=cfg.seed),
                kv_slots=min(int(cost.kv_capacity_tokens()), cfg.page_size),
                clock=VirtualClock(),
                context_len=cost.model.max_context_len,
            )
        except ValueError as e:
            errors.append(f"{name}: {e}" if len(names) > 1 else str(e))
    return errors
