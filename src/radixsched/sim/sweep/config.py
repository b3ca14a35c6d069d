"""A sweep's configuration: the grid of settings (``base`` and ``vary``, cases, traces), its
metrics, and every point checked before any run starts."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixsched.sim.preflight import check
from radixsched.sim.preflight import input_files as run_inputs
from radixsched.sim.settings.limits import RunConfigError, suggest
from radixsched.sim.settings.runconfig import RunSettings, load_yaml, resolve

Scalar = str | int | float | bool | None
Settings = dict[str, Any]
Metrics = dict[str, Scalar]
RunFn = Callable[[Settings], Metrics]

# Real-time measurements: they differ between identical runs, so rows leave them out.
NONDETERMINISTIC_KEYS = frozenset({"wall_s", "requests_per_wall_s"})
DEFAULT_METRICS = ("hit_rate", "ttft_s.p99")
# Beyond this many combinations of the other settings, a chart shows their mean instead.
MAX_SERIES = 8
# The most runs a sweep may have unless ``--max-runs`` allows more: the points are built and
# checked before any run, so a product grown by a long ``vary`` list must be refused first.
MAX_RUNS = 10_000
# The files a sweep writes into ``--out``.
OUTPUT_FILES = ("sweep.csv", "sweep.json", "report.html")


class SweepError(RunConfigError):
    """An invalid sweep config; the message names the offending key or run."""


# ---- config ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    name: str
    base: Mapping[str, Any]
    vary: tuple[tuple[str, tuple[Any, ...]], ...]
    metrics: tuple[str, ...] = DEFAULT_METRICS
    # vary keys whose values are cases: key -> case label -> the settings it sets
    cases: Mapping[str, Mapping[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    best: Best | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], default_name: str = "sweep") -> SweepConfig:
        if not isinstance(data, Mapping):
            raise SweepError("a sweep config is a mapping with 'base' and 'vary'")
        if unknown := set(data) - {"name", "base", "vary", "metrics", "best"}:
            raise SweepError(f"unknown top-level keys {sorted(unknown)}")
        base = data.get("base") or {}
        vary = data.get("vary") or {}
        if not isinstance(base, Mapping) or not isinstance(vary, Mapping):
            raise SweepError("'base' and 'vary' must be mappings")
        if not vary:
            raise SweepError("'vary' needs at least one setting with a list of values")
        name = data.get("name", default_name)
        if isinstance(name, bool) or not isinstance(name, str | int | float) or not str(name):
            raise SweepError(f"'name' must be a non-empty string, got {name!r}")
        pairs: list[tuple[str, tuple[Any, ...]]] = []
        cases: dict[str, dict[str, Mapping[str, Any]]] = {}
        for key, values in vary.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"vary.{key} must be a non-empty list")
            if any(isinstance(v, Mapping) for v in values):
                cases[str(key)] = _cases(str(key), values)
                values = list(cases[str(key)])
            else:
                _check_distinct(str(key), values)
            pairs.append((str(key), tuple(values)))
        _check_case_keys([k for k, _ in pairs if k not in cases], cases)
        metrics = data.get("metrics", list(DEFAULT_METRICS))
        if isinstance(metrics, str):
            metrics = [metrics]
        if not isinstance(metrics, list) or not metrics:
            raise SweepError("'metrics' must be a non-empty list of metric names")
        return cls(
            name=str(name),
            base={str(k): v for k, v in base.items()},
            vary=tuple(pairs),
            metrics=tuple(str(m) for m in metrics),
            cases=cases,
            best=Best.parse(data.get("best")),
        )

    @classmethod
    def load(cls, path: str | Path) -> SweepConfig:
        """The config in ``path``; ``SweepError`` with one line (file:line:column for YAML
        syntax) when it cannot be read or is not a sweep config."""
        p = Path(path)
        try:
            data = load_yaml(p)
        except RunConfigError as e:
            raise SweepError(str(e)) from None
        try:
            return cls.from_mapping(data, default_name=p.stem)
        except SweepError as e:
            raise SweepError(f"{p}: {e}") from None

    @property
    def varied(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.vary)

    @property
    def num_runs(self) -> int:
        """The size of the cartesian product (without building it)."""
        return math.prod(len(values) for _, values in self.vary)

    def points(self) -> list[Settings]:
        """The cartesian product, last ``vary`` key fastest. A case key holds the case's
        label, its settings are merged in (``settings_of`` drops the label)."""
        keys = self.varied
        out = []
        for combo in itertools.product(*(values for _, values in self.vary)):
            point = {**self.base}
            for key, value in zip(keys, combo, strict=True):
                point.update(self.cases[key][value] if key in self.cases else {})
                point[key] = value
            out.append(point)
        return out

    def settings_of(self, point: Settings) -> Settings:
        """A point's run settings (case labels left out)."""
        return {k: v for k, v in point.items() if k not in self.cases}

    def to_json(self) -> dict[str, Any]:
        vary = {
            k: [{"name": c, **self.cases[k][c]} for c in v] if k in self.cases else list(v)
            for k, v in self.vary
        }
        out = {"name": self.name, "base": dict(self.base), "vary": vary}
        out["metrics"] = list(self.metrics)
        if self.best is not None:
            out["best"] = {"metric": self.best.metric, "goal": self.best.goal}
        return out


