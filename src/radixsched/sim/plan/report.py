"""The plan's HTML report: capacity against cost per hour (one point per candidate whose
capacity was found) and the SLO-relevant latency against the request rate (every probe of
each ranked candidate), with the ranked table; the report module's page and charts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from radixsched.results.charts import base_layout, figure_html, policy_dash
from radixsched.sim.plan.result import CandidateResult, meets
from radixsched.sim.plan.search import PlanSpec
from radixsched.sim.plan.table import recommendation, table_rows

# Candidates drawn in the latency chart (the best ranked; the rest would be a tangle).
LATENCY_LINES = 8


def _capacity_figure(ranked: Sequence[CandidateResult], target: float | None) -> Any:
    import plotly.graph_objects as go

    ok = [r for r in ranked if r.max_request_rate is not None]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[r.cost_per_hour for r in ok],
            y=[r.max_request_rate for r in ok],
            mode="markers",
            text=[r.candidate.label for r in ok],
            marker={"size": 10, "color": ["#2a9d8f" if meets(r, target) else "#999" for r in ok]},
            hovertemplate="%{text}<br>$%{x:.2f}/h<br>%{y:.3g} req/s<extra></extra>",
        )
    )
    if target is not None:
        fig.add_hline(y=target, line_dash="dot", annotation_text=f"target {target:g} req/s")
    fig.update_layout(
        **base_layout("Capacity against cost", "cost ($ per hour)", "capacity (req/s)")
    )
    return fig


def _latency_figure(ranked: Sequence[CandidateResult], spec: PlanSpec) -> Any:
    import plotly.graph_objects as go

    slo = spec.slo
    field, name, limit = (
        ("ttft_p99_s", "TTFT p99", slo.ttft_s)
        if slo.ttft_s is not None
        else ("tpot_p50_s", "TPOT p50", slo.tpot_s)
    )
    fig = go.Figure()
    drawn = [r for r in ranked if r.capacity is not None and r.capacity.probes]
    for i, r in enumerate(drawn[:LATENCY_LINES]):
        probes = sorted(r.capacity.probes, key=lambda p: p.rate)  # type: ignore[union-attr]
        fig.add_trace(
            go.Scatter(
                x=[p.rate for p in probes],
                y=[getattr(p, field) * 1e3 for p in probes],
                mode="lines+markers",
                name=r.candidate.label,
                line={"dash": policy_dash(i)},
            )
        )
    if limit is not None:
        fig.add_hline(y=limit * 1e3, line_dash="dot", annotation_text=f"SLO {limit * 1e3:g} ms")
    fig.update_layout(
        **base_layout(
            f"{name} against request rate",
            "request rate (req/s)",
            f"{name} (ms)",
            showlegend=True,
            yaxis={"type": "log", "title": {"text": f"{name} (ms)"}},
        )
    )
    return fig


def render_plan_report(
    ranked: Sequence[CandidateResult], spec: PlanSpec, meta: Mapping[str, Any]
) -> str:
    from radixsched.results.report import _CSS, page

    cols, rows = table_rows(ranked, spec.target_rate, spec.tolerance)
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body_rows = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    lines = "".join(f"<p>{escape(x)}</p>" for x in recommendation(ranked, spec.target_rate))
    goal = (
        f"the fewest GPUs sustaining {spec.target_rate:g} req/s"
        if spec.target_rate is not None
        else "capacity per dollar"
    )
    body = [
        "<h1>radixsched plan</h1>",
        f"<p>{escape(spec.workload)}; SLO {escape(spec.slo.describe())}; {escape(goal)}; "
        f"capacity by bisection within ±{spec.tolerance:.0%}; radixsched "
        f"{escape(str(meta.get('version', '')))}</p>",
        lines,
        figure_html(_capacity_figure(ranked, spec.target_rate), "capacity-cost"),
        figure_html(_latency_figure(ranked, spec), "latency-rate"),
        f"<table><thead><tr>{head}</tr></thead><tbody>{body_rows}</tbody></table>",
    ]
    return page("radixsched plan", _CSS, body)


def write_plan_report(
    path: str, ranked: Sequence[CandidateResult], spec: PlanSpec, meta: Mapping[str, Any]
) -> Path:
    out = Path(path)
    out.write_text(render_plan_report(ranked, spec, meta), encoding="utf-8")
    return out
