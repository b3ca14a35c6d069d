"""The ``serve`` and ``bench`` subcommands (registered by ``cli.py``; FastAPI, torch and httpx
are imported only when a command runs)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from radixsched.cli_common import scheduler_choices
from radixsched.config import SchedulerConfig, add_config_args, config_from_args

DEFAULT_BENCH_WORKLOAD = (
    "shared-prefix:groups=8,prompts=8,system_len=256,question_len=32,output_len=32"
)


class _UsageError(Exception):
    pass


# ---- serve ------------------------------------------------------------------------------------


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI-compatible API, /generate, /metrics)",
        description="Serve a model with the radixsched scheduler: /v1/completions, "
        "/v1/chat/completions, /generate, /v1/models, /server_info, /health, /metrics, "
        "/flush_cache. Scheduler flags carry SGLang's names.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="tiny-random, <shape>-random, smollm2-135m, a model directory or a .gguf file",
    )
    p.add_argument("--served-model-name", default=None, help="name clients send (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health",
    )
    p.add_argument(
        "--kv-slots", type=int, default=None, help="KV pool size in tokens (default: --kv-cache-mb)"
    )
    p.add_argument(
        "--kv-cache-mb",
        type=float,
        default=256.0,
        help="KV pool memory when --kv-slots is not given (default: 256, at most 131072 slots)",
    )
    p.add_argument(
        "--context-len", type=int, default=None, help="context length (default: the model's)"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: by device)")
    p.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    add_config_args(p, SchedulerConfig, choices=scheduler_choices())
    p.set_defaults(func=cmd_serve)
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    from radixsched.server.app import build_engine, create_app, run_server

    try:
        config = config_from_args(SchedulerConfig, args)
    except (TypeError, ValueError) as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    if args.kv_slots is not None and args.kv_slots < 2:
        print("radixsched: error: --kv-slots must be >= 2", file=sys.stderr)
        return 2
    try:
        engine, served = build_engine(
            args.model,
            config,
            kv_slots=args.kv_slots,
            kv_cache_mb=args.kv_cache_mb,
            context_len=args.context_len,
            device=args.device,
            dtype=args.dtype,
            seed=config.seed,
            served_model_name=args.served_model_name,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    app = create_app(engine, served, api_key=args.api_key)
    sched = engine.scheduler
    print(
        f"serving {served.name} on http://{args.host}:{args.port}  (context {served.context_len}, "
        f"KV {sched.capacity} tokens, max running {sched.max_running_requests}, "
        f"policy {config.schedule_policy})",
        file=sys.stderr,
    )
    run_server(app, args.host, args.port, log_level=args.log_level)
    return 0


# ---- bench ---------------------------------------------------------------------------------------


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="load a running server with a workload and report latency, throughput, hit rate",
        description="Send a workload from the simulator's registry to a server's /generate "
        "(token ids, streaming) and report TTFT, inter-token latency, e2e latency, throughput "
        "and the server's cache hit rate, with the simulator's metric names.",
    )
    p.add_argument("--url", default="http://127.0.0.1:30000", help="server base URL")
    p.add_argument(
        "--workload",
        default=DEFAULT_BENCH_WORKLOAD,
        help=f"workload spec as for simulate (default: {DEFAULT_BENCH_WORKLOAD})",
    )
    p.add_argument(
        "--request-rate",
        default="inf",
        help="Poisson arrivals per second, or 'inf' to send every request at once (default: inf; "
        "--max-concurrency still applies)",
    )
    p.add_argument("--num-requests", type=int, default=None, help="take the first N requests")
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight at most (default: all)",
    )
    p.add_argument("--api-key", default=None, help="bearer token for a server run with --api-key")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="per-request timeout in seconds (default: 600)"
    )
    p.add_argument("--json", dest="json_path", default=None, help="write the result as JSON")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "--flush-cache",
        action="store_true",
        help="empty the server's prefix cache before the run (POST /flush_cache)",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="the calibrating sweep: synchronous, a throughput probe, then --sweep-rates "
        "Poisson rates between, each from a cold cache, into one --json file for "
        "'radixsched calibrate'",
    )
    p.add_argument(
        "--sweep-rates",
        type=int,
        default=3,
        help="with --sweep: Poisson rates between synchronous and throughput (default: 3)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def _parse_rate(text: str) -> float:
    if text.lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError as e:
        raise _UsageError(f"--request-rate must be a number or 'inf', got {text!r}") from e
    if not rate > 0:
        raise _UsageError(f"--request-rate must be > 0, got {text!r}")
    return rate


def cmd_bench(args: argparse.Namespace) -> int:
    import asyncio

    from radixsched.server.bench import (
        BenchConfig,
        BenchError,
        run_bench,
        run_sweep,
        write_json,
        write_sweep_json,
    )
    from radixsched.sim.workloads import WorkloadError

    try:
        rate = _parse_rate(args.request_rate)
        if args.max_concurrency is not None and args.max_concurrency < 1:
            raise _UsageError("--max-concurrency must be >= 1")
        cfg = BenchConfig(
            url=args.url,
            workload=args.workload,
            request_rate=rate,
            num_requests=args.num_requests,
            max_concurrency=args.max_concurrency,
            api_key=args.api_key,
            seed=args.seed,
            timeout_s=args.timeout,
            flush_cache=args.flush_cache,
        )
        if args.sweep:
            if not args.json_path:
                raise _UsageError("--sweep needs --json FILE (the file calibrate reads)")
            sweep = asyncio.run(run_sweep(cfg, between=args.sweep_rates))
        else:
            result = asyncio.run(run_bench(cfg))
    except (_UsageError, WorkloadError, BenchError) as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    if args.sweep:
        write_sweep_json(args.json_path, sweep)
        if not args.quiet:
            print(sweep.render())
            print(f"wrote {args.json_path}")
        return 0 if all(r.num_failed == 0 for _, r in sweep.runs) else 1
    if args.json_path:
        write_json(args.json_path, result)
    if not args.quiet:
        print(result.render())
    return 0 if result.num_failed == 0 else 1