def _check_distinct(key: str, values: Sequence[Any]) -> None:
    """Each value of a ``vary`` list once: a repeat would run the same point twice and draw
    two points at one x in the report."""
    seen: dict[tuple[bool, Scalar], int] = {}
    for i, v in enumerate(values):
        marker = (isinstance(v, bool), _scalar(v))  # True is not 1; 1 is 1.0
        if marker in seen:
            raise SweepError(
                f"vary.{key}[{i}]: {v!r} repeats vary.{key}[{seen[marker]}]; give each value once"
            )
        seen[marker] = i


def _setting_name(key: str) -> str:
    """A settings key without its scope: ``sched.page-size`` -> ``page_size``."""
    return key.replace("-", "_").rpartition(".")[2]


def _check_case_keys(
    plain: Sequence[str], cases: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> None:
    """A case key labels its cases, so it must not be a setting (the setting would be dropped
    from every run), and no setting may be set by two ``vary`` keys (one would override the
    other in every point, silently)."""
    from radixsched.sim.settings.runconfig import known_keys

    settings = set(known_keys(cli=True))
    owner = {_setting_name(k): f"vary.{k}" for k in plain}
    for key, by_label in cases.items():
        if _setting_name(key) in settings:
            raise SweepError(
                f"vary.{key}: a key whose values are mappings only labels its cases, so "
                f"{key!r} would not be set in any run; name the key otherwise (e.g. "
                "'deployment') and set the setting inside the cases"
            )
        mine: dict[str, str] = {}
        for label, case in by_label.items():
            for name in map(_setting_name, case):
                if name in owner:
                    raise SweepError(
                        f"vary.{key} (case {label!r}) and {owner[name]} both set {name!r}, so "
                        "one would override the other in every run; set it in one place"
                    )
                mine.setdefault(name, f"vary.{key} (case {label!r})")
        owner.update(mine)


def _cases(key: str, values: Sequence[Any]) -> dict[str, Mapping[str, Any]]:
    """The cases of a ``vary`` key whose values are mappings, by label."""
    out: dict[str, Mapping[str, Any]] = {}
    for i, v in enumerate(values):
        if not isinstance(v, Mapping) or not v:
            raise SweepError(
                f"vary.{key}[{i}]: every value of a key that varies several settings together "
                "must be a non-empty mapping of settings"
            )
        settings = {str(k): x for k, x in v.items() if k != "name"}
        label = (
            str(v["name"]) if "name" in v else ", ".join(f"{k}={x}" for k, x in settings.items())
        )
        if label in out:
            raise SweepError(f"vary.{key}: two cases are named {label!r}")
        out[label] = settings
    return out


# ---- settings -> simulator configs -----------------------------------------------------------


def resolve_settings(settings: Mapping[str, Any]) -> RunSettings:
    """Split one point's settings into SchedulerConfig, SimConfig, workload and SLO settings
    (``sim.settings.runconfig.resolve``); ``SweepError`` names the bad key."""
    try:
        return resolve(settings)
    except SweepError:
        raise
    except RunConfigError as e:
        raise SweepError(str(e)) from None


def metric_names() -> set[str]:
    """Every metric name a sweep row can hold (flattened ``PolicyResult.to_json`` keys, SLO
    and lockstep ones included); lockstep verdict counters are matched by prefix."""
    from radixsched.results.metrics import summarize
    from radixsched.results.requests import SloTargets
    from radixsched.results.writers import flatten_result
    from radixsched.sim.deploy.disagg import stats_shape
    from radixsched.sim.deploy.lockstep import LockstepStats

    sample = summarize(
        "policy",
        [],
        optimal_hit_rate=0.0,
        wall_s=0.0,
        retractions=0,
        preemptions=0,
        slo=SloTargets(1.0, 1.0),
        extra={
            "kv_capacity_tokens": 0,
            "dp": 1,
            "rejected": 0,
            "replicas": [],
            "lockstep": LockstepStats(dp=2).to_json(),
            "gpus": 1,
            "deployment": "",
            "disaggregation": stats_shape(),
        },
    )
    return set(flatten_result(sample)) - NONDETERMINISTIC_KEYS


def validate_metrics(metrics: Sequence[str], key: str = "") -> None:
    """``SweepError`` on a metric no row can hold; ``key`` (``metrics``, ``best``) starts the
    message."""
    known = metric_names()
    for m in metrics:
        if m not in known and not m.startswith("lockstep.verdicts."):
            raise SweepError(
                (f"{key}: " if key else "")
                + f"unknown metric {m!r}{suggest(m, sorted(known))}; metrics are dotted keys of "
                "simulate --json results, e.g. hit_rate, ttft_s.p99, "
                "throughput.output_tokens_per_s"
            )


def _shown(point: Settings, varied: Sequence[str]) -> str:
    return ", ".join(f"{k}={point[k]}" for k in varied if k in point)


def _runs_text(runs: Sequence[int], points: Sequence[Settings], varied: Sequence[str]) -> str:
    """Which runs a problem affects: ``every run``, ``run 3 (dp=2)``, ``runs 0-99, 200``."""
    if len(runs) == len(points) and len(points) > 1:
        return "every run"
    if len(runs) == 1:
        shown = _shown(points[runs[0]], varied)
        return f"run {runs[0]}" + (f" ({shown})" if shown else "")
    spans: list[list[int]] = []
    for r in sorted(runs):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return "runs " + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def validate_points(
    points: Sequence[Settings], varied: Sequence[str] = (), labels: Sequence[str] = ()
) -> None:
    """Check every point before any run starts (``sim.preflight.check``): one line per
    problem, naming the runs it affects. ``labels``: case keys, which are not settings."""
    from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD

    problems: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        try:
            settings = {k: v for k, v in p.items() if k not in labels}
            errors = check(resolve_settings(settings), default_workload=DEFAULT_WORKLOAD)
        except SweepError as e:
            errors = [str(e)]
        for err in errors:
            problems.setdefault(err, []).append(i)
    if not problems:
        return
    lines = [f"{_runs_text(runs, points, varied)}: {err}" for err, runs in problems.items()]
    raise SweepError("\n".join(lines))


def validate_traces(
    points: Sequence[Settings], varied: Sequence[str] = (), labels: Sequence[str] = ()
) -> None:
    """Read every trace file the points use, once each, so that a bad line fails the sweep
    before any run (``check`` only opens the file); one line per bad trace, naming its
    file:line and the runs that use it. Call after ``validate_points``."""
    from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD
    from radixsched.sim.workloads.spec import parse_workload_spec
    from radixsched.sim.workloads.tokens import WorkloadError

    runs_of: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        rs = resolve_settings({k: v for k, v in p.items() if k not in labels})
        runs_of.setdefault(rs.workload.spec or DEFAULT_WORKLOAD, []).append(i)
    lines = []
    for spec, runs in runs_of.items():
        kind, params = parse_workload_spec(spec)
        if not kind.is_trace:
            continue
        try:
            kind.build(dict(params), 0)  # every line parsed; prompts are built by the runs
        except WorkloadError as e:
            lines.append(f"{_runs_text(runs, points, varied)}: {e}")
    if lines:
        raise SweepError("\n".join(lines))


def input_files(points: Sequence[Settings], labels: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(what, path) of every file the points read: traces, model config.json files and
    calibration files (each once)."""
    from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD

    found: dict[str, str] = {}
    for p in points:
        rs = resolve_settings({k: v for k, v in p.items() if k not in labels})
        for flag, what, path in run_inputs(rs, DEFAULT_WORKLOAD):
            found.setdefault(path, f"the {flag} {what}")
    return [(what, path) for path, what in found.items()]


def _trace_version(spec: str) -> int | None:
    """The modification time of the trace file ``spec`` reads (None: a generated workload)."""
    from radixsched.sim.workloads.spec import parse_workload_spec, trace_version

    return trace_version(*parse_workload_spec(spec))


def _scalar(v: Any) -> Scalar:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _metric_value(row: Mapping[str, Scalar], metric: str) -> float | None:
    v = row.get(metric)
    return float(v) if isinstance(v, int | float) and _is_number(v) else None


@dataclass(frozen=True)
class Best:
    """The metric a sweep is judged on and whether higher (max) or lower (min) is better."""

    metric: str
    goal: str

    @classmethod
    def parse(cls, value: Any) -> Best | None:
        if value is None:
            return None
        if isinstance(value, str):
            if not value:
                raise SweepError("'best' must be a metric name, got an empty one")
            return cls(value, "min" if _lower_is_better(value) else "max")
        if not isinstance(value, Mapping) or "metric" not in value:
            raise SweepError("'best' is a metric name or {metric: NAME, goal: max|min}")
        if unknown := set(value) - {"metric", "goal"}:
            raise SweepError(f"unknown keys in 'best': {sorted(unknown)}")
        if not isinstance(value["metric"], str) or not value["metric"]:
            raise SweepError(f"best.metric must be a metric name, got {value['metric']!r}")
        metric = value["metric"]
        goal = str(value.get("goal", "min" if _lower_is_better(metric) else "max"))
        if goal not in ("max", "min"):
            raise SweepError(f"best.goal must be max or min, got {goal!r}")
        return cls(metric, goal)

    def pick(self, rows: Sequence[Mapping[str, Scalar]]) -> int | None:
        """The index of the best row (the first on a tie), None when no row has a value."""
        scored = [
            (i, v) for i, r in enumerate(rows) if (v := _metric_value(r, self.metric)) is not None
        ]
        if not scored:
            return None
        sign = 1.0 if self.goal == "max" else -1.0
        return max(scored, key=lambda iv: (sign * iv[1], -iv[0]))[0]


def _lower_is_better(metric: str) -> bool:
    """Latencies (a ``*_s`` part that is not a ``*_per_s`` rate) and failure counts."""
    parts = metric.split(".")
    if any(p.endswith("_s") and not p.endswith("_per_s") for p in parts):
        return True
    return parts[-1] in ("retractions", "preemptions", "num_aborted", "rejected", "hit_rate_gap")
