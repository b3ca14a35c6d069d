"""A self-contained HTML report of a simulation: comparison table, recommendation, charts and
the configuration, in one file that opens offline.

Charts are inline SVG generated here (no plotting library, no network, no external assets); a
few lines of inline vanilla JS let the reader hide and show policies by clicking the legend.
Every piece of text that reaches the page goes through ``html.escape``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.sim.metrics import REPORT_MAX_POINTS, FloatArray, PolicyResult, TimeSeries
from radixsched.sim.table import (
    OBJECTIVES,
    Better,
    best_rows,
    columns_for,
    fmt_percent,
    fmt_seconds,
    policy_color,
    recommend,
    to_jsonable,
)

# Points of a CDF polyline; ranks are subsampled evenly beyond this.
CDF_MAX_POINTS = 1000

# Tenant rows per policy in the HTML table (the least served first beyond this).
TENANT_ROWS_PER_POLICY = 12

# Chart geometry in SVG user units (the SVG scales to its container).
_W, _H = 640, 300
_ML, _MR, _MT, _MB = 62, 18, 14, 46


# ---------------------------------------------------------------------------------------------
# Axes
# ---------------------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, target: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]; with
    ``integer`` the step is at least 1 (counts have no fractional ticks)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(step, 1.0)
    first = math.ceil(lo / step - 1e-9) * step
    ticks: list[float] = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Decades inside [lo, hi]; with fewer than three, 2x and 5x marks are added."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0**k for k in range(a, b + 1) if lo <= 10.0**k <= hi]
    if len(decades) >= 3:
        return decades
    fine = [m * 10.0**k for k in range(a, b + 1) for m in (1, 2, 5)]
    return [v for v in fine if lo <= v <= hi]


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10000 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:,.6g}" if abs(v) >= 1 else f"{v:.3g}"


@dataclass(frozen=True)
class Axis:
    label: str
    lo: float
    hi: float
    log: bool = False
    fmt: Callable[[float], str] = fmt_tick
    integer: bool = False  # ticks at whole numbers only

    def frac(self, v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        if self.log:
            lv = np.log10(np.clip(v, self.lo, self.hi))
            return (lv - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi)
        return nice_ticks(self.lo, self.hi, integer=self.integer)


def _span(lo: float, hi: float) -> tuple[float, float]:
    """A non-empty range: a degenerate one is widened around its value."""
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.1 or 1.0
    return lo - pad if lo > 0 else lo, hi + pad


def _value_axis(
    label: str,
    values: Sequence[FloatArray],
    *,
    fmt: Callable[[float], str] = fmt_tick,
    lo: float | None = None,
    hi: float | None = None,
    extend: bool = True,
    integer: bool = False,
) -> Axis:
    nonempty = [v for v in values if v.size]
    dlo = min(float(v.min()) for v in nonempty) if nonempty else 0.0
    dhi = max(float(v.max()) for v in nonempty) if nonempty else 1.0
    a, b = _span(dlo if lo is None else lo, dhi if hi is None else hi)
    ticks = nice_ticks(a, b, integer=integer)
    # A value axis ends on a tick, so the largest value never grazes the frame between ticks.
    if extend and hi is None and len(ticks) > 1 and ticks[-1] < b:
        b = ticks[-1] + (ticks[1] - ticks[0])
    return Axis(label, a, b, fmt=fmt, integer=integer)


# ---------------------------------------------------------------------------------------------
# SVG line chart
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    series: int  # legend index: lines with the same index toggle together across charts
    label: str
    color: str
    xs: FloatArray
    ys: FloatArray
    dashed: bool = False


def _points(xs: FloatArray, ys: FloatArray, xa: Axis, ya: Axis) -> str:
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    px = _ML + xa.frac(xs) * pw
    py = _MT + (1.0 - ya.frac(ys)) * ph
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(px.tolist(), py.tolist(), strict=True))


def svg_line_chart(chart_id: str, title: str, xa: Axis, ya: Axis, lines: Sequence[Line]) -> str:
    pw, ph = _W - _ML - _MR, _H - _MT - _MB
    out = [
        f'<svg id="{escape(chart_id)}" class="chart" viewBox="0 0 {_W} {_H}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<rect class="plot" x="{_ML}" y="{_MT}" width="{pw}" height="{ph}"/>',
    ]
    for v in xa.ticks():
        x = _ML + float(xa.frac(np.array([v]))[0]) * pw
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{_MT}" x2="{x:.1f}" y2="{_MT + ph}"/>')
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{_MT + ph + 16}" text-anchor="middle">'
            f"{escape(xa.fmt(v))}</text>"
        )
    for v in ya.ticks():
        y = _MT + (1.0 - float(ya.frac(np.array([v]))[0])) * ph
        out.append(f'<line class="grid" x1="{_ML}" y1="{y:.1f}" x2="{_ML + pw}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="tick" x="{_ML - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(ya.fmt(v))}</text>"
        )
    out.append(
        f'<text class="axis-label" x="{_ML + pw / 2:.0f}" y="{_H - 8}" text-anchor="middle">'
        f"{escape(xa.label)}</text>"
    )
    out.append(
        f'<text class="axis-label" transform="translate(14 {_MT + ph / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{escape(ya.label)}</text>'
    )
    drawn = 0
    for ln in lines:
        if ln.xs.size == 0:
            continue
        dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
        out.append(
            f'<polyline class="series" data-series="{ln.series}" fill="none" '
            f'stroke="{escape(ln.color)}"{dash} points="{_points(ln.xs, ln.ys, xa, ya)}">'
            f"<title>{escape(ln.label)}</title></polyline>"
        )
        if ln.dashed:  # reference lines are labelled in place rather than in the legend
            y_end = _MT + (1.0 - float(ya.frac(ln.ys[-1:])[0])) * ph
            out.append(
                f'<text class="ref-label" x="{_ML + pw - 6}" y="{y_end - 6:.1f}" '
                f'text-anchor="end">{escape(ln.label)}</text>'
            )
        drawn += 1
    if drawn == 0:
        out.append(
            f'<text class="empty" x="{_ML + pw / 2:.0f}" y="{_MT + ph / 2:.0f}" '
            f'text-anchor="middle">no data</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _step(xs: FloatArray, ys: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Points of a step function that holds each value until the next sample."""
    if xs.size < 2:
        return xs, ys
    sx = np.repeat(xs, 2)[1:]
    sy = np.repeat(ys, 2)[:-1]
    return sx, sy


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


