"""The ``serve`` subcommand (registered by ``cli.py``; FastAPI and torch are imported only when
it runs). ``bench`` lives in ``cli.bench``."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixsched.cli.common import (
    COMMAND_HELP,
    MODEL_HELP,
    CliError,
    add_threads_arg,
    default_threads,
    model_error,
    scheduler_choices,
    scheduler_config,
    threads_error,
    torch_device,
)
from radixsched.config import SchedulerConfig, add_config_args
from radixsched.server.guard import (
    BODY_BYTES_PER_CONTEXT_TOKEN,
    DEFAULT_MAX_COMPLETION_TOKENS,
    MIN_BODY_LIMIT,
    WILDCARD_BINDS,
    AccessPolicy,
    RequestLimits,
)

if TYPE_CHECKING:
    from radixsched.server.loop import EngineInfo
    from radixsched.server.model import ServedModel

API_KEY_ENV = "RADIXSCHED_API_KEY"
# sglang-router's policy names (server.cluster.ROUTER_POLICIES; repeated here so that building
# the parser imports nothing of the server).
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class _UsageError(Exception):
    pass


# ---- serve ------------------------------------------------------------------------------------


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help=COMMAND_HELP["serve"],
        description="Serve a model with the radixsched scheduler: /v1/completions, "
        "/v1/chat/completions, /generate, /v1/models, /server_info, /health, /metrics, "
        "/flush_cache. Scheduler flags carry SGLang's names.",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--served-model-name", help="name clients send (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    p.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on every endpoint but /health. A key given "
        "here is visible to every user of the machine (ps, /proc/PID/cmdline): prefer "
        f"--api-key-file or ${API_KEY_ENV}. An empty key is refused.",
    )
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="read the API key from this file (surrounding whitespace stripped)",
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        metavar="H[,H...]",
        help="Host header values accepted besides the bound address (loopback names when "
        "bound to loopback; the machine's names and addresses when bound to 0.0.0.0): names, "
        "'.example.com' for a domain and its subdomains, '*' for any. Others get 400 "
        "(protects against DNS rebinding)",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        metavar="O[,O...]",
        help="browser origins (scheme://host[:port], or '*') allowed to send POST requests "
        "besides those of accepted hosts; other cross-site requests get 403",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        metavar="N",
        help=f"request body limit, 413 above it (default: {BODY_BYTES_PER_CONTEXT_TOKEN} bytes "
        f"per context token, at least {MIN_BODY_LIMIT >> 20} MiB)",
    )
    p.add_argument(
        "--max-completion-tokens",
        type=int,
        default=DEFAULT_MAX_COMPLETION_TOKENS,
        metavar="N",
        help="tokens a chat completion may generate when the request sets no max_tokens / "
        "max_completion_tokens (OpenAI's default is the rest of the context: 0 restores it; "
        f"default: {DEFAULT_MAX_COMPLETION_TOKENS}). Explicit limits are honoured as sent",
    )
    p.add_argument("--kv-slots", type=int, help="KV pool size in tokens (default: --kv-cache-mb)")
    p.add_argument(
        "--kv-cache-mb",
        type=float,
        default=256.0,
        help="KV pool memory when --kv-slots is not given (default: 256, at most 131072 slots)",
    )
    p.add_argument("--context-len", type=int, help="context length (default: the model's)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 (default: by device)")
    p.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    p.add_argument(
        "--engine-cpus",
        metavar="LIST",
        help="bind the engine process to these CPUs (e.g. 1 or 2-5,7) and the HTTP process to "
        "the others, so neither takes the other's cores (default: unbound; --threads then "
        "defaults to their number)",
    )
    p.add_argument(
        "--single-process",
        action="store_true",
        help="run the engine on a thread of the server's process (default: a process of its "
        "own, so HTTP and detokenization never hold the interpreter lock the engine's steps "
        "need)",
    )
    add_threads_arg(p)
    _add_cluster_args(p)
    add_config_args(p, SchedulerConfig, choices=scheduler_choices())
    p.set_defaults(func=cmd_serve)
    return p


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dp-size",
        type=int,
        default=1,
        metavar="N",
        help="serve with N workers (each a `radixsched serve` process on a loopback port) "
        "behind sglang-router on --host:--port (needs `pip install 'radixsched[router]'`; "
        "default: 1, no router)",
    )
    p.add_argument(
        "--router-policy",
        default="cache_aware",
        choices=ROUTER_POLICIES,
        help="sglang-router's routing policy with --dp-size (default: cache_aware)",
    )
    _add_metrics_port(p)


def _add_metrics_port(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="where the cluster's metrics are scraped: every worker's /metrics with a worker "
        "label, and their totals (default: 0, a free port, printed at start)",
    )


def add_router_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "router",
        help=COMMAND_HELP["router"],
        description="Run sglang-router in front of radixsched workers already serving "
        "(`radixsched serve` on this or other machines), with the health-check, retry and "
        "circuit-breaker settings `serve --dp-size` uses. Needs `pip install "
        "'radixsched[router]'`.",
    )
    p.add_argument(
        "--worker-urls",
        nargs="+",
        required=True,
        metavar="URL",
        help="the workers' base URLs (http://HOST:PORT)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    p.add_argument(
        "--router-policy",
        default="cache_aware",
        choices=ROUTER_POLICIES,
        help="routing policy (default: cache_aware)",
    )
    _add_metrics_port(p)
    p.set_defaults(func=cmd_router)
    return p


def cmd_router(args: argparse.Namespace) -> int:
    from radixsched.client.bench import url_problem
    from radixsched.server.cluster import ClusterSpec, run_cluster

    errors = [p for url in args.worker_urls if (p := url_problem(url, "--worker-urls"))]
    if not 1 <= args.port <= 65535:
        errors.append(f"--port must be between 1 and 65535, got {args.port}")
    if not 0 <= args.metrics_port <= 65535:
        errors.append(f"--metrics-port must be between 0 and 65535, got {args.metrics_port}")
    if errors:
        return _error(CliError("\n".join(errors)))
    spec = ClusterSpec(
        dp_size=len(args.worker_urls),
        host=args.host,
        port=args.port,
        policy=args.router_policy,
        serve_argv=(),
        threads_per_worker=None,
        worker_urls=tuple(u.rstrip("/") for u in args.worker_urls),
        metrics_port=args.metrics_port,
    )
    return run_cluster(spec)


def engine_cpus(text: str | None, *, single_process: bool) -> tuple[int, ...] | None:
    """``--engine-cpus``: "1", "0,2", "2-5,7" -> sorted CPU ids this process may use, leaving
    at least one for the HTTP process."""
    if text is None:
        return None
    if single_process:
        raise _UsageError(
            "--engine-cpus needs the engine in its own process (not --single-process)"
        )
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise _UsageError(f"--engine-cpus: {text!r} is not a CPU list like 1 or 2-5,7") from None
    usable = set(os.sched_getaffinity(0))
    if not cpus or not cpus <= usable:
        raise _UsageError(
            f"--engine-cpus: {text!r} names CPUs this process may not use "
            f"(usable: {','.join(map(str, sorted(usable)))})"
        )
    if cpus == usable:
        raise _UsageError("--engine-cpus: leave at least one usable CPU for the HTTP process")
    return tuple(sorted(cpus))


def resolve_api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $RADIXSCHED_API_KEY (in that order; the two
    flags exclude each other); None when none is given. An empty key is an error: it would
    silently turn authentication off (``--api-key "$KEY"`` with KEY unset)."""
    if args.api_key is not None and args.api_key_file is not None:
        raise _UsageError("give --api-key or --api-key-file, not both")
    if args.api_key is not None:
        if not args.api_key.strip():
            raise _UsageError('--api-key is empty (an unset variable in --api-key "$KEY"?)')
        return str(args.api_key)
    if args.api_key_file is not None:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise _UsageError(f"cannot read --api-key-file {args.api_key_file}: {e}") from e
        if not key:
            raise _UsageError(f"--api-key-file {args.api_key_file} is empty")
        return key
    if API_KEY_ENV in os.environ:
        key = os.environ[API_KEY_ENV]
        if not key.strip():
            raise _UsageError(f"${API_KEY_ENV} is set but empty")
        return key
    return None


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def limits_from_args(args: argparse.Namespace) -> RequestLimits:
    if args.max_request_bytes is not None and args.max_request_bytes < 1:
        raise _UsageError("--max-request-bytes must be >= 1")
    if args.max_completion_tokens < 0:
        raise _UsageError("--max-completion-tokens must be >= 0")
    return RequestLimits(
        max_request_bytes=args.max_request_bytes,
        max_completion_tokens=args.max_completion_tokens or None,
    )


