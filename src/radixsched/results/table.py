"""The comparison table of policy results as the terminal shows it: columns that fit the width,
a legend line, the runtime line."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from radixsched.results.columns import (
    DISAGG_COLUMNS,
    Column,
    _cell_widths,
    _policy_width,
    best_rows,
    columns_for,
    terminal_columns,
)
from radixsched.results.format import Better, fmt_percent, policy_color
from radixsched.results.metrics import PolicyResult
from radixsched.results.recommend import Recommendation, recommend

if TYPE_CHECKING:
    from rich.console import Console


# ---- Rendering and files -------------------------------------------------------------------------


def _arrow(better: Better) -> str:
    return {Better.HIGHER: " ↑", Better.LOWER: " ↓", Better.NONE: ""}[better]


def _header(c: Column) -> str:
    """A column's header in the HTML report (the terminal's directions are in its legend)."""
    return c.header + _arrow(c.better)


def legend_line(cols: Sequence[Column], results: Sequence[PolicyResult]) -> str:
    """What the table's columns mean, in one line."""
    keys = {c.key for c in cols}
    higher = [c.header for c in cols if c.better is Better.HIGHER]
    parts = [f"higher is better for {', '.join(higher)}, lower for the rest; best in green"]
    if "hit_rate" in keys and results:
        opt = results[0].optimal_hit_rate
        best = "not computed" if math.isnan(opt) else fmt_percent(opt)
        parts.append(f"hit rate = cached/prompt tokens (optimal {best})")
    if "tpot_p50" in keys:
        parts.append("TPOT = time per output token after the first")
    if "retractions" in keys:
        parts.append("retract = requests retracted for decode memory")
    if "failed" in keys:
        parts.append("failed = rejected + aborted")
    if "slo_attainment" in keys:
        parts.append("SLO met = share of requests within the SLO")
    if "fairness_jain" in keys:
        parts.append("fair = Jain's index of tenants' service (1 = equal)")
    if keys & {c.key for c in DISAGG_COLUMNS}:
        parts.append(
            "held = waiting for decode memory, P/D queue = waiting on the prefill/decode "
            "instance, xfer = KV transfer, util = busy share of the makespan"
        )
    return "; ".join(parts) + "."


class Runtime(NamedTuple):
    """How long the runs of one command took together, and in how many processes."""

    elapsed_s: float
    processes: int


def runtime_line(results: Sequence[PolicyResult], runtime: Runtime | None = None) -> str:
    """The simulator's own runtime: each run's event loop, and the real time of them all
    (their sum when they ran one after another)."""
    per = ", ".join(f"{r.policy} {r.wall_s:.2f} s" for r in results)
    if runtime is None or runtime.processes <= 1:
        total = sum(r.wall_s for r in results)
        return f"Simulator runtime (real time): {total:.2f} s ({per})"
    return (
        f"Simulator runtime (real time): {runtime.elapsed_s:.2f} s for {len(results)} policies "
        f"in {runtime.processes} processes ({per})"
    )


def render_comparison(
    results: Sequence[PolicyResult], console: Console, *, runtime: Runtime | None = None
) -> Recommendation:
    """Print the comparison as one table that fits the console (the least important columns
    dropped on a narrow one, and named), a legend line, the simulator's own runtime once
    (``runtime``: the runs' real time, when they ran side by side), and the written
    recommendation; returns the recommendation."""
    from rich import box
    from rich.table import Table

    cols = terminal_columns(results, console.width)
    dropped = [c for c in columns_for(results) if c.terminal and c not in cols]
    best = [best_rows(results, c) for c in cols]
    table = Table(
        title="Policy comparison",
        header_style="bold",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("policy", no_wrap=True, min_width=_policy_width(results))
    for c, w in zip(cols, _cell_widths(results, cols), strict=True):
        table.add_column(c.header, justify="right", min_width=w, no_wrap=True)
    for i, r in enumerate(results):
        cells = [f"[bold {policy_color(i)}]{_rich_escape(r.policy)}[/]"]
        for c, b in zip(cols, best, strict=True):
            text = (
                "-"
                if r.served_nothing and c.key not in ("failed", "retractions")
                else c.fmt(c.get(r))
            )
            cells.append(f"[bold green]{text}[/]" if i in b else text)
        table.add_row(*cells)
    # Highlighting only styles the text: on a console that shows no styles (a file, a pipe)
    # it would change nothing, and it is skipped (its patterns are compiled on first use).
    highlight = False if console.color_system is None else None
    console.print(table, highlight=highlight)
    legend = legend_line(cols, results)
    if dropped:
        legend += f" Not shown at this width: {', '.join(c.header for c in dropped)} (see --json)."
    console.print(_rich_escape(legend), style="dim", highlight=highlight)
    if results:
        console.print(
            _rich_escape(runtime_line(results, runtime)), style="dim", highlight=highlight
        )
    rec = recommend(results)
    for line in rec.lines():
        console.print(_rich_escape(line), highlight=highlight)
    return rec


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
