"""``radixsched``: simulate, sweep, generate, serve, bench.

Scheduler flags carry SGLang's names and come from ``SchedulerConfig``; simulator flags come from
``SimConfig``: the help text and defaults are generated from the dataclasses, so they never drift.
``simulate --config run.yaml`` takes the same keys as the flags (``sim.settings.runconfig``, the schema
sweep configs use too); flags given on the command line override the file. Every setting and
output path is checked before any work starts. Heavy modules (torch, FastAPI, ray, plotly) are
imported only by the subcommand that needs them."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from radixsched.cli.common import (
    CliError,
    output_errors,
    platform_entry,
    rich_console,
    run_metadata,
    scheduler_choices,
)
from radixsched.config import SchedulerConfig, add_config_args
from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD, MAIN_POLICIES

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from rich.console import Console

    from radixsched.results.table import Runtime
    from radixsched.sim.policy_runs import PolicyOutcome
    from radixsched.sim.settings.runconfig import RunSettings
    from radixsched.sim.settings.simconfig import SimConfig
    from radixsched.sim.workloads.load import Workload

# Exit statuses: 0 ok; 1 a policy served no request; 2 a usage error (nothing was run).
EXIT_SERVED_NOTHING = 1


def _is_policy(name: str) -> bool:
    """Whether ``name`` is registered; a built-in name is found without the plugin scan that
    a listing makes (``policies.PolicyRegistry``)."""
    from radixsched.policies import POLICIES

    return name in POLICIES


# ---- simulate ---------------------------------------------------------------------------------

SIMULATE_USAGE = (
    "radixsched simulate [--workload SPEC] [--policy A,B,...|all] [--request-rate R]\n"
    "                           [--config RUN.yaml] [--json PATH] [--report PATH] [options]"
)


def _simulate_epilog() -> str:
    from radixsched.sim.cost.hardware import MODELS
    from radixsched.sim.settings.runconfig import RATE_RULE
    from radixsched.sim.workloads.spec import describe_workloads

    return (
        "workloads (--workload NAME:k=v,... or NAME:PATH; params not given take these "
        "defaults):\n"
        + describe_workloads()
        + "\n\nmodel presets (--model): "
        + ", ".join(MODELS)
        + "; the local engine's tiny-random and smollm2-135m"
        + "\n\narrivals: "
        + RATE_RULE
        + ".\n\ntrace prompts: a trace's first full load stores its prompts under "
        "$RADIXSCHED_CACHE_DIR (default ~/.cache/radixsched)/prompts, and later runs of the same "
        "file map them (the header says so); RADIXSCHED_PROMPT_CACHE=off turns it off, "
        "RADIXSCHED_CACHE_MAX_GB caps the folder in GB, 8 unless set."
        + "\n\nexit status: 0 when every policy served requests, 1 when a policy served "
        "none (the reason is printed), 2 on a usage error (nothing is run). An overloaded "
        "system (offered load above what it serves, the queue growing) is a warning."
    )


def _add_simulate_args(p: argparse.ArgumentParser) -> None:
    from radixsched.sim.cost.hardware import gpu_name
    from radixsched.sim.settings.simconfig import SimConfig

    run = p.add_argument_group("workload and policies")
    run.add_argument(
        "--config",
        metavar="RUN.yaml",
        help="YAML file of settings with the flags' names (request_rate: 8, gpu: h100, "
        "policy: [fcfs, lpm], ...); flags given here override it",
    )
    run.add_argument(
        "--workload",
        metavar="SPEC",
        help=f"workload spec, listed below (default: {DEFAULT_WORKLOAD})",
    )
    run.add_argument(
        "--policy",
        metavar="A,B|all",
        help="policies to compare, comma-separated, or 'all' (default: "
        + ",".join(MAIN_POLICIES)
        + "); --schedule-policy NAME runs one",
    )
    run.add_argument(
        "--request-rate",
        metavar="R",
        help="Poisson arrivals per second, or 'inf' for all at once (default: the trace's "
        "timestamps; generated workloads: inf)",
    )
    run.add_argument(
        "--num-requests",
        type=int,
        metavar="N",
        help="take the first N requests by arrival (a trace builds only their prompts)",
    )
    run.add_argument(
        "--workload-seed",
        type=int,
        metavar="N",
        help="seed of the workload generator and of Poisson arrivals (default: --seed)",
    )
    slo = p.add_argument_group("SLO goodput")
    slo.add_argument(
        "--slo-ttft-ms",
        type=float,
        metavar="MS",
        help="TTFT target: report the share of requests meeting every target, and goodput",
    )
    slo.add_argument("--slo-tpot-ms", type=float, metavar="MS", help="TPOT target")
    out = p.add_argument_group("outputs (every path is checked before the run starts)")
    out.add_argument("--json", metavar="PATH", help="results and settings as JSON")
    out.add_argument("--csv", metavar="PATH", help="one CSV row per policy")
    out.add_argument(
        "--report", metavar="PATH", help="a self-contained HTML report with interactive charts"
    )
    out.add_argument(
        "--requests-csv",
        metavar="PATH",
        help="one row per request and policy (CSV; Parquet if PATH ends in .parquet, "
        "needs pyarrow)",
    )
    out.add_argument("--quiet", action="store_true", default=None, help="no progress bars")
    run.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="policies simulated at once, each in a process of its own (forked after the "
        "load; the same results as one at a time). Default on Linux: one per CPU, at most one "
        "per policy; elsewhere, and with 1, they run in this process",
    )
    add_config_args(
        p,
        SchedulerConfig,
        choices=scheduler_choices(),
        overrides={
            "schedule_policy": {
                "help": "the one policy to run (SGLang's flag; --policy compares several)"
            },
            "seed": {
                "help": "seed of the random policy, the router and the simulated tokens; also "
                "of the workload and arrivals unless --workload-seed is given (default: 0)"
            },
        },
    )
    add_config_args(
        p,
        SimConfig,
        choices=_sim_choices(),
        overrides={
            "gpu": {
                "type": gpu_name,
                "help": "GPU preset (any case and common spellings: a100 = A100-80G)",
            },
            "model": {
                "help": "model preset (listed below; any case, Hugging Face ids too), or a "
                "Hugging Face config.json (a file or a model directory)"
            },
            "tp": {"aliases": ["--tp-size"]},
            "calibration": {"metavar": "PATH"},
            "dp": {"aliases": ["--dp-size"]},
            "decode_tp": {"aliases": ["--disaggregation-decode-tp"]},
            "prefill_gpu": {"type": gpu_name},
            "decode_gpu": {"type": gpu_name},
        },
    )


def _sim_choices() -> dict[str, list[str]]:
    from radixsched.cluster.routers import ROUTERS
    from radixsched.sim.cost.hardware import GPUS

    # --model takes a preset (any case, common spellings, Hugging Face ids) or a config.json
    # path, so it has no choices; an unknown name fails in the early checks, listing presets.
    gpus, routers = list(GPUS), list(ROUTERS)
    return {
        "router": routers,
        "decode_router": routers,
        "gpu": gpus,
        "prefill_gpu": gpus,
        "decode_gpu": gpus,
    }


# Simulate's own flags (not config fields): their argparse dests.
_OWN_FLAGS = (
    "workload", "policy", "request_rate", "num_requests", "workload_seed", "slo_ttft_ms",
    "slo_tpot_ms", "json", "csv", "report", "requests_csv", "quiet", "jobs",
)  # fmt: skip


def _given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """Settings given on the command line: simulate's own flags that are not None and the
    config flags argparse set (their default is SUPPRESS)."""
    from radixsched.sim.settings.simconfig import SimConfig

    config_fields = {
        f.name for cls in (SchedulerConfig, SimConfig) for f in dataclasses.fields(cls)
    }
    given = {k: v for k, v in vars(args).items() if k in _OWN_FLAGS and v is not None}
    given.update({k: v for k, v in vars(args).items() if k in config_fields})
    return given


def _policies(file: Mapping[str, Any], flags: Mapping[str, Any]) -> list[str]:
    """--policy (a list) or --schedule-policy (one); flags override the config file."""
    sources = ((flags, "the command line", "--policy"), (file, "the config file", "policy"))
    for source, where, key in sources:
        has_list = source.get("policy") is not None
        has_one = source.get("schedule_policy") is not None
        if has_list and has_one:
            raise CliError(
                f"give --policy or --schedule-policy, not both (on {where}): --policy "
                "compares several policies, --schedule-policy runs one"
            )
        if has_list:
            return _policy_list(source["policy"], key)
        if has_one:
            one = source["schedule_policy"]
            if isinstance(one, list | dict):
                raise CliError(
                    f"schedule_policy: expected one policy name, got {one!r} (policy: [a, b] "
                    "compares several)"
                )
            return [str(one)]
    return [n for n in MAIN_POLICIES if _is_policy(n)]


def _policy_list(value: Any, key: str = "--policy") -> list[str]:
    """The policies ``value`` names (a list or comma-separated names, or 'all'), each once."""
    if isinstance(value, dict):
        raise CliError(f"{key}: expected policy names, got {value!r}")
    if isinstance(value, list):
        chosen = [str(v).strip() for v in value]
    else:
        chosen = [v.strip() for v in str(value).split(",")]
    chosen = [c for c in chosen if c]
    if chosen == ["all"]:
        from radixsched.policies import policy_names

        return policy_names()
    if not chosen:
        raise CliError(f"{key} needs at least one policy name (or 'all')")
    twice = sorted({c for c in chosen if chosen.count(c) > 1})
    if twice:
        raise CliError(
            f"{key}: {', '.join(twice)} given twice: each policy runs once (its results are "
            "keyed by its name)"
        )
    return chosen


def _normalise_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Keys with '-' as '_'; two spellings of one key (request-rate, request_rate) are an
    error, not a silent choice of the last."""
    from radixsched.sim.settings.limits import RunConfigError

    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in out:
            raise RunConfigError(f"setting {key!r} is given twice: as {spelled[key]!r} and {k!r}")
        out[key], spelled[key] = v, str(k)
    return out


