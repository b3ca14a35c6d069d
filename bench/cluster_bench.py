"""Cluster benchmark: routers, the host KV tier and the prefill delayer, in the simulator.

Sections (every run is a deterministic simulation; the model is llama-3.1-8b on one H200 per
replica unless ``--gpu``/``--model`` say otherwise):

(a) ``routers``: every router at ``--dp`` replicas (default 8) on two workloads:
    - shared-prefix: 64 system prompts of 2,048 tokens, 16 questions each (128 unique tokens,
      128 output tokens) at 96 req/s, with 32,768 KV tokens per replica: a replica can hold
      every system prompt it is sent only if it is sent few groups;
    - Mooncake: the full synthetic trace (``/work/shared/data/mooncake/synthetic_trace.jsonl``,
      3,993 requests, trace timestamps) when present, else the 200-request sample in
      ``tests/data``, at the preset's device KV size.
    Reported: cluster hit rate (and the workload's infinite-cache optimum), TTFT p50/p99,
    output tokens/s, and the spread of requests over replicas (min-max).
(b) ``hicache``: the host KV tier on the Mooncake trace with the cache-aware router at
    ``--dp`` replicas, host size 0 / 16 / 64 / 256 GB per replica (``--hicache-sizes``):
    hit rate split device/host, TTFT mean/p50/p99. ``--hicache-device-tokens`` overrides the
    device KV size (default: the preset's, 889,619 tokens on an H200).
(c) ``delayer``: lockstep data-parallel attention (``--enable-dp-attention``) at ``--dp``
    replicas fed round-robin, on a shared-prefix workload (32 groups x 8 requests, 1,024-token
    system prompts, 256-token questions, 64 output tokens, 80 req/s, 40,000 KV tokens per
    rank): delayer off, on (radixsched defaults), on with the queue trigger (ratio 0.3), and
    on under ``--compat sglang``. Reported: utilisation (ranks' own batch time over dp x pass
    time), passes with a prefill, ranks prefilling together, delayed passes and the longest
    delay, TTFT p50/p99, mean TPOT, output tokens/s.

Run: ``.venv/bin/python bench/cluster_bench.py [--json PATH] [--jobs 2] [--dp 8]
[--mooncake PATH] [--mooncake-requests N] [--sections routers hicache delayer]``.
Runs execute on ``--jobs`` local processes (default 2); the default run takes about two
minutes on two cores, most of it the Mooncake trace (``--mooncake-requests 1000`` for a
quick look).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from radixsched.cluster.routers import ROUTERS
from radixsched.config import SchedulerConfig
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload, optimal_hit_rate

REPO = Path(__file__).resolve().parent.parent
FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
SAMPLE_TRACE = REPO / "tests" / "data" / "mooncake_sample.jsonl"
SHARED = "shared-prefix:groups=64,prompts=16,system_len=2048,question_len=128,output_len=128"
SHARED_RATE = 96.0
SHARED_KV = 32768
DELAYER = "shared-prefix:groups=32,prompts=8,system_len=1024,question_len=256,output_len=64"
DELAYER_RATE = 80.0
DELAYER_KV = 40000
HICACHE_SIZES = (0.0, 16.0, 64.0, 256.0)
SECTIONS = ("routers", "hicache", "delayer")


class WorkloadRef(NamedTuple):
    label: str
    spec: str
    rate: float | None
    num_requests: int | None


class Task(NamedTuple):
    section: str
    label: str
    workload: WorkloadRef
    sched: dict[str, Any]
    sim: dict[str, Any]


@cache
def _load(ref: WorkloadRef) -> tuple[Workload, float]:
    wl = load_workload(ref.spec, request_rate=ref.rate, num_requests=ref.num_requests, seed=0)
    return wl, optimal_hit_rate(wl.requests, page_size=1)


def run_task(task: Task) -> dict[str, Any]:
    """One simulation; returns its table row (plain JSON values)."""
    wl, opt = _load(task.workload)
    t0 = time.perf_counter()
    run = simulate(wl, SchedulerConfig(**task.sched), SimConfig(**task.sim), optimal_hit_rate=opt)
    r = run.result
    row: dict[str, Any] = {
        "section": task.section,
        "label": task.label,
        "workload": task.workload.label,
        "num_requests": r.num_requests,
        "hit_rate": r.hit_rate,
        "device_hit_rate": r.device_hit_rate,
        "host_hit_rate": r.host_hit_rate,
        "optimal_hit_rate": r.optimal_hit_rate,
        "ttft_mean_s": r.ttft_s.mean,
        "ttft_p50_s": r.ttft_s.p50,
        "ttft_p99_s": r.ttft_s.p99,
        "tpot_mean_s": r.tpot_s.mean,
        "output_tokens_per_s": r.throughput.output_tokens_per_s,
        "requests_per_s": r.throughput.requests_per_s,
        "kv_capacity_tokens": run.kv_capacity_tokens,
        "replica_requests": [s.num_requests for s in run.replicas],
        "sim_wall_s": time.perf_counter() - t0,
        "settings": {"sched": task.sched, "sim": task.sim},
    }
    if run.lockstep is not None:
        row["lockstep"] = run.lockstep.to_json()
    return row


def build_tasks(args: argparse.Namespace) -> list[Task]:
    trace = (
        Path(args.mooncake)
        if args.mooncake
        else (FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE)
    )
    n = args.mooncake_requests
    mooncake = WorkloadRef(
        "mooncake" if n is None else f"mooncake[:{n}]", f"mooncake:{trace}", None, n
    )
    shared = WorkloadRef("shared-prefix", SHARED, SHARED_RATE, None)
    preset = {"gpu": args.gpu, "model": args.model}
    tasks: list[Task] = []
    if "routers" in args.sections:
        for ref, kv in ((shared, SHARED_KV), (mooncake, None)):
            for router in sorted(ROUTERS):
                sim = {**preset, "dp": args.dp, "router": router, "max_total_tokens": kv}
                tasks.append(Task("routers", router, ref, {}, sim))
    if "hicache" in args.sections:
        for gb in args.hicache_sizes:
            sim = {
                **preset,
                "dp": args.dp,
                "router": "cache-aware",
                "max_total_tokens": args.hicache_device_tokens,
            }
            if gb > 0:
                # 0 GB is the run without a tier (a zero-sized tier keeps nothing).
                sim.update(enable_hierarchical_cache=True, hicache_size=gb)
            tasks.append(Task("hicache", f"{gb:g} GB", mooncake, {}, sim))
    if "delayer" in args.sections:
        ref = WorkloadRef("shared-prefix (dp-attention)", DELAYER, DELAYER_RATE, None)
        lock = {
            **preset,
            "dp": args.dp,
            "router": "round-robin",
            "max_total_tokens": DELAYER_KV,
            "enable_dp_attention": True,
        }
        modes: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
            ("off", {}, {"enable_prefill_delayer": False}),
            ("on", {}, {}),
            ("on, queue ratio 0.3", {}, {"prefill_delayer_queue_min_ratio": 0.3}),
            ("on, --compat sglang", {"compat": "sglang"}, {}),
        ]
        for label, sched, extra in modes:
            tasks.append(Task("delayer", label, ref, sched, {**lock, **extra}))
    return tasks


def _settings_key(task: Task) -> str:
    return json.dumps([task.workload, task.sched, task.sim], sort_keys=True)


def run_all(tasks: Sequence[Task], jobs: int) -> list[dict[str, Any]]:
    """Rows in task order; identical settings (e.g. a router row and the 0 GB HiCache row)
    are simulated once."""
    unique: dict[str, Task] = {}
    for t in tasks:
        unique.setdefault(_settings_key(t), t)
    # Mooncake runs first: they are the long ones, so the pool drains evenly.
    order = sorted(unique, key=lambda k: not unique[k].workload.spec.startswith("mooncake"))
    if jobs <= 1:
        done = {k: run_task(unique[k]) for k in order}
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {k: pool.submit(run_task, unique[k]) for k in order}
            done = {k: f.result() for k, f in futures.items()}
    return [{**done[_settings_key(t)], "section": t.section, "label": t.label} for t in tasks]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(x: float) -> str:
    return f"{1000 * x:.0f}"


def render(rows: Sequence[dict[str, Any]], console: Console, dp: int) -> None:
    routers = [r for r in rows if r["section"] == "routers"]
    if routers:
        t = Table(title=f"(a) routers at dp={dp}: cluster hit rate, TTFT, throughput")
        for col in (
            "workload",
            "router",
            "hit rate",
            "optimum",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "out tok/s",
            "reqs/replica",
        ):
            t.add_column(col, justify="left" if col in ("workload", "router") else "right")
        for r in routers:
            reps = r["replica_requests"]
            t.add_row(
                r["workload"],
                r["label"],
                _pct(r["hit_rate"]),
                _pct(r["optimal_hit_rate"]),
                _ms(r["ttft_p50_s"]),
                _ms(r["ttft_p99_s"]),
                f"{r['output_tokens_per_s']:.0f}",
                f"{min(reps)}-{max(reps)}",
            )
        console.print(t)
    hic = [r for r in rows if r["section"] == "hicache"]
    if hic:
        cap = hic[0]["kv_capacity_tokens"]
        t = Table(
            title=f"(b) HiCache on {hic[0]['workload']}, dp={dp} cache-aware, device KV {cap:,} tokens/replica"
        )
        for col in (
            "host/replica",
            "hit rate",
            "device",
            "host",
            "TTFT mean ms",
            "TTFT p50 ms",
            "TTFT p99 ms",
        ):
            t.add_column(col, justify="right")
        for r in hic:
            t.add_row(
                r["label"],
                _pct(r["hit_rate"]),
                _pct(r["device_hit_rate"]),
                _pct(r["host_hit_rate"]),
                _ms(r["ttft_mean_s"]),
                _ms(r["ttft_p50_s"]),
                _ms(r["ttft_p99_s"]),
            )
        console.print(t)
    dl = [r for r in rows if r["section"] == "delayer"]
    if dl:
        t = Table(title=f"(c) prefill delayer, lockstep dp-attention at dp={dp}, round-robin")
        for col in (
            "delayer",
            "utilisation",
            "prefill passes",
            "ranks/prefill",
            "delayed passes",
            "max delay",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TPOT ms",
            "out tok/s",
        ):
            t.add_column(col, justify="left" if col == "delayer" else "right")
        for r in dl:
            ls = r["lockstep"]
            t.add_row(
                r["label"],
                _pct(ls["utilisation"]),
                str(ls["prefill_passes"]),
                f"{ls['mean_prefill_ranks']:.2f}",
                str(ls["delayed_passes"]),
                f"{ls['max_delay_streak']} passes / {_ms(ls['max_delay_streak_s'])} ms",
                _ms(r["ttft_p50_s"]),
                _ms(r["ttft_p99_s"]),
                f"{1000 * r['tpot_mean_s']:.1f}",
                f"{r['output_tokens_per_s']:.0f}",
            )
        console.print(t)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--json", help="write every row (settings included) to this JSON file")
    p.add_argument("--jobs", type=int, default=2, help="local worker processes")
    p.add_argument("--dp", type=int, default=8, help="replicas (ranks)")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--mooncake", help="Mooncake trace (default: the full trace if present)")
    p.add_argument("--mooncake-requests", type=int, help="keep the first N trace requests")
    p.add_argument("--hicache-sizes", type=float, nargs="+", default=list(HICACHE_SIZES))
    p.add_argument("--hicache-device-tokens", type=int, help="device KV tokens per replica")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = p.parse_args(argv)
    probe = Console()
    # Tables are wide; a pipe or a narrow terminal would wrap every cell.
    console = probe if probe.is_terminal and probe.width >= 140 else Console(width=160)
    tasks = build_tasks(args)
    t0 = time.perf_counter()
    rows = run_all(tasks, args.jobs)
    wall = time.perf_counter() - t0
    render(rows, console, args.dp)
    console.print(f"{len(rows)} runs in {wall:.1f} s on {args.jobs} process(es)")
    if args.json:
        Path(args.json).write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
