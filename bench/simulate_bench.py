"""Simulator speed benchmark: the whole ``radixsched simulate`` command, per policy, per trace.

Each cell is one fresh process running ``python -m radixsched simulate --workload mooncake:TRACE
--policy P --json OUT`` (start, trace load, the simulation, the optimal bound, the table): its
wall time, its CPU time (user + system) and its peak RSS (``os.wait4``), with the package's
bytecode written first, as an installed package has it. Traces, all built here from the
Mooncake synthetic trace (3,993 requests, 61.2M prompt tokens, arrivals at the trace's timestamps):

- ``synthetic``: the trace itself (2,211 distinct first blocks);
- ``shared-first-block``: every request starts with one new shared 512-token block (a system
  prompt), ``input_length + 512``: every request lives in one cache subtree;
- ``3x-shared``: three copies one after another (20 minutes apart: about an hour), each with
  its own hash ids, all behind the one shared first block (11,979 requests);
- ``lengths-only`` (``--lengths-only``): the trace as ``jsonl:`` lengths only, sharing nothing
  (the shape Vidur replays), to compare rates with it.

Goals (issue "One readable scheduling core"): synthetic and shared-first-block at most 1.5 s
per policy, the 3x trace at most 4 s and under 1 GB peak RSS; over 10 s is a defect.

Each repeat runs the command twice with a new, empty prompt cache (``sim.workloads.prompt_cache``): the
first run builds the trace's prompts and stores them (``first s``), the second maps them
(``wall s``, ``CPU s``, ``sim s``), as a user's second run of a trace does. The verdict is
"goal" when the first run meets it, "goal (cached)" when only the later runs do. Each cell
runs ``--repeat`` times; the fastest counts (noise on a shared machine only adds time) and the
slowest is shown beside it. The machine's load is printed with the numbers.

``--together`` also times one command with every selected policy on each trace, ``--jobs 1``
(one after another) against the default (side by side in forked workers, one per CPU). Its
first ``--jobs 1`` run stores the trace's prompts and every later run maps them: with
``--repeat 2`` or more, the fastest of each kind is a run with the prompts mapped.

Run: ``.venv/bin/python bench/simulate_bench.py [--traces synthetic,shared-first-block,3x-shared]
[--policies P,P|all] [--repeat N] [--lengths-only] [--together] [--compat sglang] [--json PATH]``
(``--compat``: every cell's runs, both trees', with that ``simulate --compat``). Without the full trace
(``/work/shared/data/mooncake/synthetic_trace.jsonl``, or ``--trace``) the 200-request sample in
``tests/data`` stands in, with a note: its numbers are not comparable with the goals.

``--baseline SRC`` (a source tree, e.g. a worktree of the previous release's ``src``) runs every
cell with that tree too, alternating run by run so both see the same load, timed as the later
runs are (its own prompt cache filled by an untimed run, then mapped), and adds the
baseline's fastest wall time and the speed-up: on a shared machine, absolute seconds drift
between sessions, while a same-minute ratio holds. ``sim s`` and ``baseline sim s`` are the
event loop alone (each JSON's ``wall_s``, fastest of the runs): the whole command's ratio and
the loop's can differ (the release computed its optimal bound much more slowly). ``CPU
speed-up`` is the same ratio on CPU time, which a busy host's stolen cycles do not inflate
(its faults and cache misses still do): the steadier of the two on a shared VM. The baseline
runs from its tree even under an editable install (``python -S``, the site-packages after it on
the path), on the native core that ``$RADIXSCHED_BASELINE_NATIVE_LIB`` names (a build of that
tree: ``cmake -S TREE -B BUILD && cmake --build BUILD``), else on this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
GOALS_S = {"synthetic": 1.5, "shared-first-block": 1.5, "3x-shared": 4.0, "lengths-only": 4.0}
RSS_GOAL_MB = {"3x-shared": 1024.0}
DEFECT_S = 10.0
BLOCK = 512
COPY_GAP_MS = 20 * 60 * 1000


@dataclass
class Cell:
    trace: str
    policy: str
    first_s: float  # the whole command with an empty prompt cache (it builds and stores them)
    wall_s: float  # the whole command mapping the stored prompts, fastest of the repeats
    slowest_s: float
    cpu_s: float  # the process's user + system CPU time, least of the repeats
    sim_s: float  # the simulation's own loop (the JSON's wall_s)
    peak_rss_mb: float
    requests: int
    hit_rate: float
    ttft_p99_s: float
    baseline_s: float | None = None  # the --baseline tree's fastest wall time, prompts mapped
    baseline_sim_s: float | None = None  # and its fastest event loop (its JSON's wall_s)
    baseline_cpu_s: float | None = None  # and its least CPU time


# ---- traces ---------------------------------------------------------------------------------------


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, recs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _shared(recs: list[dict[str, object]], top: int) -> list[dict[str, object]]:
    return [
        {**r, "hash_ids": [top, *r["hash_ids"]], "input_length": int(r["input_length"]) + BLOCK}  # type: ignore[misc, call-overload]
        for r in recs
    ]


def build_traces(src: Path, out: Path, lengths_only: bool) -> dict[str, tuple[str, Path]]:
    """name -> (workload kind, path)."""
    recs = _records(src)
    top = 1 + max(max(r["hash_ids"]) for r in recs)  # type: ignore[type-var, call-overload]
    copies = []
    for k in range(3):
        for r in recs:
            copies.append(
                {
                    **r,
                    "timestamp": int(r["timestamp"]) + k * COPY_GAP_MS,  # type: ignore[call-overload]
                    "hash_ids": [h + k * top for h in r["hash_ids"]],  # type: ignore[attr-defined]
                }
            )
    traces = {
        "synthetic": ("mooncake", src),
        "shared-first-block": ("mooncake", _write(out / "shared.jsonl", _shared(recs, top))),
        "3x-shared": ("mooncake", _write(out / "3x.jsonl", _shared(copies, 3 * top))),
    }
    if lengths_only:
        lengths = [
            {
                "input_length": r["input_length"],
                "output_length": r["output_length"],
                "timestamp": r["timestamp"],
            }
            for r in recs
        ]
        traces["lengths-only"] = ("jsonl", _write(out / "lengths.jsonl", lengths))
    return traces


# ---- one cell -------------------------------------------------------------------------------------


def _byte_compile(trees: list[Path]) -> None:
    """Write the bytecode of the package (and of each baseline tree) before timing: an
    installed package has it (pip compiles at install), while an editable checkout under
    ``PYTHONDONTWRITEBYTECODE`` would compile every module in every timed process (0.1-0.15 s
    here)."""
    import compileall

    import radixsched

    for root in [Path(radixsched.__file__).parent, *trees]:
        compileall.compile_dir(str(root), quiet=1)


BASELINE_LIB_ENV = "RADIXSCHED_BASELINE_NATIVE_LIB"


def _from_tree(src: Path, args: list[str]) -> list[str]:
    """The command line running ``radixsched`` from the source tree ``src``. ``-S`` skips the
    site-packages' ``.pth`` files, so an editable install's import hook (which wins over
    ``PYTHONPATH``) cannot load this checkout's package instead; the site-packages come after
    ``src`` on the path, for the dependencies."""
    site = [p for p in sys.path if p.endswith("-packages")]
    boot = (
        f"import sys, runpy; sys.path[:0] = {[str(src), *site]!r}; sys.argv[1:] = {args!r}; "
        "runpy.run_module('radixsched', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-S", "-c", boot]


def _run(
    kind: str,
    path: Path,
    policy: str,
    tmp: Path,
    src: Path | None = None,
    extra: tuple[str, ...] = (),
    cache: Path | None = None,
) -> tuple[float, float, float, dict[str, object]]:
    """(wall s, CPU s, peak RSS MB, the JSON result of the first policy) of one ``radixsched
    simulate`` process (of the source tree ``src`` when given, else the installed package);
    ``policy`` may list several. ``cache``: the prompt cache's folder (None: off)."""
    out = tmp / "result.json"
    out.unlink(missing_ok=True)
    args = ["simulate", "--workload", f"{kind}:{path}", "--policy", policy, "--json", str(out),
            *extra]  # fmt: skip
    cmd = [sys.executable, "-m", "radixsched", *args] if src is None else _from_tree(src, args)
    env = dict(os.environ)
    if cache is not None:
        env["RADIXSCHED_CACHE_DIR"] = str(cache)
        env.pop("RADIXSCHED_PROMPT_CACHE", None)
    else:
        env["RADIXSCHED_PROMPT_CACHE"] = "off"
    if src is not None and BASELINE_LIB_ENV in os.environ:
        env["RADIXSCHED_NATIVE_LIB"] = os.environ[BASELINE_LIB_ENV]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0,) or not out.exists():
        raise RuntimeError(f"{policy} on {path.name}: exit {proc.returncode}\n{err[-2000:]}")
    doc = json.loads(out.read_text())
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024.0, doc["results"][0]


