"""The HTML report's section on split prefill/decode deployments (``sim.deploy.disagg``): where each
request's time to first token went, stage by stage, and how busy every instance was."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from radixsched.results.charts import base_layout, figure_html, html_table, policy_swatch
from radixsched.results.format import fmt_percent, fmt_seconds, policy_color
from radixsched.results.metrics import PolicyResult

# (key in the result's ``disaggregation`` entry, row label); TTFT and TPOT are the result's own.
STAGE_ROWS: tuple[tuple[str, str], ...] = (
    ("bootstrap_wait_s", "held for decode memory + handshake"),
    ("prefill_queue_wait_s", "prefill queue wait"),
    ("prefill_s", "prefill"),
    ("transfer_s", "KV transfer"),
    ("link_wait_s", "of which waiting for the link"),
    ("decode_queue_wait_s", "decode queue wait"),
)


def _split(results: Sequence[PolicyResult]) -> list[tuple[int, PolicyResult, Mapping[str, Any]]]:
    out: list[tuple[int, PolicyResult, Mapping[str, Any]]] = []
    for i, r in enumerate(results):
        d = r.extra.get("disaggregation")
        if isinstance(d, Mapping):
            out.append((i, r, d))
    return out


def _stage_table(split: Sequence[tuple[int, PolicyResult, Mapping[str, Any]]]) -> str:
    rows = []
    for i, r, d in split:
        stages = [(label, d.get(key, {})) for key, label in STAGE_ROWS]
        stages += [("TTFT", r.ttft_s.to_json()), ("TPOT", r.tpot_s.to_json())]
        for label, st in stages:
            cells = [policy_swatch(i, r.policy), escape(label)]
            cells += [
                escape(fmt_seconds(float(st.get(k, 0.0))))
                for k in ("mean", "p50", "p90", "p99", "max")
            ]
            rows.append(cells)
    headers = ("policy", "stage", "mean", "p50", "p90", "p99", "max")
    return html_table("disagg-stages", headers, rows)


def _instance_table(split: Sequence[tuple[int, PolicyResult, Mapping[str, Any]]]) -> str:
    rows = []
    for i, r, d in split:
        for x in d.get("instances", []):
            cells = (
                policy_swatch(i, r.policy),
                escape(f"{x['role']} {x['index']}"),
                escape(f"{x['gpu']} x tp{x['tp']}"),
                f"{int(x['num_requests']):,}",
                escape(fmt_seconds(float(x["busy_s"]))),
                escape(fmt_percent(float(x["utilisation"]))),
                escape(fmt_percent(float(x["peak_kv_usage"]))),
                escape(fmt_percent(float(x["hit_rate"]))) if x["role"] == "prefill" else "-",
                f"{int(x['retractions']):,}",
            )
            rows.append(cells)
    headers = (
        "policy",
        "instance",
        "GPU",
        "requests",
        "busy",
        "utilisation",
        "peak KV",
        "hit rate",
        "retractions",
    )
    return html_table("disagg-instances", headers, rows)


def _utilisation_figure(split: Sequence[tuple[int, PolicyResult, Mapping[str, Any]]]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, r, d in split:
        xs = [f"{x['role'][0].upper()}{x['index']}" for x in d.get("instances", [])]
        ys = [float(x["utilisation"]) for x in d.get("instances", [])]
        fig.add_trace(
            go.Bar(
                x=xs,
                y=ys,
                name=r.policy,
                meta=i,
                marker={"color": policy_color(i)},
                hovertemplate=f"{escape(r.policy)}<br>%{{x}}: %{{y:.1%}} busy<extra></extra>",
            )
        )
    fig.update_layout(
        **base_layout(
            "Utilisation per instance (P = prefill, D = decode)",
            "instance",
            "busy share of the makespan",
            barmode="group",
            showlegend=len(split) > 1,
            yaxis={"tickformat": ".0%", "rangemode": "tozero"},
        )
    )
    return fig


def disagg_section(results: Sequence[PolicyResult]) -> str:
    """The section (empty when no result comes from a split deployment)."""
    split = _split(results)
    if not split:
        return ""
    d = split[0][2]
    pre, dec, link = d["prefill"], d["decode"], d["link"]
    bw = link.get("bandwidth_gb_s")
    what = (
        f"{d['prefill_instances']} prefill instance(s) of {escape(str(pre['gpu']))} x "
        f"tp{pre['tp']} and {d['decode_instances']} decode instance(s) of "
        f"{escape(str(dec['gpu']))} x tp{dec['tp']}; KV over {escape(str(link['link']))} at "
        f"{'unlimited' if bw is None else f'{bw:g} GB/s'} per GPU, "
        f"{float(link['latency_ms']) * 1e3:g} us per transfer, handshake "
        f"{float(link['bootstrap_ms']) * 1e3:g} us."
    )
    return (
        "<h2>Prefill/decode disaggregation</h2>"
        f'<p class="note">{what} A request waits until its decode instance has memory for its '
        "KV (held), then in its prefill instance's queue, is prefilled, has its KV sent, and "
        "waits for the decode instance's next step, where its first token is delivered: TTFT "
        "is the sum of these stages.</p>"
        + _stage_table(split)
        + f"<figure>{figure_html(_utilisation_figure(split), 'chart-disagg-util')}</figure>"
        + _instance_table(split)
        + '<p class="note">Utilisation: the share of the makespan an instance spent running '
        "batches. Hit rates are those of the prefill instances' radix caches (decode "
        "instances match no prefix).</p>"
    )