def _settings(args: argparse.Namespace) -> tuple[RunSettings, list[str]]:
    """The run's settings from --config and the flags, and the policies to run."""
    from radixsched.sim.settings.limits import RunConfigError
    from radixsched.sim.settings.runconfig import load_yaml, resolve

    flags = _given_flags(args)
    file: dict[str, Any] = {}
    try:
        if args.config:
            file = _normalise_keys(load_yaml(args.config))
        policies = _policies(file, flags)
        merged = {**file, **flags}
        # The policy list is resolved above; the scheduler config gets each name in turn.
        merged.pop("policy", None)
        merged.pop("schedule_policy", None)
        labels = {k: "--" + k.replace("_", "-") for k in flags}
        rs = resolve(merged, cli=True, labels=labels)
    except (RunConfigError, CliError) as e:
        # A problem of the file is prefixed with its name; one of a flag names the flag.
        text = str(e)
        in_file = args.config and not text.startswith((str(args.config), "--", "give --"))
        raise CliError(f"{args.config}: {text}" if in_file else text) from e
    return rs, policies


def _cli_errors(rs: RunSettings, config: str | None = None) -> list[str]:
    """Problems of simulate's own settings: output paths (writable, none of them an input
    file or another output), ``jobs``."""
    from radixsched.sim.settings.runconfig import OUTPUT_KEYS

    errors = []
    jobs = rs.cli.get("jobs")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        errors.append(f"jobs must be a positive integer, got {jobs!r}")
    outputs = [
        ("--" + key.replace("_", "-"), str(rs.cli[key]))
        for key in OUTPUT_KEYS
        if rs.cli.get(key) is not None
    ]
    return errors + output_errors(outputs, _input_files(rs, config))


