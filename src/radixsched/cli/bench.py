"""The ``bench`` subcommand: load a running server with a workload and report what it measured,
with the simulator's metric names (``client.bench``; aiohttp is imported when it runs).

Generated workloads take bench's own sizes (``BENCH_WORKLOAD_DEFAULTS``) for every param the
spec leaves out, so ``--workload shared-prefix:groups=4`` stays small. Any failed request makes
the command exit 1 after a summary of the failures by reason; a server that cannot be
benchmarked, or a usage error, exits 2. ``--sweep`` runs the calibrating sweep
(``client.bench.run_sweep``) into one file for ``radixsched calibrate``."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from radixsched.cli.common import COMMAND_HELP, CliError, output_errors, run_metadata

EXIT_FAILED = 1
SWEEP_RATES = 3  # --sweep-rates' default
MAX_SWEEP_RATES = 100  # each rate sends the whole workload once more


def _bench_epilog() -> str:
    from radixsched.client.bench import BENCH_WORKLOAD_DEFAULTS
    from radixsched.sim.settings.runconfig import RATE_RULE
    from radixsched.sim.workloads.spec import describe_workloads

    return (
        "workloads (--workload NAME:k=v,... or NAME:PATH; bench's defaults for params not "
        "given):\n"
        + describe_workloads(BENCH_WORKLOAD_DEFAULTS)
        + "\n\narrivals: "
        + RATE_RULE
        + ".\n\nexit status: 0 when every request completed; 1 when any failed (a summary of "
        "the failures by reason is printed); 2 when the server cannot be benchmarked or on a "
        "usage error."
    )


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    from radixsched.client.bench import DEFAULT_BENCH_WORKLOAD

    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help=COMMAND_HELP["bench"],
        description="Send a workload from the simulator's registry to a server's /generate "
        "(token ids, streaming) and report TTFT, inter-token latency, TPOT, E2E latency, "
        "throughput and the server's cache hit rate, with the simulator's metric names.",
        epilog=_bench_epilog(),
    )
    p.add_argument(
        "--url", default="http://127.0.0.1:30000", help="server base URL (default: %(default)s)"
    )
    p.add_argument(
        "--workload",
        default=DEFAULT_BENCH_WORKLOAD,
        metavar="SPEC",
        help="workload spec as for simulate, listed below with bench's defaults "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--request-rate",
        metavar="R",
        help="Poisson arrivals per second, or 'inf' to send every request at once (default: "
        "the trace's timestamps; generated workloads: inf); --max-concurrency still applies",
    )
    p.add_argument("--num-requests", type=int, metavar="N", help="take the first N requests")
    p.add_argument(
        "--max-concurrency", type=int, metavar="N", help="requests in flight at most (default: all)"
    )
    p.add_argument("--api-key", help="bearer token for a server run with --api-key")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a request may wait for its next data before it fails (default: 600)",
    )
    p.add_argument("--slo-ttft-ms", type=float, metavar="MS", help="TTFT target for SLO goodput")
    p.add_argument("--slo-tpot-ms", type=float, metavar="MS", help="TPOT target for SLO goodput")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the result as JSON")
    p.add_argument(
        "--requests-csv",
        metavar="PATH",
        help="one row per request (CSV; Parquet if PATH ends in .parquet, needs pyarrow)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "--flush-cache",
        action="store_true",
        help="empty the server's prefix cache before the run (POST /flush_cache)",
    )
    sweep = p.add_argument_group("calibrating sweep (input for 'radixsched calibrate')")
    sweep.add_argument(
        "--sweep",
        action="store_true",
        help="run synchronous (one request at a time), a throughput probe (all at once, "
        "--max-concurrency applying), then --sweep-rates Poisson rates between, each from a "
        "flushed cache, into one --json file; --requests-csv rows name the stage in 'policy'",
    )
    sweep.add_argument(
        "--sweep-rates",
        type=int,
        metavar="K",
        help="with --sweep: Poisson rates between synchronous and throughput, 0 to "
        f"{MAX_SWEEP_RATES} (default: {SWEEP_RATES})",
    )
    sweep.add_argument(
        "--sweep-warmup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --sweep: first send the workload once, all at once, unmeasured (the "
        "engine's first run of a workload's batch shapes is slower than the next; default: on)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def _sweep_errors(args: argparse.Namespace) -> list[str]:
    """The --sweep options: only with --sweep, within range; fills in their defaults."""
    errors = []
    if not args.sweep:
        for flag, value in (
            ("--sweep-rates", args.sweep_rates),
            ("--sweep-warmup" if args.sweep_warmup else "--no-sweep-warmup", args.sweep_warmup),
        ):
            if value is not None:
                errors.append(f"{flag} applies to --sweep only: add --sweep, or drop it")
        return errors
    if args.sweep_rates is None:
        args.sweep_rates = SWEEP_RATES
    if args.sweep_warmup is None:
        args.sweep_warmup = True
    if not args.json_path:
        errors.append("--sweep needs --json PATH (the file 'radixsched calibrate' reads)")
    if args.sweep_rates < 0:
        errors.append(f"--sweep-rates must be >= 0, got {args.sweep_rates}")
    elif args.sweep_rates > MAX_SWEEP_RATES:
        errors.append(f"--sweep-rates must be <= {MAX_SWEEP_RATES}, got {args.sweep_rates}")
    if args.request_rate is not None:
        errors.append(
            "--request-rate does not apply to --sweep (it sends at its own rates): drop it"
        )
    return errors


def _output_errors(args: argparse.Namespace) -> list[str]:
    """--json and --requests-csv: writable, neither one the workload's trace nor the other."""
    from radixsched.sim.preflight import trace_path

    trace = trace_path(args.workload)
    inputs = [] if trace is None else [("the --workload trace", trace)]
    outputs = [("--json", args.json_path), ("--requests-csv", args.requests_csv)]
    return output_errors([(f, p) for f, p in outputs if p is not None], inputs)