def access_from_args(args: argparse.Namespace) -> AccessPolicy:
    return AccessPolicy(
        bind_host=args.host,
        allowed_hosts=_split(args.allowed_hosts),
        allowed_origins=_split(args.allowed_origins),
    )


def check_args(args: argparse.Namespace) -> tuple[SchedulerConfig, tuple[int, ...] | None]:
    """The flags that need no model: the scheduler config and the engine's CPUs, or
    ``CliError`` with one line per bad flag, each naming it (before anything starts)."""
    from radixsched.engine.loader import resolve_dtype

    errors: list[str] = []
    config: SchedulerConfig | None = None
    cpus: tuple[int, ...] | None = None
    try:
        config = scheduler_config(args)
    except CliError as e:
        errors.append(str(e))
    if not 0 <= args.port <= 65535:
        errors.append(f"--port must be between 0 and 65535, got {args.port}")
    if args.kv_slots is not None and args.kv_slots < 2:
        errors.append(f"--kv-slots must be >= 2, got {args.kv_slots}")
    if not (math.isfinite(args.kv_cache_mb) and args.kv_cache_mb > 0):
        errors.append(f"--kv-cache-mb must be a finite number > 0, got {args.kv_cache_mb}")
    if args.context_len is not None and args.context_len < 1:
        errors.append(f"--context-len must be >= 1, got {args.context_len}")
    if err := threads_error(args.threads):
        errors.append(err)
    try:
        cpus = engine_cpus(args.engine_cpus, single_process=args.single_process)
    except _UsageError as e:
        errors.append(str(e))
    try:
        device = torch_device(args.device)
    except CliError as e:
        errors.append(str(e))
    else:
        try:
            resolve_dtype(args.dtype, device)
        except ValueError as e:
            errors.append(f"--dtype: {e}")
    if errors or config is None:
        raise CliError("\n".join(errors))
    return config, cpus