def _input_files(rs: RunSettings, config: str | None) -> list[tuple[str, str]]:
    """(what, path) of every file the run reads: the config file, the trace, the model's
    config.json and the calibration file."""
    from radixsched.sim.preflight import input_files

    files = [("the --config file", config)] if config else []
    inputs = input_files(rs, DEFAULT_WORKLOAD)
    return files + [(f"the --{flag} {what}", path) for flag, what, path in inputs]


def _slo(rs: RunSettings) -> Any:
    from radixsched.results.requests import SloTargets

    return SloTargets(
        ttft_s=None if rs.slo_ttft_ms is None else rs.slo_ttft_ms / 1e3,
        tpot_s=None if rs.slo_tpot_ms is None else rs.slo_tpot_ms / 1e3,
    )


# The modules every run of simulate imports beyond its parser's (the parser's own are
# imported by then): ``import_run_modules`` imports them in the process's start, while the
# collector is paused (``cli.common.pause_collection_for_start``), so that their thousands of
# lasting objects (classes, functions, the dataclasses' generated methods) go straight to
# the oldest generation instead of through about 40 young passes, and the young passes of
# the setup and the run that follow never walk them. Nothing is imported that a run of
# built-in policies would not import anyway (``tests/test_cli_start.py``).
RUN_MODULES = (
    "rich.console",
    "rich.markup",
    "rich.table",
    "radixsched.results.table",
    "radixsched.results.writers",
    "radixsched.sim.cost.build",
    "radixsched.sim.cost.hfconfig",
    "radixsched.sim.cost.runner",
    "radixsched.sim.heap",
    "radixsched.sim.policy_runs",
    "radixsched.sim.preflight",
    "radixsched.sim.settings.engine_modes",
)


