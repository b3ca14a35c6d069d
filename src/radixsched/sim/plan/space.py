"""The search space of a plan: settings given as lists, expanded into candidates.

A plan takes ``simulate``'s settings (``sim.settings.runconfig``'s keys, from flags or
``--config``), where any scheduler or simulator setting may be a list (a YAML list, or
``2048,8192`` on the command line) and ``dp`` a range (``1-4``). Every combination is a
candidate; ``deployments`` adds prefill/decode splits (``1:3``: one prefill instance per three
decode instances, times each ``dp``). Candidates that are the same run are kept once (a router
choice means nothing with one co-located replica). Each candidate's settings go through
``runconfig.resolve``, so a value is checked exactly as ``simulate`` checks it."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixsched.sim.cost.hardware import gpu_name
from radixsched.sim.settings.limits import RunConfigError
from radixsched.sim.settings.runconfig import SLO_KEYS, WORKLOAD_KEYS, RunSettings, resolve

# Axes every plan has, in the table's column order; other varied settings follow them.
MAIN_AXES = ("gpu", "tp", "dp", "schedule_policy", "router")
# Settings a plan sets itself from ``deployments`` and ``dp``.
SPLIT_KEYS = ("disaggregation", "prefill_instances", "decode_instances")
# Largest search a plan expands (each candidate is several simulations).
MAX_CANDIDATES = 4096

Deployment = tuple[int, int] | None  # (prefill, decode) instances per dp unit; None co-located


class SpaceError(ValueError):
    """A bad search space; the message names the flag (or config key)."""


@dataclass(frozen=True)
class Candidate:
    """One deployment to evaluate: its main axes, the other settings it varies, and the
    resolved settings it runs with."""

    index: int
    gpu: str
    tp: int
    dp: int
    policy: str
    router: str | None  # None: one co-located replica (no router), or the default
    deployment: Deployment
    flags: tuple[tuple[str, Any], ...]  # other varied settings, in axis order
    settings: RunSettings

    @property
    def deployment_label(self) -> str:
        if self.deployment is None:
            return "co-located"
        p, d = self.deployment
        return f"{p * self.dp}P:{d * self.dp}D"

    @property
    def label(self) -> str:
        parts = [f"{self.gpu} tp{self.tp}", f"dp{self.dp}", self.policy]
        if self.router:
            parts.append(self.router)
        if self.deployment is not None:
            parts.append(self.deployment_label)
        parts += [f"{k}={v}" for k, v in self.flags]
        return " ".join(parts)

    def group_key(self) -> tuple[Any, ...]:
        """Everything but the replica count: a target-rate plan climbs ``dp`` within it."""
        return (self.gpu, self.tp, self.policy, self.router, self.deployment, self.flags)


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def values_of(key: str, value: Any) -> list[Any]:
    """A setting's values: a YAML list, ``a,b`` on the command line, ``lo-hi`` for ``dp``;
    else the one value."""
    if isinstance(value, list | tuple):
        out = list(value)
    elif isinstance(value, str) and "," in value:
        out = [v.strip() for v in value.split(",")]
    else:
        out = [value]
    if key == "dp":
        out = [n for v in out for n in _dp_range(v)]
    if any(isinstance(v, str) and not v for v in out) or not out:
        raise SpaceError(f"{flag_name(key)}: an empty value in {value!r}")
    if len({repr(v) for v in out}) != len(out):
        raise SpaceError(f"{flag_name(key)}: a value is given twice in {value!r}")
    return out


def _dp_range(value: Any) -> list[Any]:
    if isinstance(value, str) and value.strip().isdigit():
        return [int(value)]
    if not isinstance(value, str) or "-" not in value.strip("-"):
        return [value]
    lo, _, hi = value.partition("-")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        raise SpaceError(f"--dp: expected N, N-M or a list, got {value!r}") from None
    if not 1 <= a <= b:
        raise SpaceError(f"--dp: the range {value!r} must run from 1 or more upwards")
    return list(range(a, b + 1))


def parse_deployments(text: str | Sequence[Any] | None) -> list[Deployment]:
    """``colocated,1:1,1:3`` as [None, (1, 1), (1, 3)] (default: co-located only)."""
    if text is None:
        return [None]
    items = [str(t).strip() for t in (text if isinstance(text, list | tuple) else [text])]
    items = [p.strip() for t in items for p in t.split(",")]
    out: list[Deployment] = []
    for item in items:
        if item.lower() in ("colocated", "co-located"):
            dep: Deployment = None
        else:
            p, sep, d = item.partition(":")
            try:
                dep = (int(p), int(d)) if sep else None
            except ValueError:
                dep = None
            if dep is None or min(dep) < 1:
                raise SpaceError(
                    f"--deployments: expected 'colocated' or a P:D ratio (1:3), got {item!r}"
                )
        if dep in out:
            raise SpaceError(f"--deployments: {item!r} is given twice")
        out.append(dep)
    if not out:
        raise SpaceError("--deployments: the list is empty")
    return out


def axes(settings: Mapping[str, Any], policies: Sequence[str]) -> dict[str, list[Any]]:
    """Every setting's values, the main axes first; ``policies`` is the policy axis."""
    for key in SPLIT_KEYS:
        if key in settings:
            raise SpaceError(
                f"{flag_name(key)}: a plan sets the split itself; give --deployments 1:3 "
                "(prefill:decode instances per replica unit)"
            )
    for key in (*WORKLOAD_KEYS, *SLO_KEYS, "calibration"):
        if isinstance(settings.get(key), list):
            raise SpaceError(f"{flag_name(key)}: a plan takes one value, not a list")
    out: dict[str, list[Any]] = {"schedule_policy": list(policies)}
    for key, value in settings.items():
        if key in ("schedule_policy", "policy"):
            continue
        out[key] = values_of(key, value) if key not in WORKLOAD_KEYS + SLO_KEYS else [value]
    order = [k for k in MAIN_AXES if k in out] + [k for k in out if k not in MAIN_AXES]
    return {k: out[k] for k in order}