def _slo_ms(flag: str, value: float | None) -> tuple[float | None, str | None]:
    """(seconds, None), or (None, the error) for an SLO flag in milliseconds."""
    if value is None:
        return None, None
    if not (math.isfinite(value) and value > 0):
        return None, f"{flag} must be a positive number of milliseconds, got {value:g}"
    return value / 1e3, None


def _config(args: argparse.Namespace) -> Any:
    from radixsched.client.bench import BenchConfig, load_bench_workload, url_problem
    from radixsched.results.requests import SloTargets
    from radixsched.sim.settings.limits import RunConfigError, parse_rate
    from radixsched.sim.workloads.spec import check_workload_spec
    from radixsched.sim.workloads.tokens import WorkloadError

    errors = []
    if url_error := url_problem(args.url):
        errors.append(url_error)
    try:
        rate = parse_rate(args.request_rate, "--request-rate")
    except RunConfigError as e:
        errors.append(str(e))
        rate = None
    if args.max_concurrency is not None and args.max_concurrency < 1:
        errors.append("--max-concurrency must be >= 1")
    if args.num_requests is not None and args.num_requests < 1:
        errors.append("--num-requests must be >= 1")
    if args.seed < 0:
        errors.append(f"--seed must be >= 0, got {args.seed}")
    if not args.timeout > 0:
        errors.append("--timeout must be > 0")
    errors.extend(_sweep_errors(args))
    ttft, ttft_error = _slo_ms("--slo-ttft-ms", args.slo_ttft_ms)
    tpot, tpot_error = _slo_ms("--slo-tpot-ms", args.slo_tpot_ms)
    errors.extend(e for e in (ttft_error, tpot_error) if e)
    slo = SloTargets(ttft, tpot)
    try:
        check_workload_spec(args.workload)
    except WorkloadError as e:
        errors.append(str(e))
    errors.extend(_output_errors(args))
    if errors:
        raise CliError("\n".join(errors))
    cfg = BenchConfig(
        url=args.url,
        workload=args.workload,
        request_rate=rate,
        num_requests=args.num_requests,
        max_concurrency=args.max_concurrency,
        api_key=args.api_key,
        seed=args.seed,
        timeout_s=args.timeout,
        slo=slo,
        flush_cache=args.flush_cache,
    )
    try:
        workload = load_bench_workload(cfg)
    except WorkloadError as e:
        raise CliError(str(e)) from e
    return cfg, workload


def cmd_bench(args: argparse.Namespace) -> int:
    import asyncio

    from radixsched.client.bench import BenchError, run_bench, run_sweep

    try:
        cfg, workload = _config(args)
    except CliError as e:
        for line in str(e).splitlines():
            print(f"radixsched: error: {line}", file=sys.stderr)
        return 2
    try:
        if args.sweep:
            return _report_sweep(
                args,
                cfg,
                asyncio.run(run_sweep(cfg, between=args.sweep_rates, warmup=args.sweep_warmup)),
            )
        result = asyncio.run(run_bench(cfg, workload))
    except BenchError as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    return _report(args, cfg, result)


def _report(args: argparse.Namespace, cfg: Any, result: Any) -> int:
    from radixsched.client.bench import write_json
    from radixsched.results.requests import request_rows
    from radixsched.results.writers import write_requests

    meta = run_metadata(getattr(args, "_argv", None))
    if args.json_path:
        write_json(args.json_path, result, meta)
    if args.requests_csv:
        write_requests(
            args.requests_csv, request_rows(result.result.policy, result.requests, slo=cfg.slo)
        )
    if not args.quiet:
        print(result.render())
    if result.num_failed:
        print(
            f"radixsched: error: {result.num_failed:,} of {result.result.num_requests:,} "
            "requests failed (reasons above"
            + (")" if not args.quiet else "; run without --quiet)"),
            file=sys.stderr,
        )
        if args.quiet:
            for line in result.failure_lines():
                print(line, file=sys.stderr)
        return EXIT_FAILED
    return 0


def _report_sweep(args: argparse.Namespace, cfg: Any, sweep: Any) -> int:
    from radixsched.client.bench import write_sweep_json
    from radixsched.results.requests import request_rows
    from radixsched.results.writers import write_requests

    write_sweep_json(args.json_path, sweep, run_metadata(getattr(args, "_argv", None)))
    if args.requests_csv:
        rows = []
        for stage, r in sweep.runs:
            rows.extend(request_rows(f"{r.result.policy} ({stage})", r.requests, slo=cfg.slo))
        write_requests(args.requests_csv, rows)
    if not args.quiet:
        print(sweep.render())
        print(f"wrote {args.json_path}")
    if sweep.num_failed:
        total = sum(r.result.num_requests for _, r in sweep.runs)
        print(
            f"radixsched: error: {sweep.num_failed:,} of {total:,} requests failed:",
            file=sys.stderr,
        )
        for line in sweep.failure_lines():
            print(line, file=sys.stderr)
        return EXIT_FAILED
    return 0
