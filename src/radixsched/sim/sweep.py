"""Parameter sweeps: ``radixsched sweep CONFIG.yaml [--ray ADDRESS] [--out DIR] [--jobs N]``.

A sweep config (YAML) holds a ``base`` mapping of settings, a ``vary`` mapping of setting ->
list of values, and optionally ``name`` and ``metrics`` (the metrics plotted in the report,
dotted names of ``PolicyResult.to_json``, default ``hit_rate`` and ``ttft_s.p99``). The sweep
runs the cartesian product of the ``vary`` lists (in the order written, the last key varying
fastest), each point being ``base`` updated with one combination.

Setting names (bare, or prefixed to be explicit):
- ``workload`` (a ``--workload`` spec string), ``request_rate`` (number or ``inf``; absent: as
  ``load_workload``: the trace's timestamps, generated workloads all at t=0), ``num_requests``, ``workload_seed`` (default:
  the scheduler ``seed``); prefix ``workload.``;
- any ``SchedulerConfig`` field (``schedule_policy``, ``page_size``, ...); prefix ``sched.``;
- any ``SimConfig`` field (``dp``, ``router``, ``max_total_tokens``, ``hicache_size``,
  ``enable_hierarchical_cache``, ``model``, ``gpu``, ...); prefix ``sim.``.

Outputs in ``--out``: ``sweep.csv`` (one row per run: run index, the varied settings, every
metric, ``error``), ``sweep.json`` (config, base, rows, per-run wall time) and ``report.html``
(offline, inline SVG: for every varied setting, each plotted metric against that setting's
values, one line per combination of the other varied settings).

Execution: local processes by default (``ProcessPoolExecutor``, ``--jobs``; ``--jobs 1`` runs
in-process), or Ray with ``--ray ADDRESS`` (``ray`` imported only then; one ``ray.remote`` task
per run). Every run is a deterministic simulation, so both give identical rows; the real-time
keys (``wall_s``, ``requests_per_wall_s``) are kept out of the rows for that reason and are
reported per run in the JSON's ``timing`` list instead (with ``run_wall_s``, the
run's own wall time including workload generation). A failing run records its error and the sweep goes on.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import multiprocessing
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from radixsched.config import SchedulerConfig

Scalar = str | int | float | bool | None
Settings = dict[str, Any]
Metrics = dict[str, Scalar]
RunFn = Callable[[Settings], Metrics]

WORKLOAD_KEYS = ("workload", "request_rate", "num_requests", "workload_seed")
# Real-time measurements: they differ between identical runs, so rows leave them out.
NONDETERMINISTIC_KEYS = frozenset({"wall_s", "requests_per_wall_s"})
DEFAULT_METRICS = ("hit_rate", "ttft_s.p99")
# Beyond this many combinations of the other settings, a chart shows their mean instead.
MAX_SERIES = 8


class SweepError(ValueError):
    """An invalid sweep config; the message names the offending key or run."""


# ---- config ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    name: str
    base: Mapping[str, Any]
    vary: tuple[tuple[str, tuple[Any, ...]], ...]
    metrics: tuple[str, ...] = DEFAULT_METRICS

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], default_name: str = "sweep") -> SweepConfig:
        if not isinstance(data, Mapping):
            raise SweepError("a sweep config is a mapping with 'base' and 'vary'")
        unknown = set(data) - {"name", "base", "vary", "metrics"}
        if unknown:
            raise SweepError(f"unknown top-level keys {sorted(unknown)}")
        base = data.get("base") or {}
        vary = data.get("vary") or {}
        if not isinstance(base, Mapping) or not isinstance(vary, Mapping):
            raise SweepError("'base' and 'vary' must be mappings")
        if not vary:
            raise SweepError("'vary' needs at least one setting with a list of values")
        pairs: list[tuple[str, tuple[Any, ...]]] = []
        for key, values in vary.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"vary.{key} must be a non-empty list")
            pairs.append((str(key), tuple(values)))
        metrics = data.get("metrics", list(DEFAULT_METRICS))
        if isinstance(metrics, str):
            metrics = [metrics]
        if not isinstance(metrics, list) or not metrics:
            raise SweepError("'metrics' must be a non-empty list of metric names")
        return cls(
            name=str(data.get("name", default_name)),
            base={str(k): v for k, v in base.items()},
            vary=tuple(pairs),
            metrics=tuple(str(m) for m in metrics),
        )

    @classmethod
    def load(cls, path: str | Path) -> SweepConfig:
        import yaml

        p = Path(path)
        with p.open(encoding="utf-8") as f:
            data = yaml.safe_load(f)
        return cls.from_mapping(data or {}, default_name=p.stem)

    @property
    def varied(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.vary)

    def points(self) -> list[Settings]:
        """The cartesian product, last ``vary`` key fastest."""
        keys = self.varied
        return [
            {**self.base, **dict(zip(keys, combo, strict=True))}
            for combo in itertools.product(*(values for _, values in self.vary))
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base": dict(self.base),
            "vary": {k: list(v) for k, v in self.vary},
            "metrics": list(self.metrics),
        }


# ---- settings -> simulator configs -----------------------------------------------------------


class WorkloadSettings(NamedTuple):
    spec: str | None  # None: the CLI's default workload
    request_rate: float | None
    num_requests: int | None
    seed: int | None


class ResolvedPoint(NamedTuple):
    sched: dict[str, Any]
    sim: dict[str, Any]
    workload: WorkloadSettings


def _field_names(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _parse_rate(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise SweepError(f"request_rate must be a number or 'inf', got {value!r}") from None
    if rate <= 0:
        raise SweepError(f"request_rate must be > 0, got {value!r}")
    return rate


def resolve_settings(settings: Mapping[str, Any]) -> ResolvedPoint:
    """Split one point's settings into SchedulerConfig, SimConfig and workload arguments."""
    from radixsched.sim.simulate import SimConfig

    sched_fields, sim_fields = _field_names(SchedulerConfig), _field_names(SimConfig)
    sched: dict[str, Any] = {}
    sim: dict[str, Any] = {}
    wl: dict[str, Any] = {}
    for key, value in settings.items():
        scope, _, name = key.rpartition(".")
        if scope == "sched" and name in sched_fields:
            sched[name] = value
        elif scope == "sim" and name in sim_fields:
            sim[name] = value
        elif scope == "workload" and name in WORKLOAD_KEYS:
            wl[name] = value
        elif scope:
            raise SweepError(f"unknown setting {key!r}")
        else:
            owners = [
                owner
                for owner, names in (
                    ("sched", sched_fields),
                    ("sim", sim_fields),
                    ("workload", set(WORKLOAD_KEYS)),
                )
                if name in names
            ]
            if not owners:
                raise SweepError(
                    f"unknown setting {key!r}: not a workload key {list(WORKLOAD_KEYS)}, "
                    "SchedulerConfig or SimConfig field"
                )
            if len(owners) > 1:
                raise SweepError(
                    f"ambiguous setting {key!r}: write one of "
                    + ", ".join(f"{o}.{name}" for o in owners)
                )
            {"sched": sched, "sim": sim, "workload": wl}[owners[0]][name] = value
    num = wl.get("num_requests")
    seed = wl.get("workload_seed")
    workload = WorkloadSettings(
        spec=None if wl.get("workload") is None else str(wl["workload"]),
        request_rate=_parse_rate(wl.get("request_rate")),
        num_requests=None if num is None else int(num),
        seed=None if seed is None else int(seed),
    )
    return ResolvedPoint(sched, sim, workload)


