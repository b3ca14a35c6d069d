"""Scaled-trace benchmark: the Mooncake synthetic trace scaled in count and time to 100k or 1M
requests, one ``radixsched simulate`` process per policy: its wall time, its event loop, its
peak memory.

The scaled trace (``write_scaled``): copies of the trace one after another. Copy ``k`` is every
line of the trace with its timestamp shifted by ``k * period`` (``period``: the trace's span
plus its mean gap between arrivals, so arrivals stay as dense across a copy's boundary as
inside it) and its hash ids shifted by ``k * (1 + the trace's largest id)``, so copies share
no block (as the ``3x-shared`` trace of ``bench/simulate_bench.py`` builds its copies, without
the shared first block). The last copy is cut to the count asked for. 1M requests: 251 copies,
about 256,000 s of arrivals at the trace's own 3.91 req/s, 15.3G prompt tokens (61 GB as
int32).

The deployment: ``--gpu b200 --tp 2`` (one replica). At the trace's timestamps the default
(one H200, TP 1) is overloaded (lpm serves 3.09 of 3.91 req/s offered, fcfs 1.82): a 250x
trace would grow its queue without bound and measure queueing, not the simulator. A B200 at TP
2 keeps up with every copy (the synthetic trace: peak queue 10-11 for fcfs and lpm, makespan
1,022 s, the trace's span), on one replica, so no router enters the numbers (``--dp 2`` keeps
up too but routes, and its loop is twice as slow per request).

Each cell is one fresh process, ``python -m radixsched simulate --workload mooncake:TRACE
--policy P --gpu b200 --tp 2 --quiet --json OUT`` with the prompt cache off (the scaled
traces' prompts are over the eager limit, so they are built as requests arrive and dropped as
they finish, ``sim.workloads.deferred``, and the optimal bound is not computed): its wall time,
the event loop's (the JSON's ``wall_s``), the rest (start, trace load, summary), peak RSS
(``os.wait4``) and requests per second of wall time.

Run: ``.venv/bin/python bench/million_bench.py [--requests 100000,1000000] [--policies lpm,fcfs]
[--trace PATH] [--json PATH]``; ``--requests 25000`` for a quick run.

Measured 2026-12-06 09:58-10:11 UTC on the project's CI kind (2 cores, 23 GB), shared: load
average 2.4-5.4 (other sessions' tests); ``--requests 100000 --policies lpm`` (then fcfs)
alternately on simulate of commit 0755dd8 and of main's dab3a53, ``--requests 1000000
--policies lpm`` once on 0755dd8 (the same results JSON as main's at 100k):

=========  ======  =======  =====  =====  =====  =====  ========  =====  =========
requests   policy  tree     wall   loop   rest   CPU s  peak RSS  hit    peak queue
=========  ======  =======  =====  =====  =====  =====  ========  =====  =========
100,000    lpm     main     51.9   43.5   8.4    36.2   963 MB    28.2%  10
100,000    lpm     0755dd8  42.6   35.9   6.7    28.4   928 MB    28.2%  10
100,000    lpm     main     54.0   46.4   7.7    36.1   960 MB    28.2%  10
100,000    lpm     0755dd8  31.6   26.2   5.5    25.0   951 MB    28.2%  10
100,000    fcfs    main     43.6   36.4   7.2    36.7   944 MB    28.2%  11
100,000    fcfs    0755dd8  26.6   22.1   4.5    25.4   932 MB    28.2%  11
1,000,000  lpm     0755dd8  345.8  293.2  52.6   260.8  7,940 MB  28.2%  11
=========  ======  =======  =====  =====  =====  =====  ========  =====  =========

The goal (1M requests in under a minute) is not met: 261 s of CPU for 1M requests (about
0.26 ms a request), four times the goal. The prompts are written natively
(``_native/prompts.cpp``, about 20 us a request) and the garbage collector stays out of the
load and the loop (``sim/heap.py``); what is left is the scheduler's per-step Python (about
three ``step`` calls a request; perf: 56% interpreter, 18% libc copies and malloc, 15% native).
Memory still grows with the trace, at about 8 KB a request: the load's records, drafts and
requests (1.8 KB), the run's copies (1.5 KB; none in a process's last run since the sixth session), each finished request's token times and objects
(3.4 KB with the heap the allocator keeps), and at the end the summary's array of every gap.
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
DEPLOYMENT = ("--gpu", "b200", "--tp", "2")
GOAL_S = 60.0


@dataclass
class Cell:
    requests: int
    policy: str
    wall_s: float  # the whole command
    loop_s: float  # the event loop (the JSON's wall_s)
    cpu_s: float  # user + system CPU time of the process
    peak_rss_mb: float
    completed: int
    hit_rate: float
    makespan_s: float
    peak_queue: int

    @property
    def rest_s(self) -> float:
        """Start, trace load, summary and output: all but the loop."""
        return self.wall_s - self.loop_s


# ---- the scaled trace -----------------------------------------------------------------------------


def write_scaled(src: Path, out: Path, count: int) -> dict[str, int]:
    """Write ``count`` requests of ``src`` scaled in count and time to ``out`` (the module's
    shape); returns the shape: copies, period_ms, id_stride."""
    recs = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    stamps = [int(r["timestamp"]) for r in recs]
    span = max(stamps) - min(stamps)
    period = span + (round(span / (len(recs) - 1)) if len(recs) > 1 else 1)
    stride = 1 + max((max(r["hash_ids"], default=0) for r in recs), default=0)
    written, k = 0, 0
    with out.open("w") as f:
        while written < count:
            for r in recs[: count - written]:
                ids = [h + k * stride for h in r["hash_ids"]]
                f.write(json.dumps({**r, "timestamp": int(r["timestamp"]) + k * period,
                                    "hash_ids": ids}) + "\n")  # fmt: skip
            written += min(len(recs), count - written)
            k += 1
    return {"copies": k, "period_ms": period, "id_stride": stride}


# ---- one cell -------------------------------------------------------------------------------------


def run_cell(trace: Path, count: int, policy: str, tmp: Path) -> Cell:
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "radixsched", "simulate", "--workload", f"mooncake:{trace}",
           "--policy", policy, *DEPLOYMENT, "--quiet", "--json", str(out)]  # fmt: skip
    env = dict(os.environ, RADIXSCHED_PROMPT_CACHE="off")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not out.exists():
        raise RuntimeError(f"{policy} on {count:,} requests: exit {code}\n{err[-2000:]}")
    res = json.loads(out.read_text())["results"][0]
    return Cell(
        requests=int(res["num_requests"]),
        policy=policy,
        wall_s=wall,
        loop_s=float(res["wall_s"]),
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_mb=usage.ru_maxrss / 1024.0,
        completed=int(res["num_completed"]),
        hit_rate=float(res["hit_rate"]),
        makespan_s=float(res["makespan_s"]),
        peak_queue=int(res["peak_queue_len"]),
    )


# ---- table ----------------------------------------------------------------------------------------


def table(cells: list[Cell]) -> Table:
    t = Table(title=f"radixsched simulate on the scaled Mooncake trace ({' '.join(DEPLOYMENT)})")
    cols = ["requests", "policy", "wall s", "loop s", "rest s", "CPU s", "req/s", "peak RSS MB",
            "hit", "makespan s", "peak queue", "verdict"]  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("policy", "verdict") else "right")
    for c in cells:
        verdict = "[green]goal[/]" if c.wall_s <= GOAL_S else "[yellow]> 1 min[/]"
        t.add_row(f"{c.requests:,}", c.policy, f"{c.wall_s:.1f}", f"{c.loop_s:.1f}",
                  f"{c.rest_s:.1f}", f"{c.cpu_s:.1f}", f"{c.requests / c.wall_s:,.0f}",
                  f"{c.peak_rss_mb:,.0f}", f"{c.hit_rate:.1%}", f"{c.makespan_s:,.0f}",
                  f"{c.peak_queue:,}", verdict)  # fmt: skip
    return t


def _counts(text: str) -> list[int]:
    try:
        counts = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--requests: expected comma-separated counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"--requests: counts must be >= 1, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=None, help=f"Mooncake JSONL ({FULL_TRACE})")
    p.add_argument("--requests", default="100000", help="comma-separated counts (e.g. 1e6)")
    p.add_argument("--policies", default="lpm", help="comma-separated policies")
    p.add_argument("--json", dest="json_path", type=Path, default=None)
    args = p.parse_args(argv)
    counts = _counts(args.requests)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    console = Console(width=max(Console().size.width, 120))
    src = args.trace or FULL_TRACE
    if not src.exists():
        console.print(f"[yellow]note:[/] {src} not found; using the sample {SAMPLE_TRACE}")
        src = SAMPLE_TRACE
    load0 = os.getloadavg()
    console.print(f"machine: {os.cpu_count()} cores, load average {load0[0]:.2f} / "
                  f"{load0[1]:.2f} / {load0[2]:.2f}; Python {sys.version.split()[0]}")  # fmt: skip
    cells, shapes = [], {}
    with tempfile.TemporaryDirectory() as d:
        for count in counts:
            trace = Path(d) / f"scaled-{count}.jsonl"
            shapes[count] = write_scaled(src, trace, count)
            console.print(f"  {count:,} requests: {shapes[count]['copies']} copies, every "
                          f"{shapes[count]['period_ms'] / 1e3:,.0f} s")  # fmt: skip
            for policy in policies:
                cell = run_cell(trace, count, policy, Path(d))
                cells.append(cell)
                console.print(f"  {count:,} {policy}: {cell.wall_s:.1f} s (loop "
                              f"{cell.loop_s:.1f} s), {cell.peak_rss_mb:,.0f} MB")  # fmt: skip
            trace.unlink()
    load1 = os.getloadavg()
    console.print(table(cells))
    console.print(f"load average after: {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}")
    if args.json_path is not None:
        doc = {"cores": os.cpu_count(), "load_before": load0, "load_after": load1,
               "deployment": list(DEPLOYMENT), "shapes": shapes,
               "cells": [asdict(c) | {"rest_s": c.rest_s} for c in cells]}  # fmt: skip
        args.json_path.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
