"""Where a ``radixsched simulate`` command's time goes, phase by phase, in fresh processes: the
interpreter's start and the imports, the settings and preflight, the trace's load, the optimal
bound, the event loop, the rest of the run (the deployment's setup, the metrics' summary), the
output, and the process's exit.

Each run is one process, ``python bench/phases_bench.py --child ...``, which wraps the
command's phase functions (``cli.simulate._preflight``, ``_load``, ``_finish``,
``sim.workloads.load.workload_optimal_hit_rate``, ``sim.policy_runs.run_policies``) to note the
wall clock as each starts and ends, then runs ``radixsched simulate`` as ``python -m
radixsched`` does; the loop is the JSON's ``wall_s``. The parent times the process from its
spawn to its exit. Only bench code wraps anything: the package runs as it ships.

``cold``: the prompt cache empty (the trace's prompts built, the bound computed); ``warm``:
a second run mapping what the first stored (as ``bench/simulate_bench.py``'s ``wall s``).

Run: ``.venv/bin/python bench/phases_bench.py [--traces synthetic,3x-shared] [--policies
lpm,fcfs] [--repeat 3] [--json PATH]``; each cell shows the fastest repeat's phases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARKS_ENV = "RADIXSCHED_PHASE_MARKS"
# (module, function): the phases the child notes, each a start and an end mark.
WRAPPED = (
    ("radixsched.cli.simulate", "_preflight"),
    ("radixsched.cli.simulate", "_load"),
    ("radixsched.sim.workloads.load", "workload_optimal_hit_rate"),
    ("radixsched.sim.policy_runs", "run_policies"),
    ("radixsched.cli.simulate", "_finish"),
)
PHASES = ("start", "preflight", "load", "bound", "setup", "loop", "run rest", "output", "exit")


# ---- the child ------------------------------------------------------------------------------------


def _child(argv: list[str]) -> None:
    """Note the marks into ``$RADIXSCHED_PHASE_MARKS`` (a line each, flushed: the command
    leaves by ``os._exit``), then run ``radixsched simulate``."""
    out = open(os.environ[MARKS_ENV], "a", buffering=1)  # noqa: SIM115 (the process's life)

    def mark(name: str) -> None:
        out.write(f"{name} {time.time()!r}\n")

    mark("child")
    import importlib

    from radixsched.cli import main

    for module, name in WRAPPED:
        mod = importlib.import_module(module)
        setattr(mod, name, _noted(getattr(mod, name), name, mark))
    raise SystemExit(main._main(["simulate", *argv], own_process=True))


def _noted(fn: Callable[..., Any], name: str, mark: Callable[[str], None]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name}:start")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{name}:end")

    return call


# ---- the parent -----------------------------------------------------------------------------------


def run_once(kind: str, path: Path, policy: str, tmp: Path, cache: Path) -> dict[str, float]:
    """One process's phases in seconds (``PHASES``) and its ``total``."""
    marks, out = tmp / "marks.txt", tmp / "result.json"
    marks.unlink(missing_ok=True)
    env = dict(os.environ, RADIXSCHED_CACHE_DIR=str(cache), **{MARKS_ENV: str(marks)})
    env.pop("RADIXSCHED_PROMPT_CACHE", None)
    args = ["--workload", f"{kind}:{path}", "--policy", policy, "--json", str(out), "--quiet"]
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"simulate {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    t1 = time.time()
    at = dict(line.split() for line in marks.read_text().splitlines())
    t = {k: float(v) for k, v in at.items()}
    loop = float(json.loads(out.read_text())["results"][0]["wall_s"])
    run = t["run_policies:end"] - t["run_policies:start"]
    return {
        "start": t["_preflight:start"] - t0,
        "preflight": t["_preflight:end"] - t["_preflight:start"],
        "load": t["_load:end"] - t["_load:start"],
        "bound": t["workload_optimal_hit_rate:end"] - t["workload_optimal_hit_rate:start"],
        "setup": (t["run_policies:start"] - t["workload_optimal_hit_rate:end"])
        + (t["workload_optimal_hit_rate:start"] - t["_load:end"])
        + (t["_load:start"] - t["_preflight:end"]),
        "loop": loop,
        "run rest": run - loop,
        "output": t["_finish:end"] - t["run_policies:end"],
        "exit": t1 - t["_finish:end"],
        "total": t1 - t0,
    }


def measure(kind: str, path: Path, policy: str, repeat: int) -> dict[str, dict[str, float]]:
    """The fastest (by total) cold and warm runs of ``repeat`` each."""
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(max(repeat, 1)):
            cache = Path(d) / f"cache{i}"
            cold.append(run_once(kind, path, policy, Path(d), cache))
            warm.append(run_once(kind, path, policy, Path(d), cache))
    return {
        "cold": min(cold, key=lambda r: r["total"]),
        "warm": min(warm, key=lambda r: r["total"]),
    }


def _table(rows: list[tuple[str, str, str, dict[str, float]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="radixsched simulate, phase by phase (s, fastest repeat)")
    for col in ("trace", "policy", "prompts", *PHASES, "total"):
        table.add_column(col, justify="left" if col in ("trace", "policy", "prompts") else "right")
    for trace, policy, how, ph in rows:
        table.add_row(trace, policy, how, *(f"{ph[p]:.3f}" for p in (*PHASES, "total")))
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        _child(argv[1:])
        return 0
    sys.path.insert(0, str(HERE))  # (the parent only: a child imports nothing of the bench)
    from simulate_bench import FULL_TRACE, SAMPLE_TRACE, build_traces

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="synthetic,3x-shared")
    p.add_argument("--policies", default="lpm,fcfs")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--trace", type=Path, default=None, help=f"Mooncake JSONL ({FULL_TRACE})")
    p.add_argument("--json", dest="json_path", type=Path, default=None)
    args = p.parse_args(argv)
    src = args.trace or (FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE)
    if src == SAMPLE_TRACE:
        print(f"note: {FULL_TRACE} is absent; the 200-request sample stands in")
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        traces = build_traces(src, Path(d), lengths_only=False)
        for name in args.traces.split(","):
            kind, path = traces[name]
            for policy in args.policies.split(","):
                got = measure(kind, path, policy, args.repeat)
                rows += [(name, policy, how, got[how]) for how in ("cold", "warm")]
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} before the runs")
    _table(rows)
    if args.json_path is not None:
        cells = [{"trace": t, "policy": p, "prompts": h, **ph} for t, p, h, ph in rows]
        args.json_path.write_text(json.dumps({"load": load, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
