"""``radixsched sweep CONFIG.yaml [--ray ADDRESS] [--out DIR] [--jobs N]``: a grid of
simulations, its table, CSV, JSON and HTML report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixsched.cli.common import COMMAND_HELP, Parser, run_metadata
from radixsched.cli.common import usable_cpus as _usable_cpus
from radixsched.paths import same_file
from radixsched.sim.sweep.config import (
    MAX_RUNS,
    OUTPUT_FILES,
    SweepConfig,
    SweepError,
    _shown,
    input_files,
    validate_metrics,
    validate_points,
    validate_traces,
)
from radixsched.sim.sweep.executors import LocalExecutor, RayExecutor, RunOutcome, SweepExecutor
from radixsched.sim.sweep.result import _json_value, run_sweep

# ---- CLI -------------------------------------------------------------------------------------


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on a subparsers object (``radixsched sweep``)."""
    from radixsched.sim.settings.runconfig import RATE_RULE

    p: argparse.ArgumentParser = sub.add_parser(
        "sweep",
        help=COMMAND_HELP["sweep"],
        description="Run the cartesian product of a YAML config's 'vary' lists over its "
        "'base' settings (the keys of simulate's flags and --config), in local processes or "
        "on Ray, and write sweep.csv, sweep.json and a self-contained report.html.",
        epilog="example: examples/sweep.yaml. Arrivals: " + RATE_RULE + ". Exit status: 0 "
        "when every run succeeded, 1 when a run failed (its error is in the outputs), 2 on an "
        "invalid config (nothing is run).",
    )
    add_sweep_args(p)
    p.set_defaults(func=cmd_sweep)
    return p


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="sweep YAML: base settings and a 'vary' mapping")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on Ray (ray.init address, e.g. auto or ray://host:10001)",
    )
    p.add_argument("--out", metavar="DIR", help="output folder (default: sweep-<name>)")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="local worker processes (default: CPU count; 1 = in-process; at most the CPU "
        "count is used)",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=MAX_RUNS,
        metavar="N",
        help="refuse a sweep of more runs than this (default: %(default)s)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of another sweep in --out (default: refuse; the results "
        "of the same sweep are always replaced)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")


def _error(message: str) -> int:
    for line in message.splitlines():
        print(f"radixsched sweep: error: {line}", file=sys.stderr)
    return 2


def _previous_sweep(path: Path) -> dict[str, Any] | None:
    """The ``sweep`` section of an earlier ``sweep.json`` (None: unreadable or not one)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    sweep = doc.get("sweep") if isinstance(doc, dict) else None
    return sweep if isinstance(sweep, dict) else None


def check_out_dir(
    out_dir: Path, config: SweepConfig, inputs: Sequence[tuple[str, str]], overwrite: bool
) -> str | None:
    """Why the sweep must not write into ``out_dir`` (nothing is created): not a writable
    folder, one of its output files is an input of the sweep (never overwritten), or it holds
    another sweep's results (replaced only with ``overwrite``; a rerun of the same sweep
    replaces its own)."""
    existing = next((p for p in (out_dir, *out_dir.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out_dir}: {existing} is not a writable folder"
    outputs = [out_dir / name for name in OUTPUT_FILES]
    for what, path in inputs:
        for out in outputs:
            if same_file(out, path):
                return (
                    f"--out {out_dir}: the sweep writes {out}, which is {what} {path}; "
                    "refusing to overwrite an input: choose another folder"
                )
    for out in outputs:
        if out.exists() and (out.is_dir() or not os.access(out, os.W_OK)):
            return f"--out {out_dir}: {out} is {'a folder' if out.is_dir() else 'not writable'}"
    present = [out.name for out in outputs if out.exists()]
    if not present or overwrite:
        return None
    previous = _previous_sweep(out_dir / "sweep.json")
    if previous == json.loads(json.dumps(_json_value(config.to_json()), default=str)):
        return None  # the same sweep again
    if previous is None:
        what = f"files this sweep would replace ({', '.join(present)})"
    elif previous.get("name") == config.name:
        what = f"the results of sweep {config.name!r} run with another config"
    else:
        what = f"the results of another sweep ({previous.get('name')!r})"
    return (
        f"--out {out_dir}: already holds {what}; choose another folder, or pass --overwrite "
        "to replace them"
    )


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        return _error(f"--jobs must be >= 1, got {args.jobs}")
    if args.jobs is not None and args.ray is not None:
        return _error("--jobs sets local worker processes: drop it with --ray (Ray schedules)")
    if args.max_runs < 1:
        return _error(f"--max-runs must be >= 1, got {args.max_runs}")
    if args.ray is not None and not args.ray.strip():
        return _error("--ray: expected a Ray address (e.g. auto or ray://host:10001), got ''")
    try:
        config = SweepConfig.load(args.config)
    except SweepError as e:
        return _error(str(e))
    where = args.config
    if config.num_runs > args.max_runs:
        sizes = " x ".join(f"{k} {len(v)}" for k, v in config.vary)
        return _error(
            f"{where}: vary makes {config.num_runs:,} runs ({sizes}), more than --max-runs "
            f"{args.max_runs:,}; vary fewer values, or raise --max-runs"
        )
    if args.out is None and ("/" in config.name or os.sep in config.name):
        return _error(
            f"{where}: name {config.name!r} cannot name the default output folder "
            "sweep-<name>; give --out DIR"
        )
    labels = list(config.cases)
    try:
        validate_metrics(config.metrics, "metrics")
        if config.best is not None:
            validate_metrics([config.best.metric], "best")
        points = config.points()
        validate_points(points, config.varied, labels)
        validate_traces(points, config.varied, labels)
    except SweepError as e:
        return _error("\n".join(f"{where}: {line}" for line in str(e).splitlines()))
    out_dir = Path(args.out or f"sweep-{config.name}")
    inputs = [("the sweep config", str(args.config)), *input_files(points, labels)]
    if problem := check_out_dir(out_dir, config, inputs, args.overwrite):
        return _error(problem)
    executor: SweepExecutor
    if args.ray is not None:
        executor = RayExecutor(args.ray)
        try:
            executor.connect()
        except SweepError as e:
            return _error(str(e))
    else:
        cpus = _usable_cpus()
        jobs = args.jobs or cpus
        if jobs > cpus and len(points) > cpus:
            print(
                f"radixsched sweep: note: --jobs {jobs}: running {cpus} processes at a time, "
                "one per usable CPU",
                file=sys.stderr,
            )
        executor = LocalExecutor(min(jobs, cpus))

    def progress(i: int, o: RunOutcome) -> None:
        if args.quiet:
            return
        shown = _shown(points[i], config.varied)
        status = f"error: {o.error}" if o.error else f"{o.wall_s:.1f}s"
        print(f"run {i + 1}/{len(points)} {shown}: {status}", flush=True)

    meta = run_metadata(getattr(args, "_argv", None))
    result = run_sweep(config, executor=executor, on_result=progress)
    paths = result.write(out_dir, meta)
    if best := result.best_text():
        print(best)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if result.num_failed:
        print(
            f"radixsched sweep: error: {result.num_failed} of {len(points)} runs failed "
            "(errors above and in the outputs)",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="radixsched sweep", description=(__doc__ or "").split("\n")[0])
    add_sweep_args(parser)
    return cmd_sweep(parser.parse_args(argv))
