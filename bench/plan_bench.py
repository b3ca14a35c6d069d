"""``radixsched plan`` on the Mooncake synthetic trace: a 16-candidate search, whole command.

One fresh process runs ``python -m radixsched plan --workload mooncake:TRACE --gpu h100,h200
--tp 1,2 --dp 1,2 --policy fcfs,lpm --slo-ttft-ms 5000 --slo-tpot-ms 100 --json OUT`` (2 GPUs x
2 TP degrees x 2 replica counts x 2 policies = 16 candidates). Its wall time counts (start,
trace load, every candidate's bisection, table). The plan's table is printed again from its
JSON, and as Markdown for the README.

Run: ``.venv/bin/python bench/plan_bench.py [--trace PATH] [--jobs N] [--num-requests N]``.
Without the trace (``/work/shared/data/mooncake/synthetic_trace.jsonl``, or ``--trace``) it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
SEARCH = ["--gpu", "h100,h200", "--tp", "1,2", "--dp", "1,2", "--policy", "fcfs,lpm"]
SLO = ["--slo-ttft-ms", "5000", "--slo-tpot-ms", "100"]
COLUMNS = ("#", "gpu", "tp", "dp", "policy", "router", "GPUs", "$/h", "max req/s",
           "$/M out tok", "SLO met", "hit rate", "status")  # fmt: skip


def command(trace: Path, out: Path, jobs: int | None, num_requests: int | None) -> list[str]:
    cmd = ["plan", "--workload", f"mooncake:{trace}", *SEARCH, *SLO, "--json", str(out)]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    if num_requests is not None:
        cmd += ["--num-requests", str(num_requests)]
    return cmd


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def rows(doc: dict[str, Any]) -> list[list[str]]:
    tol = doc["tolerance"]
    out = []
    for i, c in enumerate(doc["candidates"], 1):
        rate = c["max_request_rate"]
        cap = "-" if rate is None else f"{rate:.3g} ±{tol:.0%}"
        if c["status"] == "above range":
            cap = f">= {rate:.3g}"
        elif rate is None and c["capacity_upper_bound"] is not None:
            cap = f"< {c['capacity_upper_bound']:.3g}"
        out.append([
            str(i) if rate is not None else "", c["gpu"], str(c["tp"]), str(c["dp"]),
            c["policy"], c["router"] or "-", str(c["gpus"]), f"{c['cost_per_hour']:.2f}", cap,
            _num(c["cost_per_million_output_tokens"], ".3g"),
            _num(c["slo_attainment"], ".1%"), _num(c["hit_rate"], ".1%"), c["status"],
        ])  # fmt: skip
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(doc)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=FULL_TRACE)
    ap.add_argument("--jobs", type=int, default=None, help="plan --jobs (default: its own)")
    ap.add_argument("--num-requests", type=int, default=None, help="first N requests only")
    args = ap.parse_args()
    console = Console(width=150)
    if not args.trace.exists():
        console.print(f"skipped: no Mooncake trace at {args.trace} (give --trace PATH)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = [
            sys.executable,
            "-m",
            "radixsched",
            *command(args.trace, out, args.jobs, args.num_requests),
            "--quiet",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            console.print(proc.stderr[-3000:], markup=False)
            return 1
        doc = json.loads(out.read_text())
    shown = " ".join(
        ["radixsched", *command(Path("TRACE"), Path("plan.json"), args.jobs, args.num_requests)]
    )
    table = Table(title=f"radixsched plan, 16 candidates: {wall:.1f} s (whole command)")
    for name in COLUMNS:
        table.add_column(name)
    for r in rows(doc):
        table.add_row(*r)
    console.print(table)
    best = doc["best"]
    if best is not None:
        console.print(
            f"best: {best['gpu']} tp{best['tp']} dp{best['dp']} {best['policy']}: "
            f"{best['max_request_rate']:.3g} req/s for ${best['cost_per_hour']:.2f}/h",
            markup=False,
        )
    console.print(f"command: {shown}", markup=False)
    console.print(f"wall time: {wall:.1f} s, {doc['simulations']} simulations", markup=False)
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