def validate_points(points: Sequence[Settings]) -> None:
    """Build every point's configs up front, so a typo fails before any run starts."""
    from radixsched.sim.simulate import SimConfig

    for i, p in enumerate(points):
        try:
            r = resolve_settings(p)
            SchedulerConfig(**r.sched)
            SimConfig(**r.sim)
        except (TypeError, ValueError) as e:
            raise SweepError(f"run {i} {p}: {e}") from e


def simulate_point(settings: Settings) -> Metrics:
    """The default run function: one simulation, its ``PolicyResult`` flattened."""
    from radixsched.cli_common import DEFAULT_WORKLOAD
    from radixsched.sim.simulate import SimConfig, simulate
    from radixsched.sim.table import flatten_result
    from radixsched.sim.workloads import load_workload

    r = resolve_settings(settings)
    sched = SchedulerConfig(**r.sched)
    sim = SimConfig(**r.sim)
    wl = r.workload
    workload = load_workload(
        wl.spec or DEFAULT_WORKLOAD,
        request_rate=wl.request_rate,
        num_requests=wl.num_requests,
        seed=sched.seed if wl.seed is None else wl.seed,
    )
    return flatten_result(simulate(workload, sched, sim).result)


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

    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]:
        import ray

        started = False
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            started = True
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

    def write(self, out_dir: str | Path) -> dict[str, Path]:
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
        doc = {
            "sweep": self.config.to_json(),
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
        with paths["json"].open("w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, allow_nan=False)
            f.write("\n")
        paths["report"].write_text(render_sweep_report(self), encoding="utf-8")
        return paths


def _scalar(v: Any) -> Scalar:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def _json_scalar(v: Scalar) -> Scalar:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def run_sweep(
    config: SweepConfig,
    *,
    run_fn: RunFn = simulate_point,
    executor: SweepExecutor | None = None,
    on_result: OnResult | None = None,
) -> SweepResult:
    """Run every point of ``config`` with ``run_fn`` on ``executor`` (default: in-process)."""
    points = config.points()
    outcomes = (executor or LocalExecutor(1)).map(run_fn, points, on_result)
    if len(outcomes) != len(points):
        raise RuntimeError(f"executor returned {len(outcomes)} outcomes for {len(points)} runs")
    return SweepResult(config, points, outcomes)


# ---- report ----------------------------------------------------------------------------------

_W, _H = 560, 280
_ML, _MR, _MT, _MB = 64, 16, 16, 52


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _metric_value(row: Mapping[str, Scalar], metric: str) -> float | None:
    v = row.get(metric)
    return float(v) if isinstance(v, int | float) and _is_number(v) else None


def _chart(
    title: str,
    x_label: str,
    x_values: Sequence[Any],
    y_label: str,
    series: Sequence[tuple[str, list[float | None]]],
) -> str:
    """A line chart with markers; x is numeric when every value is a number, else categorical
    (evenly spaced, in the order given)."""
    from radixsched.sim.report import fmt_tick, nice_ticks
    from radixsched.sim.table import policy_color

    numeric = all(_is_number(v) for v in x_values) and len(set(x_values)) > 1
    if numeric:
        xs = [float(v) for v in x_values]
        x_lo, x_hi = min(xs), max(xs)
    else:
        xs = [float(i) for i in range(len(x_values))]
        x_lo, x_hi = -0.5, len(x_values) - 0.5
    ys_all = [y for _, ys in series for y in ys if y is not None]
    y_lo = min([0.0, *ys_all])
    y_hi = max(ys_all) if ys_all else 1.0
    if y_hi <= y_lo:
        y_hi = y_lo + (abs(y_lo) or 1.0)
    y_ticks = nice_ticks(y_lo, y_hi)
    if len(y_ticks) > 1 and y_ticks[-1] < y_hi:
        y_ticks.append(y_ticks[-1] + y_ticks[1] - y_ticks[0])
    y_hi = max(y_hi, y_ticks[-1])
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    pad = 0.04 * (x_hi - x_lo) if numeric else 0.0

    def px(x: float) -> float:
        return _ML + (x - x_lo + pad) / (x_hi - x_lo + 2 * pad) * pw

    def py(y: float) -> float:
        return _MT + (1.0 - (y - y_lo) / (y_hi - y_lo)) * ph

    out = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<rect class="plot" x="{_ML}" y="{_MT}" width="{pw}" height="{ph}"/>',
    ]
    for y in y_ticks:
        out.append(
            f'<line class="grid" x1="{_ML}" y1="{py(y):.1f}" x2="{_ML + pw}" y2="{py(y):.1f}"/>'
        )
        out.append(
            f'<text class="tick" x="{_ML - 6}" y="{py(y) + 4:.1f}" text-anchor="end">'
            f"{escape(fmt_tick(y))}</text>"
        )
    # Ticks sit at the swept values themselves.
    for x, v in zip(xs, x_values, strict=True):
        label = fmt_tick(x) if numeric else str(v)
        out.append(
            f'<text class="tick" x="{px(x):.1f}" y="{_MT + ph + 16}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    out.append(
        f'<text class="axis-label" x="{_ML + pw / 2:.0f}" y="{_H - 10}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text class="axis-label" transform="translate(14 {_MT + ph / 2:.0f}) '
        f'rotate(-90)" text-anchor="middle">{escape(y_label)}</text>'
    )
    for k, (name, ys) in enumerate(series):
        color = policy_color(k)
        pts = [(px(x), py(y)) for x, y in zip(xs, ys, strict=True) if y is not None]
        if len(pts) > 1:
            coords = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                f'points="{coords}"><title>{escape(name)}</title></polyline>'
            )
        for a, b in pts:
            out.append(
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{color}">'
                f"<title>{escape(name)}</title></circle>"
            )
    if not ys_all:
        out.append(
            f'<text class="tick" x="{_ML + pw / 2:.0f}" y="{_MT + ph / 2:.0f}" '
            f'text-anchor="middle">no data</text>'
        )
    out.append("</svg>")
    return "".join(out)


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
max-width:1200px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:3px 7px;
text-align:right}th{background:#f4f4f4}td.err{color:#b00;text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts figure{margin:0;width:560px}
figcaption{font-size:12px;color:#555}.legend span{margin-right:12px;font-size:12px;display:inline-block}
svg.chart{width:100%;height:auto}.plot{fill:#fff;stroke:#999}.grid{stroke:#eee}
.tick{font-size:11px;fill:#444}.axis-label{font-size:12px;fill:#222}
pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}
"""


def render_sweep_report(result: SweepResult) -> str:
    from radixsched.sim.table import policy_color

    cfg = result.config
    rows = result.rows()
    shown = [m for m in cfg.metrics if any(_metric_value(r, m) is not None for r in rows)]
    missing = [m for m in cfg.metrics if m not in shown]
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f"<title>sweep {escape(cfg.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Sweep: {escape(cfg.name)}</h1>",
        f"<p>{len(rows)} runs, {result.num_failed} failed. Varied: "
        + ", ".join(f"<b>{escape(k)}</b> ({len(v)})" for k, v in cfg.vary)
        + ".</p>",
    ]
    if missing:
        parts.append(f"<p>No numeric values for: {escape(', '.join(missing))}.</p>")
    for setting in cfg.varied:
        parts.append(f"<h2>vs {escape(setting)}</h2><div class='charts'>")
        for metric in shown:
            series, note = _series_for(result, rows, setting, metric)
            values = dict(cfg.vary)[setting]
            legend = "".join(
                f'<span style="color:{policy_color(k)}">&#9632; {escape(name)}</span>'
                for k, (name, _) in enumerate(series)
            )
            svg = _chart(f"{metric} vs {setting}", setting, values, metric, series)
            caption = f"{escape(metric)} vs {escape(setting)}" + (
                f" ({escape(note)})" if note else ""
            )
            parts.append(
                f"<figure>{svg}<figcaption>{caption}</figcaption>"
                f"<div class='legend'>{legend}</div></figure>"
            )
        parts.append("</div>")
    cols = ["run", *cfg.varied, *shown, "error"]
    parts.append("<h2>Runs</h2><table><tr>")
    parts.extend(f"<th>{escape(c)}</th>" for c in cols)
    parts.append("</tr>")
    for r in rows:
        parts.append("<tr>")
        for c in cols:
            v = r.get(c)
            text = "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
            cls = ' class="err"' if c == "error" else ""
            parts.append(f"<td{cls}>{escape(text)}</td>")
        parts.append("</tr>")
    parts.append("</table><h2>Config</h2>")
    parts.append(f"<pre>{escape(json.dumps(cfg.to_json(), indent=2, default=str))}</pre>")
    parts.append("</body></html>\n")
    return "".join(parts)


# ---- CLI -------------------------------------------------------------------------------------


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on a subparsers object (``radixsched sweep``)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "sweep", help="run a grid of simulations from a YAML config and report the results"
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
    p.add_argument("--out", default=None, help="output folder (default: sweep-<name>)")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="local worker processes (default: CPU count; 1 = in-process)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")


def cmd_sweep(args: argparse.Namespace) -> int:
    import os

    try:
        config = SweepConfig.load(args.config)
        points = config.points()
        validate_points(points)
    except SweepError as e:
        print(f"radixsched sweep: error: {e}")
        return 2
    executor: SweepExecutor
    if args.ray is not None:
        executor = RayExecutor(args.ray)
    else:
        executor = LocalExecutor(max(1, args.jobs or os.cpu_count() or 1))

    def progress(i: int, o: RunOutcome) -> None:
        if args.quiet:
            return
        shown = {k: points[i][k] for k in config.varied}
        status = f"error: {o.error}" if o.error else f"{o.wall_s:.1f}s"
        print(f"run {i + 1}/{len(points)} {shown}: {status}", flush=True)

    result = run_sweep(config, executor=executor, on_result=progress)
    paths = result.write(args.out or f"sweep-{config.name}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 1 if result.num_failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixsched sweep", description=__doc__.split("\n")[0])
    add_sweep_args(parser)
    return cmd_sweep(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
