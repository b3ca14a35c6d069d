"""The plan's table and recommendation, as text (rich renders the table)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixsched.sim.plan.result import CandidateResult, best_two, meets, what_separates, why_best


def capacity_text(r: CandidateResult, tolerance: float) -> str:
    """The capacity as the search knows it: within the tolerance, or a bound."""
    cap = r.capacity
    if r.status == "ok" and cap is not None:
        return f"{cap.rate:,.3g} ±{tolerance:.0%}"
    if r.status == "above range" and cap is not None:
        return f">= {cap.rate:,.3g}"
    if cap is not None and cap.upper is not None and r.status != "ok":
        return f"< {cap.upper:,.3g}"
    return "-"


def table_rows(
    ranked: Sequence[CandidateResult], target: float | None, tolerance: float
) -> tuple[list[str], list[list[str]]]:
    """Column names and one row of text per candidate, in ranked order."""
    varied = [k for k, _ in ranked[0].candidate.flags] if ranked else []
    cols = ["#", "gpu", "tp", "dp", "deploy", "policy", "router", *varied, "GPUs", "$/h"]
    cols += ["max req/s", "$/M out tok", "SLO met", "hit rate", "status (note)"]
    rows = []
    for i, r in enumerate(ranked, 1):
        c = r.candidate
        probe = r.probe_at(target) if target is not None else r.at_capacity
        if target is None and not meets(r, target):
            probe = None  # a stopped search's last met rate is not its capacity
        per_m = r.cost_per_million_output_tokens(
            target if target is not None else r.max_request_rate
        )
        rows.append(
            [
                str(i) if meets(r, target) else "",
                c.gpu,
                str(c.tp),
                str(c.dp),
                c.deployment_label,
                c.policy,
                c.router or "-",
                *[str(v) for _, v in c.flags],
                str(r.gpus),
                f"{r.cost_per_hour:,.2f}",
                capacity_text(r, tolerance),
                "-" if per_m is None else f"{per_m:,.3g}",
                "-" if probe is None else f"{probe.attainment:.1%}",
                "-" if probe is None else f"{probe.hit_rate:.1%}",
                r.status + (f" ({i})" if r.reason else ""),
            ]
        )
    return cols, rows


def notes(ranked: Sequence[CandidateResult]) -> list[str]:
    """One line per row with a reason: its row number (in the status column) and why."""
    return [f"({i}) {r.candidate.label}: {r.reason}" for i, r in enumerate(ranked, 1) if r.reason]


def recommendation(ranked: Sequence[CandidateResult], target: float | None) -> list[str]:
    best, runner = best_two(list(ranked), target)
    if best is None:
        want = f"sustains {target:g} req/s" if target is not None else "meets the SLOs"
        return [f"no candidate {want}: widen the search (--dp, --gpu, --tp) or loosen the SLOs"]
    lines = [why_best(best, target)]
    if runner is not None:
        lines += what_separates(best, runner, target)
    return lines


def render(
    console: Any,
    ranked: Sequence[CandidateResult],
    target: float | None,
    tolerance: float,
    title: str,
) -> None:
    from rich.table import Table

    cols, rows = table_rows(ranked, target, tolerance)
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for name in cols:
        right = name in ("#", "tp", "dp", "GPUs", "$/h", "max req/s", "$/M out tok")
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in notes(ranked):
        console.print(line, highlight=False, markup=False)


def calibration_error(path: str) -> str:
    """What a calibration file records of its error: the worst relative error of its
    replayed runs per latency ("" when it records none, or is a step-time table)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    fit = doc.get("fit") if isinstance(doc, dict) else None
    if not isinstance(fit, list) or not fit:
        return f"calibration {path} records no replay error"
    worst: dict[str, float] = {}
    for run in fit:
        for metric in ("ttft_s", "itl_s", "e2e_s"):
            errors = (run.get(metric) or {}).get("error") or {}
            for value in errors.values():
                if isinstance(value, int | float):
                    worst[metric] = max(worst.get(metric, 0.0), abs(float(value)))
    parts = [f"{m[:-2].upper()} {v:.0%}" for m, v in worst.items()]
    return f"calibration {path}: worst replayed error over {len(fit)} run(s): " + (
        ", ".join(parts) or "none recorded"
    )
