"""One schema for the settings of a simulation run, shared by ``simulate`` (its flags and
``--config run.yaml``) and ``sweep`` configs (``base`` and every point of ``vary``).

Keys are the flags' names without the dashes (``request_rate`` or ``request-rate``), bare or
prefixed to be explicit:

- workload (``workload.``): ``workload`` (a ``--workload`` spec), ``request_rate`` (a number
  or ``inf``), ``num_requests``, ``workload_seed`` (default: ``seed``);
- scheduler (``sched.``): every ``SchedulerConfig`` field (``schedule_policy``, ``page_size``...);
- simulator (``sim.``): every ``SimConfig`` field (``gpu``, ``model``, ``dp``, ``router``...);
- SLO (``slo.``): ``slo_ttft_ms``, ``slo_tpot_ms``;
- ``simulate`` only (a sweep varies ``schedule_policy`` and writes its own files):
  ``policy`` (a list or comma-separated names, or ``all``), ``json``, ``csv``, ``report``,
  ``requests_csv``, ``quiet``, ``jobs``.

Arrivals follow one rule everywhere (``RATE_RULE``). ``engine_mode`` (``sim.engine_modes``)
supplies the scheduler settings a run does not give. ``check`` validates a resolved run
without running anything, so a typo fails before any work starts, one line per problem.
Numeric values are resolved within ``LIMITS`` (no NaN; no infinity but where it means
"never"; times, efficiencies and sizes the simulated clock and memory can hold), and a run
whose KV pools would not fit this machine's memory is refused by ``check``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Union

from radixsched.config import SchedulerConfig
from radixsched.sim.simconfig import SimConfig

RATE_RULE = (
    "without a request rate, requests arrive at the trace's timestamps; generated workloads "
    "have none and all arrive at t=0 (rate inf), as SGLang's and vLLM's serving benchmarks "
    "send them"
)

WORKLOAD_KEYS = ("workload", "request_rate", "num_requests", "workload_seed")
SLO_KEYS = ("slo_ttft_ms", "slo_tpot_ms")
# Output and selection keys only ``simulate`` takes.
CLI_KEYS = ("policy", "json", "csv", "report", "requests_csv", "quiet", "jobs")
OUTPUT_KEYS = ("json", "csv", "report", "requests_csv")

# Bounds that keep simulated times and sizes representable: a step or delay longer than an
# hour, an efficiency below the calibrator's smallest fit (1 / 1e4), a host tier over 1 PB.
MAX_MS = 3_600_000.0
MIN_EFFICIENCY = 1e-4
MAX_PREFILL_EFF_TOKENS = 1e6
MAX_HICACHE_GB = 1e6
MIN_LINK_GB_S = 1e-3
# Bytes of bookkeeping per KV page and instance: the allocator's free stack (int64) and two
# position maps (int32). A run whose pools need more than the machine's memory is refused.
KV_BYTES_PER_PAGE = 16


class Limit(NamedTuple):
    """The valid range of a numeric setting (None: unbounded on that side); NaN is never
    valid, infinity only where ``infinite`` (``inf`` meaning "never" or "unlimited")."""

    low: float | None
    high: float | None
    infinite: bool = False
    unit: str = ""

    def text(self, kind: str = "a number") -> str:
        """The range in words: ``an integer >= 1``, ``a number between 0 and 1``."""
        lo, hi, unit = self.low, self.high, self.unit
        if lo is not None and hi is not None:
            out = f"{kind} between {_num(lo)} and {_num(hi)}{unit}"
        elif lo is not None:
            out = f"{kind} >= {_num(lo)}{unit}"
        else:
            out = f"a finite {kind.split()[-1]} <= {_num(hi or 0.0)}{unit}"
        return out + (" (or inf)" if self.infinite else "")

    def allows(self, value: int | float) -> bool:
        if isinstance(value, float) and (
            math.isnan(value) or (math.isinf(value) and not self.infinite)
        ):
            return False
        if self.low is not None and value < self.low:
            return False
        return self.high is None or value <= self.high


def _num(x: float) -> str:
    """A bound as text: ``3,600,000``, ``0.0001``."""
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


_MS = Limit(None, MAX_MS, unit=" ms")  # below 0 (and NaN): the cost model's own check
_COUNT, _POSITIVE = Limit(0, None), Limit(1, None)
# The ranges that no other check covers (``SchedulerConfig``, ``CostModel`` and
# ``check_disaggregation`` check the rest with their own messages), by setting.
LIMITS: dict[str, Limit] = {
    "seed": _COUNT,
    "priority_scheduling_preemption_threshold": _COUNT,
    "max_prefix_match_queue": _COUNT,
    "in_batch_prefix_check_threshold": _COUNT,
    "in_batch_prefix_deprioritize_threshold": _COUNT,
    "lpm_max_wait_s": Limit(0, None, infinite=True, unit=" s"),
    "lpm_max_wait_tokens": _COUNT,
    "prefill_max_requests": _POSITIVE,
    "max_running_requests": _POSITIVE,
    "schedule_conservativeness": _COUNT,
    "clip_max_new_tokens": _COUNT,
    "init_new_token_ratio": _COUNT,
    "min_new_token_ratio_factor": _COUNT,
    "new_token_ratio_decay_steps": _POSITIVE,
    "retract_decode_steps": _COUNT,
    "mfu": Limit(MIN_EFFICIENCY, None),
    "mbu": Limit(MIN_EFFICIENCY, None),
    "step_overhead_ms": _MS,
    "sched_step_ms": _MS,
    "sched_per_req_ms": _MS,
    "sched_per_prefill_ms": _MS,
    "request_latency_ms": _MS,
    "request_serial_ms": _MS,
    "prefill_eff_tokens": Limit(None, MAX_PREFILL_EFF_TOKENS, unit=" tokens"),
    "prefill_delayer_max_delay_passes": _POSITIVE,
    "prefill_delayer_max_delay_ms": Limit(0, MAX_MS, unit=" ms"),
    "prefill_delayer_token_usage_low_watermark": Limit(0, 1),
    "prefill_delayer_queue_min_ratio": Limit(0, None, infinite=True),
    "disaggregation_link_bandwidth_gb_s": Limit(MIN_LINK_GB_S, None, infinite=True, unit=" GB/s"),
    "disaggregation_link_latency_ms": Limit(0, MAX_MS, unit=" ms"),
    "disaggregation_bootstrap_ms": Limit(0, MAX_MS, unit=" ms"),
    "hicache_size": Limit(0, MAX_HICACHE_GB, unit=" GB"),
    "hicache_page_size": _POSITIVE,
}


class RunConfigError(ValueError):
    """An invalid setting; the message is one line naming the key."""


class WorkloadSettings(NamedTuple):
    spec: str | None  # None: the CLI's default workload
    request_rate: float | None
    num_requests: int | None
    seed: int | None  # None: the scheduler's seed


@dataclass(frozen=True)
class RunSettings:
    """A run's settings split by owner (each dict holds only keys that were given)."""

    sched: dict[str, Any] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)
    workload: WorkloadSettings = field(
        default_factory=lambda: WorkloadSettings(None, None, None, None)
    )
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    cli: dict[str, Any] = field(default_factory=dict)  # CLI_KEYS that were given

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's settings: those given, then ``engine_mode``'s defaults for the rest
        (an unknown mode adds none; ``check`` reports it)."""
        from radixsched.sim.engine_modes import ENGINE_MODES, scheduler_defaults

        mode = str(self.sim.get("engine_mode", "sglang"))
        defaults = scheduler_defaults(mode, set(self.sched)) if mode in ENGINE_MODES else {}
        return SchedulerConfig(**{**defaults, **self.sched})

    def sim_config(self) -> SimConfig:
        return SimConfig(**self.sim)


def _fields(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _scopes() -> dict[str, tuple[str, ...]]:
    return {
        "workload": WORKLOAD_KEYS,
        "sched": tuple(_fields(SchedulerConfig)),
        "sim": tuple(_fields(SimConfig)),
        "slo": SLO_KEYS,
        "cli": CLI_KEYS,
    }


def known_keys(*, cli: bool) -> list[str]:
    """Every bare key a config may use (``cli``: also simulate's own keys)."""
    return [k for scope, keys in _scopes().items() if cli or scope != "cli" for k in keys]


def suggest(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_rate(value: Any, name: str = "request_rate") -> float | None:
    """A request rate: a positive number or ``inf``; None stays None (see ``RATE_RULE``)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool):
        raise RunConfigError(f"{name} must be a number or 'inf', got {value!r}")
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{name} must be a number or 'inf', got {value!r}") from None
    if not rate > 0:
        raise RunConfigError(f"{name} must be > 0 (or inf), got {value!r}")
    return rate


# ---- values ----------------------------------------------------------------------------------


def _unwrap(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def coerce(cls: type[Any], name: str, value: Any, where: str) -> Any:
    """``value`` as the type of field ``name`` of ``cls`` (YAML gives typed values, flags
    strings), within its ``LIMITS``; ``RunConfigError`` naming ``where`` otherwise."""
    out = _coerce(cls, name, value, where)
    limit = LIMITS.get(name)
    number = isinstance(out, int | float) and not isinstance(out, bool)
    if limit is not None and number and not limit.allows(out):
        kind = "an integer" if isinstance(out, int) else "a number"
        raise RunConfigError(f"{where}: must be {limit.text(kind)}, got {value!r}")
    return out


def _coerce(cls: type[Any], name: str, value: Any, where: str) -> Any:
    tp, optional = _unwrap(typing.get_type_hints(cls)[name])
    if value is None or (isinstance(value, str) and value.lower() == "none" and optional):
        if optional:
            return None
        raise RunConfigError(f"{where}: a value is required")
    if typing.get_origin(tp) is Literal:
        allowed = [str(a) for a in typing.get_args(tp)]
        if str(value) not in allowed:
            raise RunConfigError(
                f"{where}: expected one of {', '.join(allowed)}, got {value!r}"
                + suggest(str(value), allowed)
            )
        return str(value)
    if tp is bool:
        return _bool(value, where)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise RunConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            raise RunConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(value, dict | list):
        raise RunConfigError(f"{where}: expected a single value, got {value!r}")
    return str(value)


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise RunConfigError(f"{where}: expected true or false, got {value!r}")


def _positive_ms(value: Any, where: str) -> float | None:
    if value is None:
        return None
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{where}: expected milliseconds, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(ms) and ms > 0):
        raise RunConfigError(f"{where}: must be a positive number of milliseconds, got {value!r}")
    return ms


def _int_or_none(value: Any, where: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise RunConfigError(f"{where}: expected an integer, got {value!r}")
    try:
        n = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        n = None
    if n is None:
        raise RunConfigError(f"{where}: expected an integer, got {value!r}")
    if n < minimum:
        raise RunConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return n


# ---- resolving -------------------------------------------------------------------------------


def resolve(
    settings: Mapping[str, Any], *, cli: bool = False, labels: Mapping[str, str] | None = None
) -> RunSettings:
    """Split one run's settings by owner and coerce each value to its field's type.
    ``cli`` allows simulate's own keys (``CLI_KEYS``); ``labels`` names keys in messages
    (``request_rate`` -> ``--request-rate`` for a value given as a flag)."""

    def lab(key: str) -> str:
        return (labels or {}).get(key, key)

    scopes = _scopes()
    if not cli:
        scopes.pop("cli")
    parts: dict[str, dict[str, Any]] = {scope: {} for scope in scopes}
    for raw_key, value in settings.items():
        key = str(raw_key).replace("-", "_")
        scope, _, name = key.rpartition(".")
        if scope:
            if scope not in scopes or name not in scopes[scope]:
                valid = [f"{s}.{k}" for s, keys in scopes.items() for k in keys]
                raise RunConfigError(f"unknown setting {raw_key!r}" + suggest(key, valid))
            owners = [scope]
        else:
            owners = [s for s, keys in scopes.items() if name in keys]
            if not owners:
                if not cli and name in CLI_KEYS:
                    hint = (
                        "a sweep varies schedule_policy"
                        if name == "policy"
                        else "a sweep writes its own files to --out"
                    )
                    raise RunConfigError(f"setting {raw_key!r} is for simulate only: {hint}")
                raise RunConfigError(
                    f"unknown setting {raw_key!r}" + suggest(name, known_keys(cli=cli))
                )
            if len(owners) > 1:
                raise RunConfigError(
                    f"ambiguous setting {raw_key!r}: write one of "
                    + ", ".join(f"{o}.{name}" for o in owners)
                )
        if name in parts[owners[0]]:
            raise RunConfigError(f"setting {name!r} is given twice")
        parts[owners[0]][name] = value
    sched = {k: coerce(SchedulerConfig, k, v, lab(k)) for k, v in parts["sched"].items()}
    sim = {k: coerce(SimConfig, k, v, lab(k)) for k, v in parts["sim"].items()}
    wl = parts["workload"]
    spec = wl.get("workload")
    if spec is not None and not isinstance(spec, str):
        raise RunConfigError(f"{lab('workload')}: expected a spec string, got {spec!r}")
    if spec is not None and not spec.strip():
        raise RunConfigError(f"{lab('workload')}: expected a workload spec, got an empty one")
    workload = WorkloadSettings(
        spec=spec,
        request_rate=parse_rate(wl.get("request_rate"), lab("request_rate")),
        num_requests=_int_or_none(wl.get("num_requests"), lab("num_requests"), 1),
        seed=_int_or_none(wl.get("workload_seed"), lab("workload_seed"), 0),
    )
    slo = parts["slo"]
    return RunSettings(
        sched=sched,
        sim=sim,
        workload=workload,
        slo_ttft_ms=_positive_ms(slo.get("slo_ttft_ms"), lab("slo_ttft_ms")),
        slo_tpot_ms=_positive_ms(slo.get("slo_tpot_ms"), lab("slo_tpot_ms")),
        cli=_cli_values(parts.get("cli", {}), lab),
    )


def _cli_values(values: Mapping[str, Any], lab: Any) -> dict[str, Any]:
    """Simulate's own settings with their types checked: output paths are non-empty strings,
    ``quiet`` a boolean (``policy`` and ``jobs`` are checked by the CLI)."""
    out = dict(values)
    for key in OUTPUT_KEYS:
        path = out.get(key)
        if path is not None and (not isinstance(path, str) or not path.strip()):
            raise RunConfigError(f"{lab(key)}: expected a file path, got {path!r}")
    if out.get("quiet") is not None:
        out["quiet"] = _bool(out["quiet"], lab("quiet"))
    return out


def load_yaml(path: str | Path) -> Mapping[str, Any]:
    """A YAML mapping from ``path``; ``RunConfigError`` with one line (file:line:column for
    syntax errors) otherwise."""
    import yaml

    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RunConfigError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise RunConfigError(f"{p}: is a directory, not a YAML file") from None
    except OSError as e:
        raise RunConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RunConfigError(f"{p}: not UTF-8 text (byte offset {e.start})") from None
    try:
        data = yaml.load(text, Loader=_unique_keys_loader())  # a SafeLoader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise RunConfigError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise RunConfigError(f"{p}: invalid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise RunConfigError(f"{p}: expected a mapping of settings, got {type(data).__name__}")
    return data


@functools.cache
def _unique_keys_loader() -> type[Any]:
    """PyYAML's ``SafeLoader``, except that a key given twice in one mapping is an error (YAML
    forbids it; PyYAML would keep the last value silently). Keys merged in with ``<<`` may
    still be overridden."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: the base class reports it
                        continue
                    if first is not None:
                        raise yaml.constructor.ConstructorError(
                            problem=f"key {key!r} is given twice (first on line {first + 1})",
                            problem_mark=key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


# ---- checking --------------------------------------------------------------------------------


def check_output_path(key: str, path: str) -> str | None:
    """Why ``path`` cannot be written (its folder missing or read-only, a folder itself), or
    None. Nothing is created."""
    if not path.strip():
        return f"{key}: expected a file path, got an empty one"
    p = Path(path)
    if p.is_dir():
        return f"{key} {path}: is a directory"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        return f"{key} {path}: folder {parent} does not exist"
    if not parent.is_dir():
        return f"{key} {path}: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{key} {path}: folder {parent} is not writable"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{key} {path}: file is not writable"
    return None


def check(
    rs: RunSettings, policies: Sequence[str] | None = None, *, default_workload: str | None = None
) -> list[str]:
    """Every problem of a run that can be found without running it, one line each: config
    values, policy, eviction, router and preset names, the cost model (a model that does not
    fit), the workload spec and its trace file. ``policies`` overrides ``schedule_policy``."""
    from radixsched.cache.evict import EVICTION_STRATEGIES
    from radixsched.cluster.routers import ROUTERS
    from radixsched.policies import POLICIES
    from radixsched.sim.workloads import WorkloadError, check_workload_spec

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
    for name in names:
        if name not in POLICIES:
            errors.append(
                f"unknown policy {name!r}{suggest(name, list(POLICIES))}; valid: "
                + ", ".join(POLICIES)
            )
    retraction = str(rs.sched.get("retraction_policy", "length"))
    retractions = list(_fields(SchedulerConfig)["retraction_policy"].metadata["choices"])
    if retraction not in retractions:
        errors.append(
            f"unknown retraction_policy {retraction!r}{suggest(retraction, retractions)}; "
            f"valid: {', '.join(retractions)}"
        )
    eviction = str(rs.sched.get("radix_eviction_policy", "lru"))
    if eviction.lower() not in EVICTION_STRATEGIES:
        errors.append(
            f"unknown radix_eviction_policy {eviction!r}{suggest(eviction, list(EVICTION_STRATEGIES))}"
            f"; valid: {', '.join(EVICTION_STRATEGIES)}"
        )
    if sim is not None:
        if sim.dp < 1:
            errors.append(f"dp must be >= 1, got {sim.dp}")
        if sim.tp < 1:
            errors.append(f"tp must be >= 1, got {sim.tp}")
        if sim.router is not None and sim.router not in ROUTERS:
            errors.append(
                f"unknown router {sim.router!r}{suggest(sim.router, list(ROUTERS))}; valid: "
                + ", ".join(ROUTERS)
            )
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
    spec = rs.workload.spec or default_workload
    if spec is not None:
        try:
            check_workload_spec(spec)
        except WorkloadError as e:
            errors.append(str(e))
    return errors


def _check_sim_modes(sim: SimConfig, sched: SchedulerConfig | None) -> list[str]:
    """The engine mode, chunk alignment and closed loop (values a YAML file can give that
    argparse's choices never saw)."""
    from radixsched.sim.engine_modes import (
        CHUNK_ALIGNMENT,
        ENGINE_MODES,
        EngineModeError,
        check_alignment,
        chunk_alignment,
    )

    errors = []
    if sim.engine_mode not in ENGINE_MODES:
        errors.append(
            f"unknown engine_mode {sim.engine_mode!r}{suggest(sim.engine_mode, list(ENGINE_MODES))}"
            f"; valid: {', '.join(ENGINE_MODES)}"
        )
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
    from radixsched.sim.simulate import build_cost_model

    try:
        build_cost_model(sim)
    except ValueError as e:  # CostModelError, CalibrationError: one line with the reason
        return [str(e)]
    except OSError as e:
        return [f"calibration {sim.calibration}: {e.strerror or e}"]
    return []


def _check_disaggregation(sim: SimConfig) -> list[str]:
    """The split deployment's settings and each role's cost model (its GPU and TP)."""
    from radixsched.sim.disagg import check_disaggregation, role_specs

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
    from radixsched.sim.disagg import role_specs
    from radixsched.sim.simulate import build_cost_model

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
    combination (a policy that needs the prefix cache, say) run now, not after loading."""
    from radixsched.clock import VirtualClock
    from radixsched.scheduler import Scheduler
    from radixsched.sim.costmodel import CostModelRunner
    from radixsched.sim.simulate import build_cost_model

    cost = build_cost_model(sim)
    errors = []
    for name in names:
        try:
            cfg = dataclasses.replace(sched, schedule_policy=name)
            Scheduler(
                cfg,
                CostModelRunner(cost, seed=cfg.seed),
                kv_slots=int(cost.kv_capacity_tokens()),
                clock=VirtualClock(),
                context_len=cost.model.max_context_len,
            )
        except ValueError as e:
            errors.append(f"{name}: {e}" if len(names) > 1 else str(e))
    return errors
