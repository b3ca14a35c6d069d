"""Parameter sweeps: ``radixsched sweep CONFIG.yaml [--ray ADDRESS] [--out DIR] [--jobs N]``.

A sweep config (YAML) holds a ``base`` mapping of settings, a ``vary`` mapping of setting ->
list of values, and optionally ``name``, ``metrics`` (the metrics plotted in the report,
dotted names of ``PolicyResult.to_json``, default ``hit_rate`` and ``ttft_s.p99``; an unknown
name is an error listing the close ones) and ``best`` (a metric, or ``{metric: M, goal:
max|min}``: the run that does best on it is named in the output; the goal defaults to min for
latencies, ``*_s`` metrics, and max otherwise). The sweep runs the cartesian product of the
``vary`` lists (in the order written, the last key varying fastest), each point being ``base``
updated with one combination. A ``vary`` list gives each value once, and a setting is set by
one ``vary`` key at most; a product of more than ``--max-runs`` (default ``MAX_RUNS``) runs is
refused before its points are built.

A ``vary`` key whose values are mappings varies several settings together, one *case* per
mapping (its ``name`` labels it; default: its settings), so deployments of different shapes
sit in one table: ``deployment: [{name: co-located, dp: 8}, {name: 2P:6D, disaggregation:
true, prefill_instances: 2, decode_instances: 6}]`` (examples/disagg-sweep.yaml).

Settings are those of ``simulate --config`` (``sim.runconfig``, the same keys as the flags):
``workload``, ``request_rate``, ``num_requests``, ``workload_seed``, ``slo_ttft_ms``,
``slo_tpot_ms``, any ``SchedulerConfig`` or ``SimConfig`` field, bare or prefixed with
``workload.``/``sched.``/``sim.``/``slo.``. Arrivals follow ``sim.runconfig.RATE_RULE``. Every
point is checked before any run starts (names of policies, GPUs, models, routers, metrics,
the workload spec and its trace file): a typo fails at once, one line per problem.

Outputs in ``--out``: ``sweep.csv`` (one row per run: run index, the varied settings, every
metric, ``error``), ``sweep.json`` (meta, config, base, rows, per-run wall time) and
``report.html`` (self-contained, Plotly with plotly.js inlined: for every varied setting, each
plotted metric against that setting's values, one line per combination of the other varied
settings, axes named with their units). A folder that holds another sweep's results (or such
files of unknown origin) is refused unless ``--overwrite``; a rerun of the same sweep replaces
its own. An input of the sweep (its config, a trace) is never overwritten.

Execution: local processes by default (``ProcessPoolExecutor``, ``--jobs``; ``--jobs 1`` runs
in-process), or Ray with ``--ray ADDRESS`` (``ray`` imported only then; one ``ray.remote`` task
per run). Every run is a deterministic simulation, so both give identical rows; the real-time
keys (``wall_s``, ``requests_per_wall_s``) are kept out of the rows for that reason and are
reported per run in the JSON's ``timing`` list instead (with ``run_wall_s``, the
run's own wall time including workload generation). A failing run records its error and the
sweep goes on; the command then exits 1. A process that runs several points builds a workload
once for all the points with the same workload settings, and its prompts once for all request
rates (``workloads.DraftMemo``). ``--jobs`` beyond the usable CPUs runs one process per CPU.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from radixsched.cli_common import same_file
from radixsched.sim.runconfig import (
    RunConfigError,
    RunSettings,
    check,
    load_yaml,
    resolve,
    suggest,
)

if TYPE_CHECKING:
    from radixsched.sim.workloads import DraftMemo

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
        unknown = set(data) - {"name", "base", "vary", "metrics", "best"}
        if unknown:
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
        unknown = set(value) - {"metric", "goal"}
        if unknown:
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
    from radixsched.sim.runconfig import known_keys

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

# ``resolve_settings`` returns this (the shared run schema's type).
ResolvedPoint = RunSettings


def resolve_settings(settings: Mapping[str, Any]) -> RunSettings:
    """Split one point's settings into SchedulerConfig, SimConfig, workload and SLO settings
    (``sim.runconfig.resolve``); ``SweepError`` names the bad key."""
    try:
        return resolve(settings)
    except SweepError:
        raise
    except RunConfigError as e:
        raise SweepError(str(e)) from None


def metric_names() -> set[str]:
    """Every metric name a sweep row can hold (flattened ``PolicyResult.to_json`` keys, SLO
    and lockstep ones included); lockstep verdict counters are matched by prefix."""
    from radixsched.sim.disagg import stats_shape
    from radixsched.sim.lockstep import LockstepStats
    from radixsched.sim.metrics import SloTargets, summarize
    from radixsched.sim.table import flatten_result

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
    """Check every point before any run starts (``sim.runconfig.check``): one line per
    problem, naming the runs it affects. ``labels``: case keys, which are not settings."""
    from radixsched.cli_common import DEFAULT_WORKLOAD

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
    from radixsched.cli_common import DEFAULT_WORKLOAD
    from radixsched.sim.workloads import WorkloadError, parse_workload_spec

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
    from radixsched.cli_common import DEFAULT_WORKLOAD
    from radixsched.sim.hfconfig import config_path
    from radixsched.sim.workloads import parse_workload_spec

    found: dict[str, str] = {}
    for p in points:
        rs = resolve_settings({k: v for k, v in p.items() if k not in labels})
        kind, params = parse_workload_spec(rs.workload.spec or DEFAULT_WORKLOAD)
        if kind.is_trace:
            found.setdefault(str(params["path"]), "the workload trace")
        model = rs.sim.get("model")
        path = config_path(str(model)) if model else None
        if path is not None:
            found.setdefault(str(path), "the model config")
        if rs.sim.get("calibration"):
            found.setdefault(str(rs.sim["calibration"]), "the calibration file")
    return [(what, path) for path, what in found.items()]


# The workload (with its optimal hit rate) of the last point this process ran: the next point
# with the same workload settings reuses it (``simulate`` never changes a workload). A sweep's
# points vary their last key fastest, so a worker often runs several on one workload. A point
# at another request rate reuses the prompts at least (``_prompts``).
_last_workload: tuple[tuple[Any, ...], Any, float] | None = None
_prompts: DraftMemo | None = None  # made on first use


def _trace_version(spec: str) -> int | None:
    """The modification time of the trace file ``spec`` reads (None: a generated workload)."""
    from radixsched.sim.workloads import parse_workload_spec, trace_version

    return trace_version(*parse_workload_spec(spec))


def simulate_point(settings: Settings) -> Metrics:
    """The default run function: one simulation, its ``PolicyResult`` flattened (with SLO
    attainment when the point sets SLO targets)."""
    from radixsched.cli_common import DEFAULT_WORKLOAD
    from radixsched.sim.metrics import SloTargets, slo_result
    from radixsched.sim.simulate import simulate
    from radixsched.sim.table import flatten_result
    from radixsched.sim.workloads import DraftMemo, load_workload, workload_optimal_hit_rate

    global _last_workload, _prompts
    r = resolve_settings(settings)
    sched = r.scheduler_config()
    sim = r.sim_config()
    wl = r.workload
    seed = sched.seed if wl.seed is None else wl.seed
    key: tuple[Any, ...] = (wl.spec or DEFAULT_WORKLOAD, wl.request_rate, wl.num_requests, seed)
    key += (sched.page_size, _trace_version(key[0]))
    if _last_workload is None or _last_workload[0] != key:
        _last_workload = None  # the previous one is freed before the next is built
        _prompts = _prompts or DraftMemo()
        workload = load_workload(
            key[0], request_rate=key[1], num_requests=key[2], seed=key[3], memo=_prompts
        )
        _last_workload = (key, workload, workload_optimal_hit_rate(workload, sched.page_size))
    _, workload, optimal = _last_workload
    run = simulate(workload, sched, sim, optimal_hit_rate=optimal)
    result = run.result
    slo = SloTargets(
        None if r.slo_ttft_ms is None else r.slo_ttft_ms / 1e3,
        None if r.slo_tpot_ms is None else r.slo_tpot_ms / 1e3,
    )
    if slo.active:
        result = dataclasses.replace(result, slo=slo_result(run.requests, slo, result.makespan_s))
    return flatten_result(result)


# ---- execution -------------------------------------------------------------------------------


class RunOutcome(NamedTuple):
    metrics: Metrics | None  # None when the run failed
    error: str | None
    wall_s: float


def run_guarded(run_fn: RunFn, settings: Settings) -> RunOutcome:
    """Run one point; an exception becomes the outcome's error (the sweep goes on)."""
    t0 = time.perf_counter()
    try:
        metrics = run_fn(settings)
    except Exception as e:  # any failure of one run is reported, not fatal
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
        return RunOutcome(None, f"{type(e).__name__}: {e}{where}", time.perf_counter() - t0)
    return RunOutcome(dict(metrics), None, time.perf_counter() - t0)