def measure(
    name: str,
    kind: str,
    path: Path,
    policy: str,
    repeat: int,
    baseline: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Cell:
    """One cell; ``extra``: more ``simulate`` flags for every run of it (both trees)."""
    walls, sims, cpus, base_walls, base_sims, base_cpus, rss = [], [], [], [], [], [], 0.0
    firsts: list[float] = []
    res: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        for i in range(max(repeat, 1)):
            if baseline is not None:  # run as the measured tree is: its prompts stored, then mapped
                base_cache = Path(d) / f"base{i}"
                _run(kind, path, policy, Path(d), baseline, extra, cache=base_cache)
                base_wall, base_cpu, _, base_res = _run(
                    kind, path, policy, Path(d), baseline, extra, cache=base_cache
                )
                shutil.rmtree(base_cache, ignore_errors=True)
                base_walls.append(base_wall)
                base_cpus.append(base_cpu)
                base_sims.append(float(base_res.get("wall_s", 0.0)))  # type: ignore[arg-type]
            cache = Path(d) / f"cache{i}"  # empty: this run builds the prompts and stores them
            first, _, first_peak, _ = _run(kind, path, policy, Path(d), None, extra, cache=cache)
            firsts.append(first)
            rss = max(rss, first_peak)
            wall, cpu, peak, res = _run(kind, path, policy, Path(d), None, extra, cache=cache)
            shutil.rmtree(cache, ignore_errors=True)
            walls.append(wall)
            cpus.append(cpu)
            sims.append(float(res.get("wall_s", 0.0)))  # type: ignore[arg-type]
            rss = max(rss, peak)
    ttft = res.get("ttft_s", {})
    return Cell(
        trace=name,
        policy=policy,
        first_s=min(firsts),
        wall_s=min(walls),
        slowest_s=max(walls),
        cpu_s=min(cpus),
        sim_s=min(sims),
        peak_rss_mb=rss,
        requests=int(res.get("num_requests", 0)),  # type: ignore[call-overload]
        hit_rate=float(res.get("hit_rate", 0.0)),  # type: ignore[arg-type]
        ttft_p99_s=float(ttft.get("p99", 0.0)) if isinstance(ttft, dict) else 0.0,
        baseline_s=min(base_walls) if base_walls else None,
        baseline_sim_s=min(base_sims) if base_sims else None,
        baseline_cpu_s=min(base_cpus) if base_cpus else None,
    )


@dataclass
class Together:
    trace: str
    policies: int
    one_by_one_s: float  # --jobs 1: the policies one after another in one process
    side_by_side_s: float  # the default --jobs: one forked process per CPU
    jobs: int


def measure_together(
    name: str, kind: str, path: Path, policies: list[str], repeat: int
) -> Together:
    """One command with every policy: ``--jobs 1`` against the default, alternating runs."""
    from radixsched.sim.policy_runs import default_jobs

    one, side = [], []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(max(repeat, 1)):
            cache = Path(d) / "cache"  # stored by the first run, mapped by the others
            run = ",".join(policies)
            one.append(_run(kind, path, run, Path(d), extra=("--jobs", "1"), cache=cache)[0])
            side.append(_run(kind, path, run, Path(d), cache=cache)[0])
    return Together(name, len(policies), min(one), min(side), default_jobs(len(policies)))


# ---- table ----------------------------------------------------------------------------------------


def _verdict(c: Cell, full: bool) -> str:
    if not full:
        return "sample"
    goal = GOALS_S.get(c.trace, 1.5)
    if c.wall_s > DEFECT_S:
        return "[red]defect[/]"
    over_rss = c.peak_rss_mb > RSS_GOAL_MB.get(c.trace, float("inf"))
    if c.first_s <= goal and not over_rss:
        return "[green]goal[/]"
    if c.wall_s <= goal and not over_rss:
        return "[green]goal[/] (cached)"
    return "[yellow]> goal[/]"


def table(cells: list[Cell], full: bool) -> Table:
    t = Table(title="radixsched simulate, whole command per policy (fresh process each)")
    base = any(c.baseline_s is not None for c in cells)
    cols = ["trace", "policy", "first s", "wall s", "slowest s", "CPU s", "sim s", "req/s", "RSS MB", "hit",
            "p99 TTFT s", "verdict"]  # fmt: skip
    cols += ["baseline s", "speed-up", "CPU speed-up", "baseline sim s"] if base else []
    for col in cols:
        t.add_column(col, justify="left" if col in ("trace", "policy", "verdict") else "right")
    for c in cells:
        row = [c.trace, c.policy, f"{c.first_s:.2f}", f"{c.wall_s:.2f}", f"{c.slowest_s:.2f}", f"{c.cpu_s:.2f}",
               f"{c.sim_s:.2f}",
               f"{c.requests / c.wall_s:,.0f}", f"{c.peak_rss_mb:,.0f}", f"{c.hit_rate:.1%}",
               f"{c.ttft_p99_s:,.1f}", _verdict(c, full)]  # fmt: skip
        if base:
            b = c.baseline_s
            bs = c.baseline_sim_s
            row += ["-", "-"] if b is None else [f"{b:.2f}", f"{b / c.wall_s:.2f}x"]
            bc = c.baseline_cpu_s
            row.append("-" if bc is None else f"{bc / c.cpu_s:.2f}x")
            row.append("-" if bs is None else f"{bs:.2f}")
        t.add_row(*row)
    return t


def _policies(text: str) -> list[str]:
    from radixsched.policies import POLICIES

    if text == "all":
        return list(POLICIES)
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; valid: {', '.join(POLICIES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--trace", type=Path, default=None, help=f"Mooncake JSONL (default {FULL_TRACE})"
    )
    p.add_argument("--traces", default="synthetic,shared-first-block,3x-shared")
    p.add_argument("--policies", default="all", help="comma-separated, or 'all'")
    p.add_argument(
        "--repeat", type=int, default=3, help="fresh processes per cell (fastest counts)"
    )
    p.add_argument("--lengths-only", action="store_true", help="add the lengths-only trace")
    p.add_argument(
        "--together",
        action="store_true",
        help="also time one command with every policy: --jobs 1 against the default",
    )
    p.add_argument("--json", dest="json_path", type=Path, default=None)
    p.add_argument(
        "--compat",
        choices=("radixsched", "sglang"),
        default=None,
        help="run every cell with simulate --compat (sglang: SGLang 0.5.23's behaviour)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another source tree (its src/) to time alongside, run by run; its native core "
        f"from ${BASELINE_LIB_ENV} where set (a build of that tree), else this one's",
    )
    args = p.parse_args(argv)
    console = Console(width=max(Console().size.width, 120))
    src = args.trace or FULL_TRACE
    if not src.exists():
        console.print(f"[yellow]note:[/] {src} not found; using the sample {SAMPLE_TRACE}")
        src = SAMPLE_TRACE
    full = src.resolve() == FULL_TRACE.resolve()
    names = [n.strip() for n in args.traces.split(",") if n.strip()]
    if args.lengths_only and "lengths-only" not in names:
        names.append("lengths-only")
    policies = _policies(args.policies)
    _byte_compile([args.baseline] if args.baseline is not None else [])
    cores, load0 = os.cpu_count() or 1, os.getloadavg()
    console.print(f"machine: {cores} cores, load average {load0[0]:.2f} / {load0[1]:.2f} / "
                  f"{load0[2]:.2f} before the runs; Python {sys.version.split()[0]}")  # fmt: skip
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as d:
        traces = build_traces(src, Path(d), "lengths-only" in names)
        for name in names:
            kind, path = traces[name]
            for policy in policies:
                extra = () if args.compat is None else ("--compat", args.compat)
                cell = measure(name, kind, path, policy, args.repeat, args.baseline, extra)
                cells.append(cell)
                base = (
                    ""
                    if cell.baseline_s is None
                    else (f"; baseline {cell.baseline_s:.2f} s, CPU {cell.baseline_cpu_s:.2f} s")
                )
                console.print(f"  {name} {policy}: first {cell.first_s:.2f} s, then "
                              f"{cell.wall_s:.2f} s (slowest "
                              f"{cell.slowest_s:.2f}), CPU {cell.cpu_s:.2f} s, "
                              f"{cell.peak_rss_mb:,.0f} MB{base}")  # fmt: skip
        together = []
        for name in names if args.together and len(policies) > 1 else []:
            kind, path = traces[name]
            together.append(measure_together(name, kind, path, policies, args.repeat))
    load1 = os.getloadavg()
    console.print(table(cells, full))
    for t in together:
        console.print(f"{t.trace}, all {t.policies} policies in one command: {t.one_by_one_s:.2f} s "
                      f"one after another (--jobs 1), {t.side_by_side_s:.2f} s side by side "
                      f"(--jobs {t.jobs}): {t.one_by_one_s / t.side_by_side_s:.2f}x")  # fmt: skip
    console.print(f"load average after: {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}")
    if args.json_path is not None:
        doc = {"cores": cores, "load_before": load0, "load_after": load1,
               "cells": [asdict(c) for c in cells], "together": [asdict(t) for t in together]}  # fmt: skip
        args.json_path.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