def import_run_modules() -> None:
    """Import ``RUN_MODULES`` (``cli.main`` calls it before the start's end)."""
    from importlib import import_module

    for name in RUN_MODULES:
        import_module(name)


def cmd_simulate(args: argparse.Namespace) -> int:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.heap import paused_gc

    meta = run_metadata(getattr(args, "_argv", None), with_platform=False)  # (``_finish``)
    rs, policies = _settings(args)
    # With the collector on: the preflight's throw-away schedulers are cycles that hold their
    # KV pools' tables, freed by the young passes as it goes (``tests/test_cli_start.py``).
    _preflight(rs, policies, args.config)
    base = rs.scheduler_config()
    sim_cfg: SimConfig = rs.sim_config()
    cost = build_cost_model(sim_cfg)
    console = rich_console(100)
    # As the program (its exit frees nothing, ``cli.main``), the load's objects, which last
    # the run, are frozen before any pass walks them, once one young pass has freed what the
    # preflight left in the young generations: each run's frozen heap
    # (``sim.heap.frozen_heap``) then finds them frozen, without the full collection that
    # would walk them all (1.4 s of a 1M-request run, its 5M objects, to free 58), and the
    # command's end, however it ends, thaws them into the oldest generation. A call (a test,
    # a caller's process that goes on) leaves the collector's generations as they are.
    program = getattr(args, "_left_to_exit", None) is not None
    if program:
        gc.collect(1)
    with paused_gc():
        workload = _load(rs, base.seed)
        # (with the load's few small garbage cycles: a class, its descriptors)
        thaw = program and gc.get_freeze_count() == 0
        if thaw:
            gc.freeze()
    try:
        return _simulate_loaded(args, rs, policies, meta, workload, (base, sim_cfg, cost), console)
    finally:
        if thaw:
            gc.unfreeze()


def _simulate_loaded(
    args: argparse.Namespace,
    rs: RunSettings,
    policies: Sequence[str],
    meta: Mapping[str, Any],
    workload: Workload,
    configs: tuple[SchedulerConfig, SimConfig, Any],
    console: Console,
) -> int:
    """``cmd_simulate`` once the workload is loaded: the header, the runs, the outputs.
    ``configs``: the scheduler's and the simulator's settings, and the cost model."""
    from radixsched.results.table import Runtime
    from radixsched.sim.heap import tune_heap
    from radixsched.sim.policy_runs import PolicyFailed, PolicyRuns, default_jobs, run_policies
    from radixsched.sim.workloads.load import workload_optimal_hit_rate

    base, sim_cfg, cost = configs
    slo = _slo(rs)
    quiet = bool(rs.cli.get("quiet"))
    spec = rs.workload.spec or DEFAULT_WORKLOAD
    # After the load: the heap setting is for the simulation's churn; under it the load's
    # thousands of prompt-sized arrays fault in more pages (3x-shared: 302k against 195k).
    tune_heap()
    opt = workload_optimal_hit_rate(workload, page_size=base.hit_unit)
    config_info = _config_info(base, sim_cfg, cost, policies, slo)
    workload_info = _workload_info(spec, workload, rs, opt)
    for line in _header(meta, workload, workload_info, config_info):
        console.print(line, highlight=False)
    on_progress, display = (None, None) if quiet else _progress(console, policies, workload)
    keep_rows = bool(rs.cli.get("requests_csv"))
    runs = PolicyRuns(workload, base, sim_cfg, optimal_hit_rate=opt, slo=slo, keep_rows=keep_rows)
    jobs = int(rs.cli.get("jobs") or default_jobs(len(policies)))
    left = getattr(args, "_left_to_exit", None)
    if left is not None:
        left.append(runs)  # with the workload: freed by nothing but the exit
    start = time.perf_counter()
    try:
        outcomes = run_policies(runs, policies, jobs, on_progress, display=display, left=left)
    except PolicyFailed as e:  # a combination only the run itself rejects
        raise CliError(str(e)) from e
    except _broken_pool() as e:
        raise CliError(f"a simulation process died ({e}); try --jobs 1") from e
    elapsed = time.perf_counter() - start
    runtime = Runtime(elapsed, min(jobs, len(policies)))
    return _finish(outcomes, console, rs, meta, workload_info, config_info, slo, runtime)