OnResult = Callable[[int, RunOutcome], None]


class SweepExecutor(Protocol):
    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]: ...


class LocalExecutor:
    """``jobs`` worker processes (spawned, so nothing is inherited from the caller's threads);
    ``jobs == 1`` runs in this process. ``run_fn`` must be importable (a module-level
    function)."""

    def __init__(self, jobs: int = 1) -> None:
        if jobs < 1:
            raise ValueError("jobs must be >= 1")
        self.jobs = jobs

    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]:
        out: list[RunOutcome | None] = [None] * len(points)
        if self.jobs == 1 or len(points) <= 1:
            for i, p in enumerate(points):
                out[i] = run_guarded(run_fn, p)
                if on_result is not None:
                    on_result(i, out[i])  # type: ignore[arg-type]
        else:
            ctx = multiprocessing.get_context("spawn")
            workers = min(self.jobs, len(points))
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = {pool.submit(run_guarded, run_fn, p): i for i, p in enumerate(points)}
                for fut in as_completed(futures):
                    i = futures[fut]
                    out[i] = fut.result()
                    if on_result is not None:
                        on_result(i, out[i])  # type: ignore[arg-type]
        return [o for o in out if o is not None]


class RayExecutor:
    """One ``ray.remote`` task per run. Connects with ``ray.init(address=...)`` unless Ray is
    already initialised (then that session is used and left running); a session started here
    is shut down afterwards."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._started = False  # this executor started the session (and shuts it down)

    def connect(self) -> None:
        """Join Ray's session now (unless one is running), so that a missing ``ray`` package
        or an unreachable cluster fails before any run: ``SweepError`` naming ``--ray``."""
        try:
            import ray
        except ImportError:
            raise SweepError(
                f"--ray {self.address}: the ray package is not installed "
                "(pip install 'radixsched[ray]'); or run without --ray on local processes"
            ) from None
        if ray.is_initialized():
            return
        try:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # ConnectionError, RuntimeError, ValueError ... by version
            detail = " ".join(str(e).split()) or type(e).__name__
            raise SweepError(f"--ray {self.address}: cannot connect to Ray: {detail}") from None
        self._started = True

    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]:
        import ray

        self.connect()
        started, self._started = self._started, False
        try:
            task = ray.remote(num_cpus=1)(run_guarded)
            refs = [task.remote(run_fn, p) for p in points]
            index = {ref: i for i, ref in enumerate(refs)}
            out: list[RunOutcome | None] = [None] * len(points)
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index[ref]
                    out[i] = RunOutcome(*ray.get(ref))
                    if on_result is not None:
                        on_result(i, out[i])  # type: ignore[arg-type]
            return [o for o in out if o is not None]
        finally:
            if started:
                ray.shutdown()


@dataclass
class SweepResult:
    config: SweepConfig
    points: list[Settings]
    outcomes: list[RunOutcome]

    @property
    def num_failed(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)

    def best_run(self, rows: Sequence[Mapping[str, Scalar]] | None = None) -> int | None:
        """The run that does best on the config's ``best`` metric (None without one)."""
        best = self.config.best
        return None if best is None else best.pick(self.rows() if rows is None else rows)

    def best_text(self) -> str | None:
        """``best by M (max): run 3 (deployment=2P:6D) with 1.23; ...`` the others' values."""
        best, rows = self.config.best, self.rows()
        i = self.best_run(rows)
        if best is None or i is None:
            return None
        shown = _shown(self.points[i], self.config.varied)
        others = "; ".join(
            f"{_shown(self.points[j], self.config.varied) or f'run {j}'}: {_fmt(v)}"
            for j, r in enumerate(rows)
            if j != i and (v := _metric_value(r, best.metric)) is not None
        )
        value = _metric_value(rows[i], best.metric)
        return (
            f"best by {best.metric} ({best.goal}): run {i}"
            + (f" ({shown})" if shown else "")
            + f" with {_fmt(value)}"
            + (f"; {others}" if others else "")
        )

    def rows(self) -> list[dict[str, Scalar]]:
        """One row per run: ``run``, the varied settings, deterministic metrics, ``error``."""
        rows: list[dict[str, Scalar]] = []
        for i, (p, o) in enumerate(zip(self.points, self.outcomes, strict=True)):
            row: dict[str, Scalar] = {"run": i}
            for key in self.config.varied:
                row[key] = _scalar(p[key])
            for k, v in (o.metrics or {}).items():
                if k not in NONDETERMINISTIC_KEYS and k not in row:
                    row[k] = v
            row["error"] = o.error
            rows.append(row)
        return rows

    def write(self, out_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        paths = {
            "csv": out / "sweep.csv",
            "json": out / "sweep.json",
            "report": out / "report.html",
        }
        fields: dict[str, None] = {}
        for row in rows:
            fields.update(dict.fromkeys(row))
        fields.pop("error", None)
        fields["error"] = None
        with paths["csv"].open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields), restval="")
            writer.writeheader()
            writer.writerows(rows)
        best = self.best_run(rows)
        doc = {
            "meta": dict(meta or {}),
            "sweep": _json_value(self.config.to_json()),
            "best": None
            if best is None or self.config.best is None
            else {
                "run": best,
                "metric": self.config.best.metric,
                "goal": self.config.best.goal,
                "value": _json_scalar(rows[best].get(self.config.best.metric)),
                "settings": {
                    k: _json_scalar(_scalar(self.points[best][k])) for k in self.config.varied
                },
            },
            "rows": [{k: _json_scalar(v) for k, v in r.items()} for r in rows],
            "timing": [
                {
                    "run": i,
                    "run_wall_s": o.wall_s,
                    **{
                        k: _json_scalar(v)
                        for k, v in (o.metrics or {}).items()
                        if k in NONDETERMINISTIC_KEYS
                    },
                }
                for i, o in enumerate(self.outcomes)
            ],
        }
        # Serialised first: a value JSON cannot hold fails before the file is truncated.
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
        paths["json"].write_text(text, encoding="utf-8")
        paths["report"].write_text(render_sweep_report(self, meta), encoding="utf-8")
        return paths


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _scalar(v: Any) -> Scalar:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def _json_scalar(v: Scalar) -> Scalar:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _json_value(v: Any) -> Any:
    """``v`` with every non-finite float as ``_json_scalar`` writes it (a config may hold
    ``.inf``: ``request_rate``, ``lpm_max_wait_s``)."""
    if isinstance(v, Mapping):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return _json_scalar(v) if isinstance(v, float) else v


