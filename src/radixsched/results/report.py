"""A self-contained HTML report of a simulation: a written recommendation, warnings, the
comparison table, interactive charts and the configuration, in one file that opens offline.

Charts are Plotly figures; plotly.js is inlined once into the page (no network, no external
assets), so the report opens anywhere, with hover values and zoom. A legend of buttons above
the charts shows and hides a policy in every chart at once. Every piece of text that reaches
the page outside a chart goes through ``html.escape``; chart data and labels are JSON that
Plotly renders as text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from radixsched.results.charts import (
    base_layout,
    figure_html,
    html_table,
    no_data,
    plotly_js,
    policy_dash,
    policy_swatch,
)
from radixsched.results.columns import best_rows, columns_for
from radixsched.results.disagg_report import disagg_section
from radixsched.results.format import Better, fmt_percent, fmt_seconds, policy_color
from radixsched.results.metrics import PolicyResult
from radixsched.results.recommend import OBJECTIVES, recommend
from radixsched.results.series import REPORT_MAX_POINTS, TimeSeries
from radixsched.results.stats import FloatArray
from radixsched.results.writers import to_jsonable

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Points of a CDF line; ranks are subsampled evenly beyond this.
CDF_MAX_POINTS = 1000

# Tenant rows per policy in the HTML table (the least served first beyond this).
TENANT_ROWS_PER_POLICY = 12


def cdf_points(
    values: npt.ArrayLike, max_points: int = CDF_MAX_POINTS
) -> tuple[FloatArray, FloatArray]:
    """(sorted values, fraction <= value), subsampled evenly by rank; the extremes are kept."""
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = v.size
    if n == 0:
        return v, v
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    return v[idx], (idx + 1) / n


def identical_groups(arrays: Mapping[str, Sequence[FloatArray]]) -> list[list[str]]:
    """Names whose arrays are all equal, in groups of two or more (first-seen order): their
    curves are drawn on top of each other, and the page says so."""
    groups: list[list[str]] = []
    for name, arrs in arrays.items():
        for g in groups:
            other = arrays[g[0]]
            if len(other) == len(arrs) and all(
                a.shape == b.shape and np.array_equal(a, b)
                for a, b in zip(other, arrs, strict=True)
            ):
                g.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def _identical_note(groups: list[list[str]]) -> str:
    if not groups:
        return ""
    text = "; ".join(" = ".join(g) for g in groups)
    return f"Identical curves, drawn on top of each other: {text}."


# ---- Charts --------------------------------------------------------------------------------------


def _trace_style(i: int) -> dict[str, Any]:
    return {"color": policy_color(i), "dash": policy_dash(i), "width": 2}


def ttft_figure(names: Sequence[str], ttft: Mapping[str, npt.ArrayLike]) -> go.Figure:
    """TTFT CDF, on a log axis when the values span more than ~1.5 decades."""
    import plotly.graph_objects as go

    fig = go.Figure()
    cdfs = {n: cdf_points(ttft[n]) for n in names if n in ttft}
    pos = np.concatenate([x[x > 0] for x, _ in cdfs.values()]) if cdfs else np.zeros(0)
    use_log = pos.size > 0 and float(pos.max()) / float(pos.min()) > 30
    for i, n in enumerate(names):
        if n not in cdfs:
            continue
        x, y = cdfs[n]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=n,
                meta=i,
                mode="lines",
                line={**_trace_style(i), "shape": "hv"},
                hovertemplate=f"{escape(n)}<br>TTFT %{{x:.3s}}s<br>%{{y:.1%}} of requests"
                "<extra></extra>",
            )
        )
    fig.update_layout(
        **base_layout(
            "TTFT distribution (CDF over completed requests)",
            "time to first token (s" + (", log scale)" if use_log else ")"),
            "share of requests",
            xaxis={"type": "log" if use_log else "linear", "exponentformat": "SI"},
            yaxis={"tickformat": ".0%", "range": [0, 1.02]},
        )
    )
    no_data(fig, bool(cdfs) and any(x.size for x, _ in cdfs.values()))
    return fig


def time_figure(
    title: str,
    y_title: str,
    names: Sequence[str],
    sampled: Mapping[str, Any],
    field: str,
    *,
    percent: bool = False,
    step: bool = True,
    reference: float | None = None,
    reference_label: str = "",
) -> go.Figure:
    import plotly.graph_objects as go

    fig = go.Figure()
    fmt = ".1%" if percent else ",.0f"
    for i, n in enumerate(names):
        if n not in sampled:
            continue
        s = sampled[n]
        fig.add_trace(
            go.Scatter(
                x=s.t,
                y=getattr(s, field),
                name=n,
                meta=i,
                mode="lines",
                line={**_trace_style(i), "shape": "hv" if step else "linear"},
                hovertemplate=f"{escape(n)}<br>t %{{x:.4s}}s<br>%{{y:{fmt}}}<extra></extra>",
            )
        )
    yaxis: dict[str, Any] = {"rangemode": "tozero"}
    if percent:
        yaxis.update(tickformat=".0%", range=[0, 1.02])
    fig.update_layout(
        **base_layout(
            title, "simulated time (s)", y_title, yaxis=yaxis, xaxis={"exponentformat": "SI"}
        )
    )
    if reference is not None and sampled:
        fig.add_hline(
            y=reference,
            line={"dash": "dash", "color": "#5b6573", "width": 1},
            annotation_text=reference_label,
            annotation_position="top left",
        )
    no_data(fig, any(sampled[n].t.size for n in sampled))
    return fig


def kv_figure(names: Sequence[str], sampled: Mapping[str, Any]) -> go.Figure:
    """KV usage as small multiples (one panel per policy, shared axes): overlaid, many series
    near 100% would be one band."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shown = [n for n in names if n in sampled]
    rows = max(len(shown), 1)
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.04, 0.3 / rows),
        subplot_titles=shown or None,
    )
    for row, n in enumerate(shown, 1):
        i = names.index(n)
        s = sampled[n]
        fig.add_trace(
            go.Scatter(
                x=s.t,
                y=s.kv_usage,
                name=n,
                meta=i,
                mode="lines",
                line={"color": policy_color(i), "width": 1.5, "shape": "hv"},
                fill="tozeroy",
                hovertemplate=f"{escape(n)}<br>t %{{x:.4s}}s<br>KV %{{y:.1%}}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%", nticks=3, row=row, col=1)
    fig.update_layout(
        **base_layout(
            "KV cache usage over time (one panel per policy)",
            "",
            "",
            height=max(220, 90 * rows + 90),
        )
    )
    fig.update_xaxes(title_text="simulated time (s)", exponentformat="SI", row=rows, col=1)
    fig.update_annotations(font_size=11)
    no_data(fig, bool(shown))
    return fig


# ---- Page ----------------------------------------------------------------------------------------

_CSS = """
:root { --fg:#1d2430; --muted:#5b6573; --line:#e3e7ee; --bg:#ffffff; --panel:#f7f9fc;
        --best:#137a3a; --best-bg:#e6f5ec; --warn:#8a4b00; --warn-bg:#fff4e0; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; }
main { max-width:1240px; margin:0 auto; padding:28px 28px 48px; }
h1 { font-size:22px; margin:0 0 4px; }
h2 { font-size:16px; margin:32px 0 10px; padding-bottom:6px; border-bottom:1px solid var(--line); }
h3 { font-size:13px; margin:16px 0 6px; color:var(--muted); text-transform:uppercase;
     letter-spacing:.04em; }
.sub { color:var(--muted); margin:0 0 8px; }
.rec { background:var(--panel); border:1px solid var(--line); border-radius:8px;
       padding:12px 16px; margin-top:16px; }
.rec p { margin:4px 0; }
.rec p:first-child { font-size:16px; font-weight:600; }
.warn { background:var(--warn-bg); color:var(--warn); border:1px solid #f1d3a5;
        border-radius:8px; padding:10px 16px; margin-top:16px; white-space:pre-wrap;
        font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:12.5px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(210px,1fr)); gap:12px;
         margin-top:12px; }
.card { background:var(--panel); border:1px solid var(--line); border-radius:8px; padding:10px 14px; }
.card .k { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.card .v { font-size:17px; font-weight:600; margin-top:2px; }
.card .d { color:var(--muted); font-size:13px; }
.scroll { overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:6px 9px; border-bottom:1px solid var(--line); white-space:nowrap; }
th { text-align:right; font-weight:600; color:var(--muted); font-size:12px; background:var(--panel); }
td { text-align:right; }
th:first-child, td:first-child { text-align:left; }
td.best { color:var(--best); background:var(--best-bg); font-weight:700; }
.swatch { display:inline-block; width:11px; height:11px; border-radius:3px; margin-right:7px;
          vertical-align:-1px; }
.legend { display:flex; flex-wrap:wrap; gap:6px 14px; margin:0 0 10px; position:sticky; top:0;
          background:var(--bg); padding:8px 0; z-index:10; }
.legend button { font:inherit; font-size:13px; background:none; border:1px solid var(--line);
                 border-radius:14px; padding:2px 10px; cursor:pointer; color:var(--fg); }
.legend button.off { opacity:.4; text-decoration:line-through; }
.charts { display:grid; grid-template-columns:repeat(auto-fit,minmax(520px,1fr)); gap:18px; }
figure { margin:0; border:1px solid var(--line); border-radius:8px; padding:6px 8px; }
figure.wide { grid-column:1/-1; }
figcaption { color:var(--muted); font-size:12px; padding:2px 6px 4px; }
dl.kv { display:grid; grid-template-columns:minmax(0,max-content) minmax(8em,1fr); gap:3px 16px; margin:0;
         align-items:baseline; }
dl.kv dt { color:var(--muted); overflow-wrap:anywhere; }
dl.kv dd { margin:0; font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
           font-size:13px; overflow-wrap:anywhere; }
.cfg { columns:340px; column-gap:32px; }
.cfg section { break-inside:avoid; padding-bottom:16px; }
.cfg h3 { margin-top:0; }
.note { color:var(--muted); font-size:12px; margin-top:8px; }
footer { color:var(--muted); font-size:12px; margin-top:36px; }
"""

# Runs on load; it must never throw (tests open the page in headless Chromium and check
# ``data-ready`` and the absence of ``data-errors``). A legend button hides or shows its
# policy (the traces whose ``meta`` is its index) in every chart.
_JS = """
(function () {
  window.addEventListener("error", function (e) {
    document.body.setAttribute("data-errors", String(e.message || e));
  });
  var charts = Array.prototype.slice.call(document.querySelectorAll(".js-plotly-plot"));
  function setVisible(series, visible) {
    charts.forEach(function (div) {
      var idx = [];
      (div.data || []).forEach(function (t, k) { if (String(t.meta) === series) idx.push(k); });
      if (idx.length) Plotly.restyle(div, {visible: visible}, idx);
    });
  }
  document.querySelectorAll(".legend button[data-series]").forEach(function (b) {
    b.addEventListener("click", function () {
      var s = b.getAttribute("data-series");
      var off = !b.classList.contains("off");
      b.classList.toggle("off", off);
      setVisible(s, !off);
    });
  });
  document.body.setAttribute("data-charts", String(charts.length));
  document.body.setAttribute("data-ready", "1");
})();
"""


def _legend(names: Sequence[str]) -> str:
    items = [
        f'<button type="button" data-series="{i}" title="show/hide in every chart">'
        f'<span class="swatch" style="background:{policy_color(i)}"></span>{escape(n)}</button>'
        for i, n in enumerate(names)
    ]
    return f'<div class="legend" id="legend">{"".join(items)}</div>'


def _figure(html: str, caption: str = "", *, wide: bool = False) -> str:
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return f"<figure{' class=wide' if wide else ''}>{html}{cap}</figure>"


def _comparison_table(results: Sequence[PolicyResult]) -> str:
    cols = columns_for(results)
    head = ['<th scope="col">policy</th>']
    for c in cols:
        arrow = {Better.HIGHER: " ↑", Better.LOWER: " ↓", Better.NONE: ""}[c.better]
        head.append(f'<th scope="col" title="{escape(c.hint)}">{escape(c.header + arrow)}</th>')
    best = [best_rows(results, c) for c in cols]
    rows = []
    for i, r in enumerate(results):
        cells = [f"<td>{policy_swatch(i, r.policy)}</td>"]
        for c, b in zip(cols, best, strict=True):
            cls = ' class="best"' if i in b else ""
            empty = r.served_nothing and c.key not in ("failed", "retractions")
            text = "-" if empty else c.fmt(c.get(r))
            cells.append(f'<td data-col="{c.key}"{cls}>{escape(text)}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table id="comparison"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _tenant_table(results: Sequence[PolicyResult]) -> str:
    if not any(r.tenants for r in results):
        return ""
    rows = []
    cut = False
    for i, r in enumerate(results):
        shown = r.tenants
        if len(shown) > TENANT_ROWS_PER_POLICY:
            # Many tenants (say a routing key per session): the least served matter most.
            shown = tuple(sorted(shown, key=lambda t: t.service_share)[:TENANT_ROWS_PER_POLICY])
            cut = True
        for t in shown:
            cells = (
                policy_swatch(i, r.policy),
                escape(t.tenant or "(none)"),
                f"{t.num_requests:,}",
                escape(fmt_percent(t.hit_rate)),
                escape(fmt_seconds(t.ttft_s.p50)),
                escape(fmt_seconds(t.ttft_s.p99)),
                escape(fmt_seconds(t.queue_wait_s.p99)),
                escape(fmt_percent(t.service_share)),
            )
            rows.append(cells)
    headers = (
        "policy",
        "tenant",
        "requests",
        "hit rate",
        "p50 TTFT",
        "p99 TTFT",
        "p99 queue wait",
        "served / demanded",
    )
    return (
        "<h2>Tenants</h2>"
        + html_table("tenants", headers, rows)
        + '<p class="note">Served / demanded: prompt and output tokens a tenant had received by '
        "the fairness horizon (when half the requests had finished) over the tokens its arrived "
        "requests asked for. The fairness column of the comparison is Jain's index over these "
        "shares (1 = all tenants equally served)."
        + (
            f" Policies with more than {TENANT_ROWS_PER_POLICY} tenants show their "
            f"{TENANT_ROWS_PER_POLICY} least served; the JSON output has all of them."
            if cut
            else ""
        )
        + "</p>"
    )


def _recommendation(results: Sequence[PolicyResult]) -> str:
    if not results:
        return '<p class="sub">No results.</p>'
    rec = recommend(results)
    text = "".join(f"<p>{escape(line)}</p>" for line in rec.text)
    cards: list[tuple[str, str, str]] = []
    served = len(results) - len(rec.excluded)
    for obj, pick in zip(OBJECTIVES, (rec.hit_rate, rec.p99_ttft, rec.throughput), strict=True):
        if pick is None or served < 2:
            continue
        if len(pick.tied_with) == served - 1:
            who = "all tie"
        else:
            who = ", ".join((pick.policy, *pick.tied_with))
        cards.append((f"best {obj.name}", who, obj.fmt(pick.value)))
    if rec.pareto and served >= 2:
        cards.append(("Pareto set", ", ".join(rec.pareto), f"{len(rec.pareto)} of {served}"))
    body = "".join(
        f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
        f'<div class="d">{escape(d)}</div></div>'
        for k, v, d in cards
    )
    note = (
        '<p class="note">Pareto set: policies that no other policy matches or beats on hit '
        "rate, p99 TTFT and output throughput at once. The recommendation is the Pareto policy "
        "with the lowest p99 TTFT (the highest SLO attainment when SLO targets are given), "
        "compared with fcfs (SGLang's default) or the first policy.</p>"
    )
    cards_html = f'<div class="cards">{body}</div>' if body else ""
    return f'<div class="rec" id="recommendation">{text}</div>{cards_html}{note}'


def _kv_sections(heading: str, data: Any) -> list[str]:
    """Configuration as definition lists, one ``<section>`` per group: plain values under
    ``heading``, each nested mapping under its own name with dotted keys."""
    plain = to_jsonable(data)
    if not isinstance(plain, dict):
        plain = {"value": plain}
    scalars = [(k, v) for k, v in plain.items() if not isinstance(v, dict)]
    groups = [(heading, scalars)] if scalars else []
    groups += [(k, _flatten(v)) for k, v in plain.items() if isinstance(v, dict)]
    out = []
    for name, items in groups:
        rows = "".join(
            f"<dt>{escape(str(k))}</dt><dd>{escape(_scalar_text(v))}</dd>" for k, v in items
        )
        out.append(f'<section><h3>{escape(name)}</h3><dl class="kv">{rows}</dl></section>')
    return out


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.extend(_flatten(v, key))
        else:
            out.append((key, v))
    return out


def _scalar_text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ", ".join(_scalar_text(x) for x in v) or "[]"
    return str(v)


def page(title: str, css: str, body: Sequence[str], script: str = "") -> str:
    """A complete HTML page with plotly.js inlined in its head."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{css}</style>"
        f'<script type="text/javascript">{plotly_js()}</script></head>'
        f"<body><main>{''.join(body)}</main>"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>\n"
    )


def _subtitle(workload_info: Mapping[str, Any], meta: Mapping[str, Any], n: int) -> str:
    parts = []
    name = workload_info.get("name") if isinstance(workload_info, Mapping) else None
    if name:
        parts.append(f"workload: {name}")
    if workload_info.get("num_requests"):
        parts.append(f"{int(workload_info['num_requests']):,} requests")
    parts.append(f"{n} polic{'y' if n == 1 else 'ies'}")
    if meta.get("version"):
        parts.append(f"radixsched {meta['version']}")
    if meta.get("created"):
        parts.append(str(meta["created"]))
    return " · ".join(parts)


def render_report(
    workload_info: Mapping[str, Any],
    config: Mapping[str, Any],
    results: Sequence[PolicyResult],
    series_by_policy: Mapping[str, TimeSeries],
    ttft_by_policy: Mapping[str, npt.ArrayLike],
    *,
    title: str = "radixsched simulation report",
    warnings: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> str:
    """The report as one HTML string (see ``write_report``). ``warnings`` are printed in a
    box at the top (overload, policies that served nothing); ``meta`` says what was run
    (version, time, command)."""
    meta = meta or {}
    # Colours follow the result order; policies that only have series/TTFT data come after.
    names = [r.policy for r in results]
    for n in [*series_by_policy, *ttft_by_policy]:
        if n not in names:
            names.append(n)
    sampled = {
        n: series_by_policy[n].downsampled(REPORT_MAX_POINTS)
        for n in names
        if n in series_by_policy
    }
    optimal = sorted({r.optimal_hit_rate for r in results})
    same_ttft = identical_groups(
        {
            n: [np.sort(np.asarray(ttft_by_policy[n], dtype=np.float64))]
            for n in names
            if n in ttft_by_policy
        }
    )
    same_series = identical_groups(
        {n: [s.t, s.queue_len, s.kv_usage, s.hit_rate] for n, s in sampled.items()}
    )
    charts = [
        _figure(
            figure_html(ttft_figure(names, ttft_by_policy), "chart-ttft"),
            _identical_note(same_ttft),
        ),
        _figure(
            figure_html(
                time_figure(
                    "Cumulative cache hit rate (token-weighted)",
                    "hit rate",
                    names,
                    sampled,
                    "hit_rate",
                    percent=True,
                    step=False,
                    reference=optimal[0] if len(optimal) == 1 else None,
                    reference_label=f"optimal {fmt_percent(optimal[0])}"
                    if len(optimal) == 1
                    else "",
                ),
                "chart-hit-rate",
            ),
            _identical_note(same_series),
        ),
        _figure(
            figure_html(
                time_figure("Waiting queue", "waiting requests", names, sampled, "queue_len"),
                "chart-queue",
            ),
            _identical_note(same_series),
        ),
        _figure(
            figure_html(kv_figure(names, sampled), "chart-kv"),
            "Share of the KV pool in use (requests and cached prefixes).",
            wide=True,
        ),
    ]
    warn = (
        f'<div class="warn" id="warnings">{escape(chr(10).join(warnings))}</div>'
        if warnings
        else ""
    )
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{escape(_subtitle(workload_info, meta, len(results)))}</p>',
        warn,
        _recommendation(results),
        "<h2>Comparison</h2>",
        _comparison_table(results),
        '<p class="note">Best value per column in green (↑ higher is better, ↓ lower is '
        "better); hover a header for its definition. Latencies are in simulated time; "
        "percentiles interpolate linearly, std is the population standard deviation; "
        "failed = rejected at admission + aborted; a policy that served nothing shows '-'."
        "</p>",
        "<h2>Charts</h2>",
        _legend(names),
        f'<div class="charts">{"".join(charts)}</div>',
        _tenant_table(results),
        disagg_section(results),
        "<h2>Configuration</h2>",
        '<div class="cfg">',
        *(_kv_sections("run", meta) if meta else []),
        *_kv_sections("workload", workload_info),
        *_kv_sections("settings", config),
        "</div>",
        "<footer>Generated by radixsched"
        + (f" {escape(str(meta['version']))}" if meta.get("version") else "")
        + ". Self-contained: plotly.js is inlined, no network access or external files "
        "needed.</footer>",
    ]
    return page(title, _CSS, body, _JS)


def write_report(
    path: str | Path,
    workload_info: Mapping[str, Any],
    config: Mapping[str, Any],
    results: Sequence[PolicyResult],
    series_by_policy: Mapping[str, TimeSeries],
    ttft_by_policy: Mapping[str, npt.ArrayLike],
    *,
    warnings: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write the self-contained HTML report; returns the path written."""
    out = Path(path)
    out.write_text(
        render_report(
            workload_info,
            config,
            results,
            series_by_policy,
            ttft_by_policy,
            warnings=warnings,
            meta=meta,
        ),
        encoding="utf-8",
    )
    return out
