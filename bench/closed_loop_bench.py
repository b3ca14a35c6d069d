"""Closed-loop clients over several replicas: simulator speed, whole command and event loop.

``--max-concurrency C`` clients over ``--dp N`` replicas: a request finishing on one replica
sends the next, which the router may send to another, so replicas cannot run far ahead of
each other the way one replica runs ahead to its next arrival. Each case times:

- **command**: ``python -m radixsched simulate --workload W --policy lpm --dp N
  --max-concurrency C --quiet --json OUT`` in a fresh process (start, load, simulation,
  optimal bound, table), the fastest of ``--repeat``;
- **accelerated** / **reference**: ``simulate()`` in this process with the accelerators
  (``radixsched.native``) and with the reference core, the fastest of ``--repeat``; the two
  must give the same per-request results (checked here: token times and hit rate).

``--baseline SRC`` (another source tree's ``src``, e.g. a worktree of an earlier commit) adds
that tree's command time, run by run beside this one, so both see the same load.

Run: ``.venv/bin/python bench/closed_loop_bench.py [--repeat 2] [--baseline SRC]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from radixsched.config import SchedulerConfig
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload


class Case(NamedTuple):
    workload: str
    dp: int
    clients: int


CASES = (
    Case("shared-prefix", 2, 16),
    Case("shared-prefix", 4, 32),
    Case("multi-turn", 2, 16),
    Case("tree-of-thought", 2, 8),
)


def command_s(case: Case, src: str | None) -> float:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "radixsched", "simulate", "--workload", case.workload]
        argv += ["--policy", "lpm", "--dp", str(case.dp), "--max-concurrency", str(case.clients)]
        argv += ["--quiet", "--json", os.path.join(tmp, "out.json")]
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def in_process(case: Case, accelerate: bool) -> tuple[float, SimRun]:
    wl = load_workload(case.workload)
    sim = SimConfig(dp=case.dp, max_concurrency=case.clients)
    start = time.perf_counter()
    run = simulate(wl, SchedulerConfig(schedule_policy="lpm"), sim, accelerate=accelerate)
    return time.perf_counter() - start, run


def _same(a: SimRun, b: SimRun) -> bool:
    def times(run: SimRun) -> list[list[float]]:
        return [list(r.times.token_times) for r in sorted(run.requests, key=lambda r: r.rid)]

    return a.result.hit_rate == b.result.hit_rate and times(a) == times(b)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--baseline", default=None, metavar="SRC")
    args = p.parse_args()
    table = Table(title="closed-loop clients over replicas (lpm), seconds, fastest run")
    for col in ("workload", "dp x clients", "command", "accelerated", "reference", "same"):
        table.add_column(col)
    if args.baseline:
        table.add_column("baseline command")
    for case in CASES:
        cmd, base = [], []
        for _ in range(args.repeat):
            cmd.append(command_s(case, None))
            if args.baseline:
                base.append(command_s(case, args.baseline))
        fast = [in_process(case, True) for _ in range(args.repeat)]
        ref = [in_process(case, False) for _ in range(args.repeat)]
        row = [case.workload, f"{case.dp} x {case.clients}", f"{min(cmd):.2f}"]
        row += [f"{min(t for t, _ in fast):.2f}", f"{min(t for t, _ in ref):.2f}"]
        row.append("yes" if _same(fast[0][1], ref[0][1]) else "NO")
        if args.baseline:
            row.append(f"{min(base):.2f}")
        table.add_row(*row)
    Console().print(table)
    load = os.getloadavg()[0]
    Console().print(
        f"load average {load:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
