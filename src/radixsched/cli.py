"""``radixsched``: simulate, sweep, generate, serve, bench.

Scheduler flags carry SGLang's names and come from ``SchedulerConfig``; simulator flags come from
``SimConfig``: the help text and defaults are generated from the dataclasses, so they never drift.
Heavy modules (torch, FastAPI, ray) are imported only by the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import Any

from radixsched.cli_common import (
    DEFAULT_RATE,
    DEFAULT_WORKLOAD,
    MAIN_POLICIES,
    CliError,
    scheduler_choices,
)
from radixsched.config import SchedulerConfig, add_config_args


def _policy_names() -> list[str]:
    from radixsched.policy import POLICIES

    return list(POLICIES)


def _parse_rate(text: str | None) -> float | None:
    if text is None:
        return None
    if text.lower() in ("inf", "infinity"):
        return float("inf")
    try:
        rate = float(text)
    except ValueError as e:
        raise CliError(f"--request-rate must be a number or 'inf', got {text!r}") from e
    if rate <= 0:
        raise CliError(f"--request-rate must be > 0, got {text!r}")
    return rate


# ---- simulate ---------------------------------------------------------------------------------


def _add_simulate_args(p: argparse.ArgumentParser) -> None:
    from radixsched.sim.simulate import SimConfig

    p.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help="workload spec: mooncake:PATH, jsonl:PATH, shared-prefix:k=v,..., multi-turn, "
        f"tree-of-thought, few-shot (default: {DEFAULT_WORKLOAD})",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="comma-separated policies to compare, or 'all' (default: the main policies; "
        "--schedule-policy picks one)",
    )
    p.add_argument(
        "--request-rate",
        default=None,
        help="Poisson arrivals per second, or 'inf' for all at once (default: the trace's "
        f"timestamps; generated workloads {DEFAULT_RATE}/s)",
    )
    p.add_argument("--num-requests", type=int, default=None, help="take the first N requests")
    p.add_argument("--json", dest="json_path", default=None, help="write results as JSON")
    p.add_argument("--csv", dest="csv_path", default=None, help="write results as CSV")
    p.add_argument("--report", dest="report_path", default=None, help="write an HTML report")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_args(p, SchedulerConfig, choices=scheduler_choices())
    add_config_args(p, SimConfig, choices=_sim_choices())


def _sim_choices() -> dict[str, list[str]]:
    from radixsched.cluster.routers import ROUTERS

    # Model and GPU names are matched case-insensitively with common spellings (h200 = H200),
    # a model may be a config.json path; an unknown name lists the valid ones.
    return {"router": list(ROUTERS)}


def _selected_policies(args: argparse.Namespace) -> list[str]:
    names = _policy_names()
    if args.policy is None:
        if "schedule_policy" in vars(args):
            return [args.schedule_policy]
        return [n for n in MAIN_POLICIES if n in names]
    if args.policy == "all":
        return names
    chosen = [p.strip() for p in args.policy.split(",") if p.strip()]
    for c in chosen:
        if c not in names:
            raise CliError(f"unknown policy {c!r}; valid: {', '.join(names)}")
    return chosen


def cmd_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from radixsched.sim.heap import tune_heap
    from radixsched.sim.simulate import simulate
    from radixsched.sim.table import render_comparison, write_csv, write_json
    from radixsched.sim.workloads import WorkloadError, load_workload, optimal_hit_rate

    tune_heap()  # a simulation's array churn (radixsched.sim.heap)
    console = Console()
    policies = _selected_policies(args)
    rate = _parse_rate(args.request_rate)
    try:
        workload = load_workload(
            args.workload,
            request_rate=rate,
            num_requests=args.num_requests,
            seed=getattr(args, "seed", 0),
            default_rate=float(DEFAULT_RATE),
        )
    except WorkloadError as e:
        raise CliError(str(e)) from e
    try:
        from radixsched.sim.engine_modes import engine_mode_configs

        base, sim_cfg = engine_mode_configs(args)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from e
    opt = optimal_hit_rate(workload.requests, page_size=base.page_size)
    runs = []
    progress = Progress(
        TextColumn("[bold]{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} requests"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
        transient=False,
    )
    with progress:
        for name in policies:
            try:
                cfg = dataclasses.replace(base, schedule_policy=name)
            except ValueError as e:
                raise CliError(f"{name}: {e}") from e
            task = progress.add_task(name, total=len(workload.requests))

            def on_progress(done: int, total: int, task: Any = task) -> None:
                progress.update(task, completed=done)

            try:
                run = simulate(
                    workload, cfg, sim_cfg, on_progress=on_progress, optimal_hit_rate=opt
                )
            except ValueError as e:
                raise CliError(f"{name}: {e}") from e
            runs.append(run)
    results = [r.result for r in runs]
    console.print(
        f"[bold]workload[/] {workload.name} {workload.params}  "
        f"[bold]requests[/] {len(workload.requests)}  [bold]model[/] {sim_cfg.model} "
        f"[bold]gpu[/] {sim_cfg.gpu} x tp{sim_cfg.tp}  [bold]KV capacity[/] "
        f"{runs[0].kv_capacity_tokens:,} tokens  [bold]optimal hit rate[/] {opt:.1%}"
    )
    render_comparison(results, console)
    workload_info = {
        "spec": args.workload,
        "name": workload.name,
        "params": workload.params,
        "num_requests": len(workload.requests),
        "request_rate": args.request_rate,
        "arrivals": workload.arrivals,
        "optimal_hit_rate": opt,
    }
    config_info = {
        "scheduler": dataclasses.asdict(base),
        "sim": dataclasses.asdict(sim_cfg),
        "kv_capacity_tokens": runs[0].kv_capacity_tokens,
        "cost_model": runs[0].cost_model,
    }
    if args.json_path:
        write_json(args.json_path, workload_info, config_info, results)
        console.print(f"wrote {args.json_path}")
    if args.csv_path:
        write_csv(results, args.csv_path)
        console.print(f"wrote {args.csv_path}")
    if args.report_path:
        from radixsched.sim.report import write_report

        write_report(
            args.report_path,
            workload_info,
            config_info,
            results,
            {r.result.policy: r.series for r in runs},
            {r.result.policy: r.ttft_s for r in runs},
        )
        console.print(f"wrote {args.report_path}")
    return 0


# ---- entry point --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixsched",
        description="Cache-aware request scheduling for LLM serving: simulate policies on your "
        "traffic, or serve a model with them.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "simulate", help="replay a workload through the scheduler and compare policies"
    )
    _add_simulate_args(sim)
    sim.set_defaults(func=cmd_simulate)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: Any) -> None:
    """Subcommands living in other modules register themselves here (kept lazy)."""
    from radixsched import cli_extra

    cli_extra.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage error (printed) or --help: an exit status, not a raise
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