def check_cluster_args(args: argparse.Namespace, api_key: str | None) -> None:
    """``--dp-size`` and the flags it cannot serve yet."""
    if not 1 <= args.dp_size <= MAX_DP_SIZE:
        raise _UsageError(f"--dp-size must be between 1 and {MAX_DP_SIZE}, got {args.dp_size}")
    if api_key is not None:
        raise _UsageError(
            "--dp-size does not take an API key yet: serve the workers behind "
            "your own proxy, or run the router yourself (README: Several workers)"
        )
    if args.engine_cpus is not None:
        raise _UsageError(
            "--dp-size does not take --engine-cpus (each worker would bind the same CPUs)"
        )
    if args.port == 0:
        raise _UsageError("--dp-size needs a --port other than 0 (the router's port)")
    if not 0 <= args.metrics_port <= 65535:
        raise _UsageError(f"--metrics-port must be between 0 and 65535, got {args.metrics_port}")


MAX_DP_SIZE = 64


def _serve_cluster(args: argparse.Namespace) -> int:
    from radixsched.server.cluster import ClusterSpec, run_cluster

    threads = None if args.threads else max(1, default_threads() // args.dp_size)
    spec = ClusterSpec(
        dp_size=args.dp_size,
        host=args.host,
        port=args.port,
        policy=args.router_policy,
        serve_argv=tuple(args._argv),
        threads_per_worker=threads,
        metrics_port=args.metrics_port,
    )
    return run_cluster(spec)


def _error(e: Exception) -> int:
    for line in str(e).splitlines() or ["(no message)"]:
        print(f"radixsched: error: {line}", file=sys.stderr)
    return 2


def _print_serving(
    args: argparse.Namespace,
    served: ServedModel,
    info: EngineInfo,
    threads: int,
    layout: str,
    cpus: tuple[int, ...] | None,
    limits: RequestLimits,
    access: AccessPolicy,
    api_key: str | None,
) -> None:
    """The start-up line, and what a user should know about the settings."""
    if cpus:
        layout += f" on CPUs {','.join(map(str, cpus))}"
    print(
        f"serving {served.name} on http://{args.host}:{args.port}  (context {served.context_len}, "
        f"KV {info.kv_slots:,} tokens, max running {info.max_running_requests}, "
        f"policy {info.config.schedule_policy}, {threads} torch threads, {layout}, "
        f"body limit {limits.body_limit(served.context_len):,} bytes, "
        f"API key {'required' if api_key else 'off'})",
        file=sys.stderr,
    )
    if access.bind_host.strip("[]") in WILDCARD_BINDS and not access.allowed_hosts:
        print(
            "note: requests must name this machine (its host name or one of its addresses) in "
            "their Host header; add the DNS names clients use with --allowed-hosts",
            file=sys.stderr,
        )
    if info.kv_slots < served.context_len:
        print(
            f"radixsched: warning: the KV pool ({info.kv_slots:,} tokens) is smaller than the "
            f"context ({served.context_len:,}): longer requests are rejected; raise "
            "--kv-cache-mb or --kv-slots, or lower --context-len",
            file=sys.stderr,
        )


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        api_key = resolve_api_key(args)
        limits = limits_from_args(args)
        access = access_from_args(args)
        config, cpus = check_args(args)
        if args.dp_size != 1:
            check_cluster_args(args, api_key)
        elif args.metrics_port != 0:
            raise _UsageError("--metrics-port applies to --dp-size N only: add it, or drop this")
    except (_UsageError, CliError) as e:
        return _error(e)
    if args.dp_size != 1:
        return _serve_cluster(args)

    from radixsched.engine.build import tokenizer_dir
    from radixsched.engine.loader import load_tokenizer
    from radixsched.server.app import create_app, run_server
    from radixsched.server.loop import Engine
    from radixsched.server.model import served_model
    from radixsched.server.process import (
        EngineProcess,
        EngineSpec,
        EngineStartError,
        build_engine_loop,
        freeze_startup_heap,
    )

    # The model's files are read here first (no weights): a bad one fails before the engine
    # starts, naming the file.
    try:
        tokenizer = load_tokenizer(args.model)
    except FileNotFoundError as e:
        return _error(e)
    except ValueError as e:
        return _error(CliError(model_error(args.model, e)))
    spec = EngineSpec(
        model=args.model,
        config=config,
        device=args.device,
        dtype=args.dtype,
        kv_slots=args.kv_slots,
        kv_cache_mb=args.kv_cache_mb,
        context_len=args.context_len,
        threads=args.threads or (min(len(cpus), 8) if cpus else default_threads()),
        cpus=cpus,
    )
    engine: Engine | None = None
    try:
        if args.single_process:
            engine = loop = build_engine_loop(spec)
            info = loop.info
        else:
            engine = proc = EngineProcess(spec)
            info = proc.launch()
        served = served_model(
            tokenizer,
            info.context_len,
            served_model_name=args.served_model_name,
            tokenizer_path=tokenizer_dir(args.model, tokenizer.tokenizer),
        )
    except (EngineStartError, ValueError, FileNotFoundError) as e:
        if engine is not None:
            engine.stop()
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    if cpus:  # the engine has its CPUs; this process (and its threads to come) the others
        os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - set(cpus))
    app = create_app(engine, served, api_key=api_key, limits=limits, access=access)
    layout = "engine on a thread" if args.single_process else f"engine process {proc.pid}"
    _print_serving(args, served, info, spec.threads, layout, cpus, limits, access, api_key)
    freeze_startup_heap()
    run_server(app, args.host, args.port, log_level=args.log_level)
    return 0