def run_sweep(
    config: SweepConfig,
    *,
    run_fn: RunFn = simulate_point,
    executor: SweepExecutor | None = None,
    on_result: OnResult | None = None,
) -> SweepResult:
    """Run every point of ``config`` with ``run_fn`` on ``executor`` (default: in-process)."""
    points = config.points()
    runs = [config.settings_of(p) for p in points]
    outcomes = (executor or LocalExecutor(1)).map(run_fn, runs, on_result)
    if len(outcomes) != len(points):
        raise RuntimeError(f"executor returned {len(outcomes)} outcomes for {len(points)} runs")
    return SweepResult(config, points, outcomes)


# ---- report ----------------------------------------------------------------------------------

# Axis titles of common metrics and settings (anything else: its own name); seconds-valued
# metrics (``*_s``) get "(s)".
METRIC_LABELS = {
    "hit_rate": ("cache hit rate", "%"),
    "device_hit_rate": ("device cache hit rate", "%"),
    "host_hit_rate": ("host-tier hit rate", "%"),
    "optimal_hit_rate": ("optimal hit rate", "%"),
    "hit_rate_gap": ("hit rate below the optimum", "%"),
    "fairness_jain": ("fairness (Jain's index, 1 = equal)", ""),
    "peak_kv_usage": ("peak KV usage", "%"),
    "slo.attainment": ("SLO attainment", "%"),
    "slo.goodput_requests_per_s": ("goodput (req/s)", ""),
    "throughput.output_tokens_per_s": ("output throughput (tok/s)", ""),
    "throughput.input_tokens_per_s": ("input throughput (tok/s)", ""),
    "throughput.requests_per_s": ("throughput (req/s)", ""),
    "makespan_s": ("makespan (s)", ""),
    "prefill_tokens_computed": ("prefill tokens computed", ""),
    "retractions": ("retractions", ""),
    "peak_queue_len": ("peak waiting queue (requests)", ""),
}
SETTING_LABELS = {
    "request_rate": "request rate (req/s)",
    "max_total_tokens": "KV capacity, max_total_tokens (tokens)",
    "dp": "data-parallel replicas (dp)",
    "tp": "tensor-parallel degree (tp)",
    "page_size": "page size (tokens)",
    "chunked_prefill_size": "chunked prefill size (tokens)",
    "max_prefill_tokens": "max prefill tokens",
    "hicache_size": "host KV tier (GB)",
    "num_requests": "requests",
    "schedule_policy": "policy",
    "slo_ttft_ms": "TTFT SLO (ms)",
    "slo_tpot_ms": "TPOT SLO (ms)",
}
_STAT_NAMES = {"p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "mean": "mean",
               "max": "max", "std": "std"}  # fmt: skip
_LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E latency",
                  "queue_wait_s": "queue wait"}  # fmt: skip


def metric_label(metric: str) -> tuple[str, str]:
    """(axis title with its unit, "%" when the values are fractions shown as percentages)."""
    key = metric.rsplit(".", 1)
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    if len(key) == 2 and key[0] in _LATENCY_NAMES and key[1] in _STAT_NAMES:
        return f"{_LATENCY_NAMES[key[0]]} {key[1]} (s)", ""
    if metric.endswith("_s"):
        return f"{metric} (s)", ""
    return metric, ""


def setting_label(setting: str) -> str:
    return SETTING_LABELS.get(setting.rsplit(".", 1)[-1], setting)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _metric_value(row: Mapping[str, Scalar], metric: str) -> float | None:
    v = row.get(metric)
    return float(v) if isinstance(v, int | float) and _is_number(v) else None


def _chart(
    title: str,
    setting: str,
    x_values: Sequence[Any],
    metric: str,
    series: Sequence[tuple[str, list[float | None]]],
) -> Any:
    """A Plotly line chart with markers; x is numeric when every value is a number, else
    categorical (in the order given)."""
    import plotly.graph_objects as go

    from radixsched.sim.report import base_layout, policy_dash
    from radixsched.sim.table import policy_color

    numeric = all(_is_number(v) for v in x_values) and len(set(x_values)) > 1
    xs = list(x_values) if numeric else [str(v) for v in x_values]
    y_title, unit = metric_label(metric)
    fig = go.Figure()
    for k, (name, ys) in enumerate(series):
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=name,
                mode="lines+markers",
                connectgaps=False,
                line={"color": policy_color(k), "dash": policy_dash(k), "width": 2},
                marker={"size": 7},
                hovertemplate=f"{name}<br>{setting}=%{{x}}<br>{metric}=%{{y:.4~g}}<extra></extra>",
            )
        )
    fig.update_layout(
        **base_layout(
            title,
            setting_label(setting),
            y_title,
            showlegend=len(series) > 1,
            legend={"orientation": "h", "y": -0.25},
            height=380 if len(series) > 1 else 320,
            xaxis={
                "type": "linear" if numeric else "category",
                "tickvals": xs if numeric else None,
                "tickformat": "~s" if numeric else None,
            },
            yaxis={"tickformat": ".0%" if unit == "%" else "~s", "rangemode": "tozero"},
        )
    )
    if not any(y is not None for _, ys in series for y in ys):
        fig.add_annotation(
            text="no data", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
    return fig


def _series_for(
    result: SweepResult, rows: Sequence[Mapping[str, Scalar]], setting: str, metric: str
) -> tuple[list[tuple[str, list[float | None]]], str]:
    """One series per combination of the other varied settings (or their mean beyond
    ``MAX_SERIES`` combinations); returns the series and a note for the caption."""
    config = result.config
    values = dict(config.vary)[setting]
    others = [k for k in config.varied if k != setting]
    combos = list(itertools.product(*(dict(config.vary)[k] for k in others)))
    table: dict[tuple[Any, ...], dict[Any, float | None]] = {}
    for p, row in zip(result.points, rows, strict=True):
        key = tuple(_scalar(p[k]) for k in others)
        table.setdefault(key, {})[_scalar(p[setting])] = _metric_value(row, metric)

    def ys_of(key: tuple[Any, ...]) -> list[float | None]:
        return [table.get(key, {}).get(_scalar(v)) for v in values]

    if len(combos) <= MAX_SERIES:
        series = []
        for combo in combos:
            key = tuple(_scalar(c) for c in combo)
            label = ", ".join(f"{k}={c}" for k, c in zip(others, key, strict=True)) or metric
            series.append((label, ys_of(key)))
        return series, ""
    means: list[float | None] = []
    for j in range(len(values)):
        vals = [y for combo in combos if (y := ys_of(tuple(map(_scalar, combo)))[j]) is not None]
        means.append(sum(vals) / len(vals) if vals else None)
    return [("mean", means)], f"mean over {len(combos)} combinations of {', '.join(others)}"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1240px;padding:0 16px;color:#1d2430}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #e3e7ee;padding-bottom:6px}
table{border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums}
td,th{border:1px solid #e3e7ee;padding:3px 7px;text-align:right}th{background:#f7f9fc}
td.err{color:#b00;text-align:left}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:14px}
figure{margin:0;border:1px solid #e3e7ee;border-radius:8px;padding:6px}
figcaption{font-size:12px;color:#5b6573;padding:2px 6px}
pre{background:#f7f9fc;padding:8px;font-size:12px;overflow:auto}
.sub{color:#5b6573}
p.best{background:#e6f5ec;color:#137a3a;padding:8px 12px;border-radius:8px}
tr.best td{background:#e6f5ec;font-weight:600}
"""

_JS = """
(function () {
  window.addEventListener("error", function (e) {
    document.body.setAttribute("data-errors", String(e.message || e));
  });
  var n = document.querySelectorAll(".js-plotly-plot").length;
  document.body.setAttribute("data-charts", String(n));
  document.body.setAttribute("data-ready", "1");
})();
"""


def render_sweep_report(result: SweepResult, meta: Mapping[str, Any] | None = None) -> str:
    from radixsched.sim.report import figure_html, page

    cfg = result.config
    rows = result.rows()
    shown = [m for m in cfg.metrics if any(_metric_value(r, m) is not None for r in rows)]
    missing = [m for m in cfg.metrics if m not in shown]
    meta = meta or {}
    sub = " · ".join(
        str(x) for x in (f"radixsched {meta['version']}" if meta.get("version") else "",
                         meta.get("created", "")) if x
    )  # fmt: skip
    parts = [
        f"<h1>Sweep: {escape(cfg.name)}</h1>",
        f'<p class="sub">{escape(sub)}</p>' if sub else "",
        f"<p>{len(rows)} runs, {result.num_failed} failed. Varied: "
        + ", ".join(f"<b>{escape(k)}</b> ({len(v)} values)" for k, v in cfg.vary)
        + ".</p>",
    ]
    if missing:
        parts.append(f"<p>No numeric values for: {escape(', '.join(missing))}.</p>")
    best_text = result.best_text()
    if best_text:
        parts.append(f'<p class="best">{escape(best_text[0].upper() + best_text[1:])}.</p>')
    best = result.best_run(rows)
    n = 0
    for setting in cfg.varied:
        parts.append(f"<h2>vs {escape(setting_label(setting))}</h2><div class='charts'>")
        for metric in shown:
            series, note = _series_for(result, rows, setting, metric)
            values = dict(cfg.vary)[setting]
            fig = _chart(f"{metric_label(metric)[0]} vs {setting}", setting, values, metric, series)
            caption = f"{metric} vs {setting}" + (f" ({note})" if note else "")
            n += 1
            parts.append(
                f"<figure>{figure_html(fig, f'chart-{n}')}"
                f"<figcaption>{escape(caption)}</figcaption></figure>"
            )
        parts.append("</div>")
    judged = [cfg.best.metric] if cfg.best is not None and cfg.best.metric not in shown else []
    cols = ["run", *cfg.varied, *shown, *judged, "error"]
    parts.append("<h2>Runs</h2><table><tr>")
    parts.extend(f"<th>{escape(c)}</th>" for c in cols)
    parts.append("</tr>")
    for i, r in enumerate(rows):
        parts.append('<tr class="best">' if i == best else "<tr>")
        for c in cols:
            v = r.get(c)
            text = "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
            cls = ' class="err"' if c == "error" else ""
            parts.append(f"<td{cls}>{escape(text)}</td>")
        parts.append("</tr>")
    parts.append("</table><h2>Config</h2>")
    parts.append(f"<pre>{escape(json.dumps(cfg.to_json(), indent=2, default=str))}</pre>")
    if meta:
        parts.append(f"<pre>{escape(json.dumps(dict(meta), indent=2, default=str))}</pre>")
    return page(f"sweep {cfg.name}", _CSS, parts, _JS)


# ---- CLI -------------------------------------------------------------------------------------


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on a subparsers object (``radixsched sweep``)."""
    from radixsched.cli_common import COMMAND_HELP
    from radixsched.sim.runconfig import RATE_RULE

    p: argparse.ArgumentParser = sub.add_parser(
        "sweep",
        help=COMMAND_HELP["sweep"],
        description="Run the cartesian product of a YAML config's 'vary' lists over its "
        "'base' settings (the keys of simulate's flags and --config), in local processes or "
        "on Ray, and write sweep.csv, sweep.json and a self-contained report.html.",
        epilog="example: examples/sweep.yaml. Arrivals: " + RATE_RULE + ". Exit status: 0 "
        "when every run succeeded, 1 when a run failed (its error is in the outputs), 2 on an "
        "invalid config (nothing is run).",
    )
    add_sweep_args(p)
    p.set_defaults(func=cmd_sweep)
    return p


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="sweep YAML: base settings and a 'vary' mapping")
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run on Ray (ray.init address, e.g. auto or ray://host:10001)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default: sweep-<name>)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="local worker processes (default: CPU count; 1 = in-process; at most the CPU "
        "count is used)",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=MAX_RUNS,
        metavar="N",
        help="refuse a sweep of more runs than this (default: %(default)s)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of another sweep in --out (default: refuse; the results "
        "of the same sweep are always replaced)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")


def _error(message: str) -> int:
    for line in message.splitlines():
        print(f"radixsched sweep: error: {line}", file=sys.stderr)
    return 2


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _previous_sweep(path: Path) -> dict[str, Any] | None:
    """The ``sweep`` section of an earlier ``sweep.json`` (None: unreadable or not one)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    sweep = doc.get("sweep") if isinstance(doc, dict) else None
    return sweep if isinstance(sweep, dict) else None


def check_out_dir(
    out_dir: Path, config: SweepConfig, inputs: Sequence[tuple[str, str]], overwrite: bool
) -> str | None:
    """Why the sweep must not write into ``out_dir`` (nothing is created): not a writable
    folder, one of its output files is an input of the sweep (never overwritten), or it holds
    another sweep's results (replaced only with ``overwrite``; a rerun of the same sweep
    replaces its own)."""
    existing = next((p for p in (out_dir, *out_dir.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out_dir}: {existing} is not a writable folder"
    outputs = [out_dir / name for name in OUTPUT_FILES]
    for what, path in inputs:
        for out in outputs:
            if same_file(out, path):
                return (
                    f"--out {out_dir}: the sweep writes {out}, which is {what} {path}; "
                    "refusing to overwrite an input: choose another folder"
                )
    for out in outputs:
        if out.exists() and (out.is_dir() or not os.access(out, os.W_OK)):
            return f"--out {out_dir}: {out} is {'a folder' if out.is_dir() else 'not writable'}"
    present = [out.name for out in outputs if out.exists()]
    if not present or overwrite:
        return None
    previous = _previous_sweep(out_dir / "sweep.json")
    if previous == json.loads(json.dumps(_json_value(config.to_json()), default=str)):
        return None  # the same sweep again
    if previous is None:
        what = f"files this sweep would replace ({', '.join(present)})"
    elif previous.get("name") == config.name:
        what = f"the results of sweep {config.name!r} run with another config"
    else:
        what = f"the results of another sweep ({previous.get('name')!r})"
    return (
        f"--out {out_dir}: already holds {what}; choose another folder, or pass --overwrite "
        "to replace them"
    )


def cmd_sweep(args: argparse.Namespace) -> int:
    from radixsched.cli_common import run_metadata

    if args.jobs is not None and args.jobs < 1:
        return _error(f"--jobs must be >= 1, got {args.jobs}")
    if args.jobs is not None and args.ray is not None:
        return _error("--jobs sets local worker processes: drop it with --ray (Ray schedules)")
    if args.max_runs < 1:
        return _error(f"--max-runs must be >= 1, got {args.max_runs}")
    if args.ray is not None and not args.ray.strip():
        return _error("--ray: expected a Ray address (e.g. auto or ray://host:10001), got ''")
    try:
        config = SweepConfig.load(args.config)
    except SweepError as e:
        return _error(str(e))
    where = args.config
    if config.num_runs > args.max_runs:
        sizes = " x ".join(f"{k} {len(v)}" for k, v in config.vary)
        return _error(
            f"{where}: vary makes {config.num_runs:,} runs ({sizes}), more than --max-runs "
            f"{args.max_runs:,}; vary fewer values, or raise --max-runs"
        )
    if args.out is None and ("/" in config.name or os.sep in config.name):
        return _error(
            f"{where}: name {config.name!r} cannot name the default output folder "
            "sweep-<name>; give --out DIR"
        )
    labels = list(config.cases)
    try:
        validate_metrics(config.metrics, "metrics")
        if config.best is not None:
            validate_metrics([config.best.metric], "best")
        points = config.points()
        validate_points(points, config.varied, labels)
        validate_traces(points, config.varied, labels)
    except SweepError as e:
        return _error("\n".join(f"{where}: {line}" for line in str(e).splitlines()))
    out_dir = Path(args.out or f"sweep-{config.name}")
    inputs = [("the sweep config", str(args.config)), *input_files(points, labels)]
    problem = check_out_dir(out_dir, config, inputs, args.overwrite)
    if problem:
        return _error(problem)
    executor: SweepExecutor
    if args.ray is not None:
        executor = RayExecutor(args.ray)
        try:
            executor.connect()
        except SweepError as e:
            return _error(str(e))
    else:
        cpus = _usable_cpus()
        jobs = args.jobs or cpus
        if jobs > cpus and len(points) > cpus:
            print(
                f"radixsched sweep: note: --jobs {jobs}: running {cpus} processes at a time, "
                "one per usable CPU",
                file=sys.stderr,
            )
        executor = LocalExecutor(min(jobs, cpus))

    def progress(i: int, o: RunOutcome) -> None:
        if args.quiet:
            return
        shown = _shown(points[i], config.varied)
        status = f"error: {o.error}" if o.error else f"{o.wall_s:.1f}s"
        print(f"run {i + 1}/{len(points)} {shown}: {status}", flush=True)

    meta = run_metadata(getattr(args, "_argv", None))
    result = run_sweep(config, executor=executor, on_result=progress)
    paths = result.write(out_dir, meta)
    best = result.best_text()
    if best:
        print(best)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if result.num_failed:
        print(
            f"radixsched sweep: error: {result.num_failed} of {len(points)} runs failed "
            "(errors above and in the outputs)",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from radixsched.cli_common import Parser

    parser = Parser(prog="radixsched sweep", description=(__doc__ or "").split("\n")[0])
    add_sweep_args(parser)
    return cmd_sweep(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