def _preflight(rs: RunSettings, policies: Sequence[str], config: str | None) -> None:
    """Every problem of the run's settings, before anything is loaded: ``CliError``."""
    from radixsched.sim.preflight import check

    errors = check(rs, policies, default_workload=DEFAULT_WORKLOAD) + _cli_errors(rs, config)
    if errors:
        raise CliError("\n".join(errors))


def _load(rs: RunSettings, seed: int) -> Workload:
    """The run's workload (its prompts deferred where they would not fit; ``seed``: the
    scheduler's, unless the workload has its own): ``CliError`` for a workload that cannot be
    built."""
    from radixsched.sim.workloads.load import load_workload
    from radixsched.sim.workloads.tokens import WorkloadError

    wl = rs.workload
    try:
        return load_workload(
            wl.spec or DEFAULT_WORKLOAD,
            request_rate=wl.request_rate,
            num_requests=wl.num_requests,
            seed=seed if wl.seed is None else wl.seed,
            defer_prompts=True,
        )
    except WorkloadError as e:
        raise CliError(str(e)) from e


def _progress(
    console: Console, policies: Sequence[str], workload: Workload
) -> tuple[Callable[[int, int, int], None], AbstractContextManager[Any]]:
    """A progress bar per policy on ``console``: the callback the runs report to, and the
    display to show while they run. Not called with ``--quiet`` (nothing is shown), which
    then never imports ``rich.progress``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} requests"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        # Redrawn on a timer only where a redraw shows: into a file or a pipe the display is
        # written once, when it stops, so a timer thread there would only take the GIL (and a
        # core) from the run.
        auto_refresh=console.is_jupyter or (console.is_terminal and not console.is_dumb_terminal),
    )
    tasks = [progress.add_task(name, total=len(workload.requests)) for name in policies]

    def on_progress(i: int, done: int, total: int) -> None:
        progress.update(tasks[i], completed=done)

    return on_progress, progress


def _broken_pool() -> tuple[type[Exception], ...]:
    """``BrokenProcessPool``, the error of a pool whose worker died, once a pool exists (its
    module is imported only by a run in workers); before that nothing can raise it."""
    module = sys.modules.get("concurrent.futures.process")
    return () if module is None else (module.BrokenProcessPool,)


def _finish(
    runs: Sequence[PolicyOutcome],
    console: Console,
    rs: RunSettings,
    meta: Mapping[str, Any],
    workload_info: Mapping[str, Any],
    config_info: Mapping[str, Any],
    slo: Any,
    runtime: Runtime,
) -> int:
    from rich.console import Console

    from radixsched.results.recommend import load_warnings, served_nothing_lines
    from radixsched.results.table import render_comparison
    from radixsched.results.writers import write_csv, write_json, write_requests

    results = [r.result for r in runs]
    render_comparison(results, console, runtime=runtime)
    reasons = {r.result.policy: r.failures for r in runs}
    nothing = served_nothing_lines(results, reasons)
    warnings = load_warnings(results)
    err = Console(stderr=True, width=console.width, highlight=False, emoji=False)
    for line in warnings:
        err.print(f"warning: {line}" if not line.startswith("  ") else line, markup=False)
    outputs = rs.cli
    if outputs.get("json"):
        meta = {**meta, **platform_entry()}  # the one output that records the platform
        write_json(outputs["json"], workload_info, config_info, results, meta)
        console.print(f"wrote {outputs['json']}", highlight=False)
    if outputs.get("csv"):
        write_csv(results, outputs["csv"])
        console.print(f"wrote {outputs['csv']}", highlight=False)
    if outputs.get("requests_csv"):
        rows = [row for run in runs for row in run.rows or []]
        write_requests(outputs["requests_csv"], rows)
        console.print(f"wrote {outputs['requests_csv']} ({len(rows):,} rows)", highlight=False)
    if outputs.get("report"):
        from radixsched.results.report import write_report

        write_report(
            outputs["report"],
            workload_info,
            config_info,
            results,
            {r.result.policy: r.series for r in runs},
            {r.result.policy: r.ttft_s for r in runs},
            warnings=[*warnings, *nothing],
            meta=meta,
        )
        console.print(f"wrote {outputs['report']}", highlight=False)
    for line in nothing:
        err.print(f"radixsched: error: {line}", markup=False)
    return EXIT_SERVED_NOTHING if nothing else 0


def _config_info(
    base: SchedulerConfig, sim_cfg: Any, cost: Any, policies: Sequence[str], slo: Any
) -> dict[str, Any]:
    from radixsched.cluster.routers import default_router_name

    router = (sim_cfg.router or default_router_name(sim_cfg.dp)) if sim_cfg.dp > 1 else None
    if sim_cfg.disaggregation:
        from radixsched.cluster.routers import DEFAULT_ROUTER

        router = sim_cfg.router or DEFAULT_ROUTER
    return {
        "policies": list(policies),
        "dp": sim_cfg.dp,
        "router": router,
        "compat": base.compat,
        "kv_capacity_tokens": int(cost.kv_capacity_tokens()),
        "cost_model": cost.describe(),
        "disaggregation": _disagg_info(sim_cfg),
        "slo": {
            "ttft_ms": None if slo.ttft_s is None else slo.ttft_s * 1e3,
            "tpot_ms": None if slo.tpot_s is None else slo.tpot_s * 1e3,
        },
        "scheduler": dataclasses.asdict(base),
        "sim": dataclasses.asdict(sim_cfg),
    }


def _disagg_info(sim_cfg: Any) -> dict[str, Any] | None:
    """The split deployment a run simulates (None: co-located)."""
    if not sim_cfg.disaggregation:
        return None
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.disagg import DEFAULT_DECODE_ROUTER, LinkModel
    from radixsched.sim.settings.deployment import deployment_label, gpu_count, role_specs

    roles, costs = {}, []
    for name, spec in zip(("prefill", "decode"), role_specs(sim_cfg), strict=True):
        cost = build_cost_model(spec.sim_config(sim_cfg, host_tier=name == "prefill"))
        costs.append(cost)
        roles[name] = {
            "instances": getattr(sim_cfg, f"{name}_instances"),
            "gpu": cost.gpu.name,
            "tp": spec.tp,
            "kv_capacity_tokens": int(cost.kv_capacity_tokens()),
        }
    return {
        "deployment": deployment_label(sim_cfg),
        "gpus": gpu_count(sim_cfg),
        **roles,
        "decode_router": sim_cfg.decode_router or DEFAULT_DECODE_ROUTER,
        "link": LinkModel.between(sim_cfg, *costs).to_json(),
    }


def _workload_info(spec: str, workload: Workload, rs: RunSettings, opt: float) -> dict[str, Any]:
    from radixsched.sim.settings.runconfig import RATE_RULE

    rate = rs.workload.request_rate
    return {
        "spec": spec,
        "name": workload.name,
        "params": workload.params,
        "num_requests": len(workload.requests),
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
        "request_rate": "inf" if rate is not None and rate == float("inf") else rate,
        "arrivals": workload.arrivals,
        "prompts": workload.prompts,
        "arrival_rule": None if rate is not None else RATE_RULE,
        "workload_seed": rs.workload.seed,
        "optimal_hit_rate": opt,
    }


# Cost-model terms that are off (0) by default: shown in the header only when on.
_EXTRA_TERMS = (
    ("prefill_eff_tokens", "prefill efficiency T0", 1.0, " tokens"),
    ("sched_step_s", "scheduler", 1e3, " ms/step"),
    ("sched_per_req_s", "scheduler", 1e3, " ms/entry"),
    ("sched_per_prefill_s", "scheduler", 1e3, " ms/prefill"),
    ("request_latency_s", "request latency", 1e3, " ms"),
    ("request_serial_s", "front end", 1e3, " ms/request"),
)


def _header(
    meta: Mapping[str, Any], workload: Workload, winfo: Mapping[str, Any], cinfo: Mapping[str, Any]
) -> list[str]:
    """What is being run, before it runs: version and time, the workload with every param,
    the simulated system and cost model, the policies."""
    from rich.markup import escape

    cm = cinfo["cost_model"]
    sim = cinfo["sim"]
    router = f", router {cinfo['router']}" if cinfo["router"] else ""
    roofline = (
        f"roofline, mfu {cm.get('mfu')}, mbu {cm.get('mbu')}, step overhead "
        f"{float(cm.get('step_overhead_s', 0.0)) * 1e3:g} ms"
    )
    if cm.get("cost_model") == "calibrated":
        roofline = (
            f"calibrated from {cm.get('calibration')} ({cm.get('calibration_points')} points)"
        )
    roofline += "".join(
        f", {label} {float(cm[key]) * scale:g}{unit}"
        for key, label, scale, unit in _EXTRA_TERMS
        if cm.get(key)
    )
    engine = f"engine {sim['engine_mode']}"
    if sim.get("max_concurrency") is not None:
        engine += f"; closed loop, {sim['max_concurrency']:,} clients"
    lines = [
        f"[dim]radixsched {meta['version']} · simulate · {meta['created']}[/]",
        f"[bold]workload[/]  {escape(workload.name)}: {escape(workload.params_text)}",
        f"          {len(workload.requests):,} requests, {winfo['prompt_tokens']:,} prompt "
        f"tokens; arrivals: {escape(workload.arrivals)}"
        + (" (no request rate given)" if winfo["request_rate"] is None else "")
        + (f"; prompts {workload.prompts}" if workload.prompts != "built" else ""),
        _system_line(cinfo, cm, sim, router, engine),
        f"          cost model {escape(roofline)}",
        f"[bold]policies[/]  {', '.join(cinfo['policies'])}; optimal hit rate "
        + _optimal_text(winfo["optimal_hit_rate"]),
    ]
    return lines


def _optimal_text(opt: float) -> str:
    from radixsched.results.format import fmt_percent

    if math.isnan(opt):  # prompts deferred (``load_workload``): the bound would hold them all
        return "not computed (prompts built at arrival: the bound would hold every prompt)"
    return fmt_percent(opt)


def _system_line(
    cinfo: Mapping[str, Any],
    cm: Mapping[str, Any],
    sim: Mapping[str, Any],
    router: str,
    engine: str,
) -> str:
    from rich.markup import escape

    model = escape(str(sim["model"]))
    d = cinfo.get("disaggregation")
    if not d:
        return (
            f"[bold]system[/]    {model} on {escape(str(cm.get('gpu')))} x tp{sim['tp']}, dp "
            f"{cinfo['dp']}{router}; KV {cinfo['kv_capacity_tokens']:,} tokens; compat "
            f"{cinfo['compat']}; {escape(engine)}"
        )
    link = d["link"]
    bw = link["bandwidth_gb_s"]
    roles = "; ".join(
        f"{d[r]['instances']} {r} x {escape(str(d[r]['gpu']))} tp{d[r]['tp']} (KV "
        f"{d[r]['kv_capacity_tokens']:,} tokens)"
        for r in ("prefill", "decode")
    )
    return (
        f"[bold]system[/]    {model}, {d['deployment']} on {d['gpus']} GPUs: {roles}\n"
        f"          KV over {link['link']} ({'inf' if bw is None else f'{bw:g}'} GB/s per GPU, "
        f"{link['latency_ms'] * 1e3:g} us a transfer, handshake {link['bootstrap_ms'] * 1e3:g} "
        f"us){router}, decode router {d['decode_router']}; compat {cinfo['compat']}; "
        f"{escape(engine)}"
    )
