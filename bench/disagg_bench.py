"""Simulator speed of prefill/decode disaggregation against co-located serving on the same GPUs.

Each cell is one fresh process running ``python -m radixsched simulate --workload
mooncake:TRACE --policy P --json OUT`` with a deployment: co-located ``--dp N`` or a split
``--disaggregation --prefill-instances P --decode-instances D`` with ``P + D = N`` (one GPU an
instance). Its wall time counts (start, trace load, simulation, optimal bound, table); the
simulation loop's own time (the JSON's ``wall_s``) is shown beside it. Each cell runs
``--repeat`` times and the fastest counts (noise on a shared machine only adds time); the
ratio is against the co-located run with the same GPU count.

Goal (issue "Prefill/decode disaggregation in the simulator"): a P/D run of the Mooncake
synthetic trace takes at most 2x the co-located run with the same GPU count.

Run: ``.venv/bin/python bench/disagg_bench.py [--gpus 4,8] [--policy fcfs] [--repeat N]
[--json PATH]``. Without the full trace (``/work/shared/data/mooncake/synthetic_trace.jsonl``,
or ``--trace``) the 200-request sample in ``tests/data`` stands in, with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
SAMPLE_TRACE = Path(__file__).resolve().parent.parent / "tests" / "data" / "mooncake_sample.jsonl"
GOAL_RATIO = 2.0


@dataclass
class Cell:
    gpus: int
    deployment: str
    wall_s: float  # the whole command, fastest of the repeats
    slowest_s: float
    sim_s: float  # the simulation loop (the JSON's wall_s)
    ratio: float  # wall_s over the co-located cell's with the same GPU count
    ttft_p99_s: float
    tpot_p50_s: float


def deployments(gpus: int) -> list[tuple[str, list[str]]]:
    """Co-located first, then splits at a quarter, half and three quarters prefill."""
    out = [(f"co-located x{gpus}", ["--dp", str(gpus)])]
    for p in sorted({max(1, gpus // 4), gpus // 2, min(gpus - 1, 3 * gpus // 4)}):
        d = gpus - p
        out.append(
            (
                f"{p}P:{d}D",
                ["--disaggregation", "--prefill-instances", str(p), "--decode-instances", str(d)],
            )
        )
    return out


def run_once(
    trace: Path, policy: str, args: list[str], tmp: Path
) -> tuple[float, dict[str, object]]:
    out = tmp / "result.json"
    cmd = [sys.executable, "-m", "radixsched", "simulate", "--quiet", "--workload",
           f"mooncake:{trace}", "--policy", policy, "--json", str(out), *args]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]!r}")
    return wall, json.loads(out.read_text())["results"][0]


def measure(trace: Path, policy: str, gpus: int, repeat: int, console: Console) -> list[Cell]:
    cells: list[Cell] = []
    base = 0.0
    with tempfile.TemporaryDirectory() as d:
        for label, args in deployments(gpus):
            runs = [run_once(trace, policy, args, Path(d)) for _ in range(max(repeat, 1))]
            walls = [w for w, _ in runs]
            fastest, res = min(runs, key=lambda run: run[0])  # the fastest run's numbers
            base = base or fastest
            ttft, tpot = res.get("ttft_s", {}), res.get("tpot_s", {})
            cell = Cell(
                gpus=gpus,
                deployment=label,
                wall_s=fastest,
                slowest_s=max(walls),
                sim_s=float(res.get("wall_s", 0.0)),  # type: ignore[arg-type]
                ratio=fastest / base,
                ttft_p99_s=float(ttft.get("p99", 0.0)) if isinstance(ttft, dict) else 0.0,
                tpot_p50_s=float(tpot.get("p50", 0.0)) if isinstance(tpot, dict) else 0.0,
            )
            cells.append(cell)
            console.print(f"  {gpus} GPUs {label}: {fastest:.2f} s (slowest {max(walls):.2f})")
    return cells


def table(cells: list[Cell], full: bool) -> Table:
    t = Table(title="radixsched simulate, whole command per deployment (fresh process each)")
    for col in ("GPUs", "deployment", "wall s", "slowest s", "sim s", "vs co-located",
                "p99 TTFT s", "p50 TPOT ms", "verdict"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("deployment", "verdict") else "right")
    for c in cells:
        verdict = "sample" if not full else "base" if c.ratio == 1.0 and "co-located" in c.deployment else (
            "[green]goal[/]" if c.ratio <= GOAL_RATIO else "[red]> 2x[/]"
        )  # fmt: skip
        t.add_row(str(c.gpus), c.deployment, f"{c.wall_s:.2f}", f"{c.slowest_s:.2f}",
                  f"{c.sim_s:.2f}", f"{c.ratio:.2f}x", f"{c.ttft_p99_s:,.2f}",
                  f"{c.tpot_p50_s * 1e3:.2f}", verdict)  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=None, help=f"Mooncake JSONL ({FULL_TRACE})")
    p.add_argument("--gpus", default="4,8", help="GPU counts, comma-separated")
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per cell")
    p.add_argument("--json", dest="json_path", type=Path, default=None)
    args = p.parse_args(argv)
    console = Console(width=max(Console().size.width, 120))
    src = args.trace or FULL_TRACE
    if not src.exists():
        console.print(f"[yellow]note:[/] {src} not found; using the sample {SAMPLE_TRACE}")
        src = SAMPLE_TRACE
    full = src.resolve() == FULL_TRACE.resolve()
    cores, load0 = os.cpu_count() or 1, os.getloadavg()
    console.print(f"machine: {cores} cores, load average {load0[0]:.2f} / {load0[1]:.2f} / "
                  f"{load0[2]:.2f} before the runs; Python {sys.version.split()[0]}")  # fmt: skip
    cells: list[Cell] = []
    for gpus in (int(g) for g in args.gpus.split(",") if g.strip()):
        cells += measure(src, args.policy, gpus, args.repeat, console)
    load1 = os.getloadavg()
    console.print(table(cells, full))
    console.print(f"load average after: {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}")
    if args.json_path is not None:
        doc = {"cores": cores, "load_before": load0, "load_after": load1,
               "cells": [asdict(c) for c in cells]}  # fmt: skip
        args.json_path.write_text(json.dumps(doc, indent=1) + "\n")
    worst = max((c.ratio for c in cells), default=1.0)
    return 0 if worst <= GOAL_RATIO or not full else 1


if __name__ == "__main__":
    sys.exit(main())
