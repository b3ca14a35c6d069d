"""A sweep's HTML report: one chart per metric against the varied setting, one series per
other setting."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from radixsched.sim.sweep.config import MAX_SERIES, Scalar, _is_number, _metric_value, _scalar

if TYPE_CHECKING:
    from radixsched.sim.sweep.result import SweepResult


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

    from radixsched.results.charts import base_layout, policy_dash
    from radixsched.results.table import policy_color

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
