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

Arrivals follow one rule everywhere (``RATE_RULE``). ``engine_mode`` (``sim.settings.engine_modes``)
supplies the scheduler settings a run does not give. ``check`` validates a resolved run
without running anything, so a typo fails before any work starts, one line per problem.
Numeric values are resolved within ``LIMITS`` (no NaN; no infinity but where it means
"never"; times, efficiencies and sizes the simulated clock and memory can hold), and a run
whose KV pools would not fit this machine's memory is refused by ``check``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from radixsched.config import SchedulerConfig
from radixsched.sim.settings.limits import (
    RunConfigError,
    _bool,
    _int_or_none,
    _positive_ms,
    coerce,
    parse_rate,
    suggest,
)
from radixsched.sim.settings.simconfig import SimConfig

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
        from radixsched.sim.settings.engine_modes import ENGINE_MODES, scheduler_defaults

        mode = str(self.sim.get("engine_mode", "sglang"))
        gpu = self.sim.get("gpu", SimConfig.gpu)
        known = mode in ENGINE_MODES
        defaults = scheduler_defaults(mode, set(self.sched), str(gpu)) if known else {}
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


# The built-in run: a burst of 2,048 requests in 256 prompt groups (4,096-token system
# prompts), more distinct prefix than one H200's KV cache holds: the regime where the
# waiting-queue policy decides the hit rate. ``make run`` sends it at 8 requests/s, a load
# one H200 sustains within its SLOs (``radixsched plan``); the README's burst table at 64.
DEFAULT_WORKLOAD = "shared-prefix:groups=256,prompts=8,system_len=4096"

MAIN_POLICIES = ("fcfs", "lof", "random", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
