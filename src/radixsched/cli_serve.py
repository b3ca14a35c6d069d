"""The ``serve`` subcommand (registered by ``cli.py``; FastAPI and torch are imported only when
it runs). ``bench`` lives in ``cli_bench``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from radixsched.cli_common import default_threads, scheduler_choices
from radixsched.config import SchedulerConfig, add_config_args, config_from_args

# A running request holds at least a short prompt and its first tokens: a KV pool is never
# given more running-request slots than it has this many tokens per slot. SGLang's own
# sizing (at least 2,048 slots) is meant for GPU pools of millions of tokens.
MIN_TOKENS_PER_RUNNING = 64


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
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: the usable CPUs less one, 1 to 8: "
        f"{default_threads()} here)",
    )
    add_config_args(p, SchedulerConfig, choices=scheduler_choices())
    p.set_defaults(func=cmd_serve)
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    from radixsched.engine.loader import load_model
    from radixsched.engine.runner import TorchRunner
    from radixsched.server.app import MAX_DEFAULT_KV_SLOTS, create_app, engine_for_model, run_server

    try:
        config = config_from_args(SchedulerConfig, args)
    except (TypeError, ValueError) as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    if args.kv_slots is not None and args.kv_slots < 2:
        print("radixsched: error: --kv-slots must be >= 2", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"radixsched: error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads or default_threads())
    try:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype, seed=config.seed)
        kv_slots = args.kv_slots
        if kv_slots is None:
            by_bytes = TorchRunner.kv_slots_for_bytes(loaded, int(args.kv_cache_mb * 2**20))
            kv_slots = min(by_bytes, MAX_DEFAULT_KV_SLOTS)
        if config.max_running_requests is None and kv_slots // MIN_TOKENS_PER_RUNNING < 2048:
            config = config.replace(max_running_requests=max(1, kv_slots // MIN_TOKENS_PER_RUNNING))
        engine, served = engine_for_model(
            loaded,
            config,
            kv_slots=kv_slots,
            context_len=args.context_len,
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
        f"KV {sched.capacity:,} tokens, max running {sched.max_running_requests}, "
        f"policy {config.schedule_policy}, {torch.get_num_threads()} torch threads)",
        file=sys.stderr,
    )
    if sched.capacity < served.context_len:
        print(
            f"radixsched: warning: the KV pool ({sched.capacity:,} tokens) is smaller than the "
            f"context ({served.context_len:,}): longer requests are rejected; raise "
            "--kv-cache-mb or --kv-slots, or lower --context-len",
            file=sys.stderr,
        )
    run_server(app, args.host, args.port, log_level=args.log_level)
    return 0