def expand(
    settings: Mapping[str, Any],
    policies: Sequence[str],
    deployments: Sequence[Deployment],
    labels: Mapping[str, str],
) -> list[Candidate]:
    """Every distinct candidate, each resolved (``RunConfigError`` names a bad value)."""
    grid = axes(settings, policies)
    varied = [k for k, v in grid.items() if len(v) > 1 and k not in MAIN_AXES]
    total = len(deployments)
    for values in grid.values():
        total *= len(values)
    if total > MAX_CANDIDATES:
        raise SpaceError(f"the search space has {total:,} candidates, over {MAX_CANDIDATES:,}")
    out: list[Candidate] = []
    seen: set[str] = set()
    keys = list(grid)
    for combo in itertools.product(*grid.values()):
        chosen = dict(zip(keys, combo, strict=True))
        for dep in deployments:
            cand = _candidate(len(out), chosen, dep, varied, labels)
            key = repr(cand.settings)
            if key not in seen:
                seen.add(key)
                out.append(cand)
    if not out:
        raise SpaceError("the search space is empty: give at least one --gpu, --tp, --policy")
    return out


def _candidate(
    index: int,
    chosen: Mapping[str, Any],
    dep: Deployment,
    varied: Sequence[str],
    labels: Mapping[str, str],
) -> Candidate:
    from radixsched.sim.settings.deployment import _SPLIT_ONLY

    run = dict(chosen)
    units = 1
    if dep is None:
        for key in _SPLIT_ONLY:  # refused without a split
            run.pop(key, None)
    else:
        value = run.pop("dp", 1)
        try:
            units = int(str(value))
        except ValueError:
            raise RunConfigError(
                f"{labels.get('dp', 'dp')}: expected an integer, got {value!r}"
            ) from None
        if units < 1:
            raise RunConfigError(f"{labels.get('dp', 'dp')}: must be >= 1, got {units}")
        run.update(disaggregation=True, prefill_instances=dep[0] * units)
        run["decode_instances"] = dep[1] * units
    rs = resolve(run, labels=labels)
    sim = rs.sim_config()
    router = _router(sim.router, sim.dp, dep)
    if router is None and "router" in rs.sim:  # one co-located replica: no router to vary
        rs = dataclasses.replace(rs, sim={k: v for k, v in rs.sim.items() if k != "router"})
    return Candidate(
        index=index,
        gpu=gpu_name(sim.gpu),
        tp=sim.tp,
        dp=sim.dp if dep is None else units,
        policy=str(rs.sched.get("schedule_policy", "fcfs")),
        router=router,
        deployment=dep,
        flags=tuple((k, rs.sched.get(k, rs.sim.get(k))) for k in varied),
        settings=rs,
    )


def _router(given: str | None, dp: int, dep: Deployment) -> str | None:
    """The router a candidate runs: the one given, else the default; None for one
    co-located replica."""
    from radixsched.cluster.routers import DEFAULT_ROUTER, default_router_name

    if dep is not None:
        return given or DEFAULT_ROUTER
    if dp > 1:
        return given or default_router_name(dp)
    return None
