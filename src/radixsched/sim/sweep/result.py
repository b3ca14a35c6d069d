"""A sweep's outputs: one row per point, the best point per metric, the CSV and JSON files, and
the HTML report (one chart per metric against the varied setting, one series per other setting)."""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from radixsched.sim.sweep.config import (
    MAX_SERIES,
    NONDETERMINISTIC_KEYS,
    RunFn,
    Scalar,
    Settings,
    SweepConfig,
    _is_number,
    _metric_value,
    _scalar,
    _shown,
)
from radixsched.sim.sweep.executors import (
    LocalExecutor,
    OnResult,
    RunOutcome,
    SweepExecutor,
    simulate_point,
)


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
                "value": _json_value(rows[best].get(self.config.best.metric)),
                "settings": {
                    k: _json_value(_scalar(self.points[best][k])) for k in self.config.varied
                },
            },
            "rows": [{k: _json_value(v) for k, v in r.items()} for r in rows],
            "timing": [
                {
                    "run": i,
                    "run_wall_s": o.wall_s,
                    **{
                        k: _json_value(v)
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


def _json_value(v: Any) -> Any:
    """``v`` with every non-finite float as JSON can hold it: NaN as null, infinities as
    ``"inf"``/``"-inf"`` (a config may hold ``.inf``: ``request_rate``, ``lpm_max_wait_s``)."""
    if isinstance(v, Mapping):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
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

_STAT_NAMES = ("p50", "p90", "p95", "p99", "mean", "max", "std")

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

    from radixsched.results.charts import base_layout, no_data, policy_dash
    from radixsched.results.format import policy_color

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
    no_data(fig, any(y is not None for _, ys in series for y in ys))
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
    from radixsched.results.charts import figure_html
    from radixsched.results.report import page

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
    if best_text := result.best_text():
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