# ---------------------------------------------------------------------------------------------
# Page
# ---------------------------------------------------------------------------------------------

_CSS = """
:root { --fg:#1d2430; --muted:#5b6573; --line:#e3e7ee; --bg:#ffffff; --panel:#f7f9fc;
        --best:#137a3a; --best-bg:#e6f5ec; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; }
main { max-width:1240px; margin:0 auto; padding:28px 28px 48px; }
h1 { font-size:22px; margin:0 0 4px; }
h2 { font-size:16px; margin:32px 0 10px; padding-bottom:6px; border-bottom:1px solid var(--line); }
h3 { font-size:13px; margin:16px 0 6px; color:var(--muted); text-transform:uppercase;
     letter-spacing:.04em; }
.sub { color:var(--muted); margin:0 0 8px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(210px,1fr)); gap:12px;
         margin-top:16px; }
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
.legend { display:flex; flex-wrap:wrap; gap:6px 14px; margin:0 0 10px; }
.legend button { font:inherit; font-size:13px; background:none; border:1px solid var(--line);
                 border-radius:14px; padding:2px 10px; cursor:pointer; color:var(--fg); }
.legend button.off { opacity:.4; text-decoration:line-through; }
.grid2 { display:grid; grid-template-columns:repeat(auto-fit,minmax(440px,1fr)); gap:18px; }
figure { margin:0; background:var(--bg); border:1px solid var(--line); border-radius:8px;
         padding:12px 14px 8px; }
figcaption { font-weight:600; margin-bottom:2px; }
figcaption span { font-weight:400; color:var(--muted); font-size:12px; margin-left:6px; }
svg.chart { width:100%; max-width:820px; height:auto; display:block; margin:0 auto; }
svg .plot { fill:#fff; stroke:#c9d0da; }
svg .grid { stroke:#eef1f5; }
svg .tick { font-size:11px; fill:var(--muted); }
svg .axis-label { font-size:12px; fill:var(--fg); }
svg .empty { font-size:14px; fill:var(--muted); }
svg .ref-label { font-size:11px; fill:#5b6573; }
svg .series { stroke-width:1.8; stroke-linejoin:round; }
svg .hidden { display:none; }
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
# ``data-ready`` and the absence of ``data-errors``).
_JS = """
(function () {
  window.addEventListener("error", function (e) {
    document.body.setAttribute("data-errors", String(e.message || e));
  });
  var buttons = document.querySelectorAll(".legend button[data-series]");
  buttons.forEach(function (b) {
    b.addEventListener("click", function () {
      var s = b.getAttribute("data-series");
      var off = !b.classList.contains("off");
      document.querySelectorAll('.legend button[data-series="' + s + '"]').forEach(function (x) {
        x.classList.toggle("off", off);
      });
      document.querySelectorAll('svg [data-series="' + s + '"]').forEach(function (el) {
        el.classList.toggle("hidden", off);
      });
    });
  });
  document.body.setAttribute("data-ready", "1");
})();
"""


def _legend(names: Sequence[tuple[int, str, str]]) -> str:
    items = [
        f'<button type="button" data-series="{i}" title="show/hide">'
        f'<span class="swatch" style="background:{escape(color)}"></span>{escape(name)}</button>'
        for i, name, color in names
    ]
    return f'<div class="legend">{"".join(items)}</div>'


def _figure(caption: str, note: str, legend: str, svg: str) -> str:
    return (
        f"<figure><figcaption>{escape(caption)}<span>{escape(note)}</span></figcaption>"
        f"{legend}{svg}</figure>"
    )


def _comparison_table(results: Sequence[PolicyResult]) -> str:
    cols = columns_for(results)
    head = ['<th scope="col">policy</th>']
    for c in cols:
        arrow = {Better.HIGHER: " ↑", Better.LOWER: " ↓", Better.NONE: ""}[c.better]
        head.append(f'<th scope="col" title="{escape(c.hint)}">{escape(c.header + arrow)}</th>')
    best = [best_rows(results, c) for c in cols]
    rows = []
    for i, r in enumerate(results):
        cells = [
            f'<td><span class="swatch" style="background:{policy_color(i)}"></span>'
            f"{escape(r.policy)}</td>"
        ]
        for c, b in zip(cols, best, strict=True):
            cls = ' class="best"' if i in b else ""
            cells.append(f'<td data-col="{c.key}"{cls}>{escape(c.fmt(c.get(r)))}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table id="comparison"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _tenant_table(results: Sequence[PolicyResult]) -> str:
    if not any(r.tenants for r in results):
        return ""
    head = "".join(
        f'<th scope="col">{escape(h)}</th>'
        for h in (
            "policy",
            "tenant",
            "requests",
            "hit rate",
            "p50 TTFT",
            "p99 TTFT",
            "p99 queue wait",
            "served / demanded",
        )
    )
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
                f'<span class="swatch" style="background:{policy_color(i)}"></span>'
                f"{escape(r.policy)}",
                escape(t.tenant or "(none)"),
                f"{t.num_requests:,}",
                escape(fmt_percent(t.hit_rate)),
                escape(fmt_seconds(t.ttft_s.p50)),
                escape(fmt_seconds(t.ttft_s.p99)),
                escape(fmt_seconds(t.queue_wait_s.p99)),
                escape(fmt_percent(t.service_share)),
            )
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        "<h2>Tenants</h2>"
        '<div class="scroll"><table id="tenants"><thead><tr>'
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        '<p class="note">Served / demanded: prompt and output tokens a tenant had received by '
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


def _recommendation_cards(results: Sequence[PolicyResult]) -> str:
    rec = recommend(results)
    if not results:
        return '<p class="sub">No results.</p>'
    cards: list[tuple[str, str, str]] = []
    for obj, pick in zip(OBJECTIVES, (rec.hit_rate, rec.p99_ttft, rec.throughput), strict=True):
        if pick is None:
            continue
        if len(pick.tied_with) == len(results) - 1 and len(results) > 1:
            who = "all tie"
        else:
            who = ", ".join((pick.policy, *pick.tied_with))
        cards.append((f"best {obj.name}", who, obj.fmt(pick.value)))
    cards.append(("Pareto set", ", ".join(rec.pareto), f"{len(rec.pareto)} of {len(results)}"))
    body = "".join(
        f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
        f'<div class="d">{escape(d)}</div></div>'
        for k, v, d in cards
    )
    return (
        f'<div class="cards" id="recommendation">{body}</div>'
        '<p class="note">Pareto set: policies that no other policy matches or beats on hit rate, '
        "p99 TTFT and output throughput at once.</p>"
    )


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


def render_report(
    workload_info: Mapping[str, Any],
    config: Mapping[str, Any],
    results: Sequence[PolicyResult],
    series_by_policy: Mapping[str, TimeSeries],
    ttft_by_policy: Mapping[str, npt.ArrayLike],
    *,
    title: str = "radixsched simulation report",
) -> str:
    """The report as one HTML string (see ``write_report``)."""
    # Colours follow the result order; policies that only have series/TTFT data come after.
    names = [r.policy for r in results]
    for n in [*series_by_policy, *ttft_by_policy]:
        if n not in names:
            names.append(n)
    legend_items = [(i, n, policy_color(i)) for i, n in enumerate(names)]

    # TTFT CDF, on a log axis when the values span more than ~1.5 decades (a TTFT of 0, which
    # a log axis cannot show, is pinned to its left edge by Axis.frac's clip).
    cdfs = {n: cdf_points(ttft_by_policy[n]) for n in names if n in ttft_by_policy}
    xs_all = [x for x, _ in cdfs.values() if x.size]
    pos = np.concatenate(xs_all) if xs_all else np.zeros(0)
    pos = pos[pos > 0]
    use_log = pos.size > 0 and float(pos.max()) / float(pos.min()) > 30
    if use_log:
        ttft_x = Axis(
            "TTFT (s, log scale)", float(pos.min()) / 1.2, float(pos.max()) * 1.2, log=True
        )
    else:
        ttft_x = _value_axis("TTFT (s)", xs_all, lo=0.0)
    pct = Axis("fraction of requests", 0.0, 1.0, fmt=lambda v: f"{100 * v:.0f}%")
    ttft_lines = [
        Line(i, n, policy_color(i), *_step(*cdfs[n])) for i, n in enumerate(names) if n in cdfs
    ]
    ttft_svg = svg_line_chart("chart-ttft", "TTFT CDF", ttft_x, pct, ttft_lines)

    sampled = {
        n: series_by_policy[n].downsampled(REPORT_MAX_POINTS)
        for n in names
        if n in series_by_policy
    }
    t_axis = _value_axis(
        "time (s, simulated)", [s.t for s in sampled.values()], lo=0.0, extend=False
    )
    hit_lines = [
        Line(i, n, policy_color(i), sampled[n].t, sampled[n].hit_rate)
        for i, n in enumerate(names)
        if n in sampled
    ]
    optimal = sorted({r.optimal_hit_rate for r in results})
    if len(optimal) == 1 and t_axis.hi > t_axis.lo and sampled:
        hit_lines.append(
            Line(
                -1,
                f"optimal {fmt_percent(optimal[0])}",
                "#5b6573",
                np.array([t_axis.lo, t_axis.hi]),
                np.array([optimal[0], optimal[0]]),
                dashed=True,
            )
        )
    hit_svg = svg_line_chart(
        "chart-hit-rate",
        "Cumulative hit rate over time",
        t_axis,
        Axis("cumulative hit rate", 0.0, 1.0, fmt=lambda v: f"{100 * v:.0f}%"),
        hit_lines,
    )

    def step_lines(field: str) -> list[Line]:
        """One staircase line per sampled policy of the series ``field``."""
        return [
            Line(i, n, policy_color(i), *_step(sampled[n].t, getattr(sampled[n], field)))
            for i, n in enumerate(names)
            if n in sampled
        ]

    queue_lines = step_lines("queue_len")
    queue_svg = svg_line_chart(
        "chart-queue",
        "Waiting queue length over time",
        t_axis,
        _value_axis("waiting requests", [ln.ys for ln in queue_lines], lo=0.0, integer=True),
        queue_lines,
    )
    kv_lines = step_lines("kv_usage")
    kv_svg = svg_line_chart(
        "chart-kv",
        "KV cache usage over time",
        t_axis,
        Axis("KV pool in use", 0.0, 1.0, fmt=lambda v: f"{100 * v:.0f}%"),
        kv_lines,
    )

    legend = _legend(legend_items)
    workload_name = str(workload_info.get("name", "")) if isinstance(workload_info, Mapping) else ""
    subtitle = " · ".join(
        x
        for x in (
            f"workload: {workload_name}" if workload_name else "",
            f"{len(results)} polic{'y' if len(results) == 1 else 'ies'}",
        )
        if x
    )
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{escape(subtitle)}</p>',
        _recommendation_cards(results),
        "<h2>Comparison</h2>",
        _comparison_table(results),
        '<p class="note">Best value per column in green (↑ higher is better, ↓ lower is '
        "better); hover a header for its definition. Latencies are in simulated time.</p>",
        "<h2>Charts</h2>",
        '<div class="grid2">',
        _figure("TTFT distribution", "CDF over completed requests", legend, ttft_svg),
        _figure("Cache hit rate", "cumulative, token-weighted", legend, hit_svg),
        _figure("Waiting queue", "requests waiting to be scheduled", legend, queue_svg),
        _figure("KV cache usage", "fraction of the KV pool in use", legend, kv_svg),
        "</div>",
        _tenant_table(results),
        "<h2>Configuration</h2>",
        '<div class="cfg">',
        *_kv_sections("workload", workload_info),
        *_kv_sections("run", config),
        "</div>",
        "<footer>Generated by radixsched. Self-contained: no network access or external "
        "files needed.</footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(body)}</main><script>{_JS}</script></body></html>\n"
    )


def write_report(
    path: str | Path,
    workload_info: Mapping[str, Any],
    config: Mapping[str, Any],
    results: Sequence[PolicyResult],
    series_by_policy: Mapping[str, TimeSeries],
    ttft_by_policy: Mapping[str, npt.ArrayLike],
) -> Path:
    """Write the self-contained HTML report; returns the path written."""
    out = Path(path)
    out.write_text(
        render_report(workload_info, config, results, series_by_policy, ttft_by_policy),
        encoding="utf-8",
    )
    return out
