"""``radixsched plan``: the cheapest deployment that meets latency targets on a workload.

Takes ``simulate``'s workload, model and settings (flags and ``--config`` keys alike, resolved
by ``sim.settings.runconfig``), where any scheduler or simulator setting may be a list
(``--gpu h100,h200 --tp 1,2 --chunked-prefill-size 2048,8192``) and ``--dp`` a range. Every
setting, price and output path is checked, for every candidate, before any simulation; the
search itself is ``sim.plan``."""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import typing
from typing import TYPE_CHECKING, Any

from radixsched.cli.common import COMMAND_HELP, CliError, output_errors, rich_console, run_metadata
from radixsched.config import SchedulerConfig, add_config_args
from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD, SLO_KEYS, WORKLOAD_KEYS, load_yaml

if TYPE_CHECKING:
    from radixsched.sim.plan.result import CandidateResult
    from radixsched.sim.plan.search import PlanSpec
    from radixsched.sim.plan.space import Candidate

PLAN_HELP = COMMAND_HELP["plan"]
DEFAULT_POLICIES = ("fcfs", "lpm")
# Plan's own settings (flags, or keys of --config), beside simulate's.
OWN_KEYS = (
    "policy", "slo_e2e_ms", "slo_attainment", "tolerance", "deployments", "gpu_price", "jobs",
    "ray", "json", "report", "quiet",
)  # fmt: skip


def add_plan_parser(sub: Any) -> Any:
    p = sub.add_parser(
        "plan",
        help=PLAN_HELP,
        description="Search GPUs, tensor parallelism, replicas, policies, routers, split "
        "deployments and any scheduler setting given as a list for the cheapest deployment "
        "whose SLOs hold for --slo-attainment of the requests: each candidate's capacity (the "
        "highest request rate it sustains) by bisection, or with --request-rate the fewest "
        "GPUs that sustain it.",
    )
    _add_own_args(p)
    _add_settings_args(p)
    p.set_defaults(func=cmd_plan)
    return p


def _add_own_args(p: argparse.ArgumentParser) -> None:
    run = p.add_argument_group("workload and search")
    run.add_argument(
        "--config",
        metavar="RUN.yaml",
        help="YAML settings file (simulate's keys; lists vary a setting); flags override it",
    )
    run.add_argument(
        "--workload",
        metavar="SPEC",
        help=f"workload spec, as simulate takes it (default: {DEFAULT_WORKLOAD})",
    )
    run.add_argument(
        "--policy", metavar="A,B", help=f"policies to try (default: {','.join(DEFAULT_POLICIES)})"
    )
    run.add_argument(
        "--request-rate",
        metavar="R",
        help="a target rate (req/s): find the fewest GPUs that sustain it "
        "(default: each candidate's capacity, ranked per dollar)",
    )
    run.add_argument("--num-requests", metavar="N", help="first N requests")
    run.add_argument("--workload-seed", metavar="N", help="workload seed")
    run.add_argument(
        "--deployments",
        metavar="colocated,P:D",
        help="co-located, and/or prefill:decode splits per --dp unit (default: colocated)",
    )
    run.add_argument(
        "--tolerance",
        metavar="F",
        help="bisection stops when the bracket is within this share (default 0.05)",
    )
    run.add_argument(
        "--gpu-price",
        metavar="GPU=$,...",
        help="dollars per GPU-hour, over the presets' list prices (h100=2.5)",
    )
    run.add_argument(
        "--jobs", metavar="N", help="candidates at once, in forked processes (default: one per CPU)"
    )
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run candidates as tasks on this Ray cluster ('auto': the local one)",
    )
    slo = p.add_argument_group("SLOs (at least one latency target)")
    slo.add_argument("--slo-ttft-ms", metavar="MS", help="TTFT target")
    slo.add_argument("--slo-tpot-ms", metavar="MS", help="TPOT target")
    slo.add_argument("--slo-e2e-ms", metavar="MS", help="end-to-end target")
    slo.add_argument(
        "--slo-attainment",
        metavar="F",
        help="share of requests that must meet every target (default 0.9)",
    )
    out = p.add_argument_group("outputs")
    out.add_argument("--json", metavar="PATH", help="one object per candidate")
    out.add_argument("--report", metavar="PATH", help="HTML report with charts")
    out.add_argument("--quiet", action="store_true", default=None, help="no progress display")


def _add_settings_args(p: argparse.ArgumentParser) -> None:
    """Every scheduler and simulator flag, taking a value or a comma-separated list."""
    from radixsched.sim.settings.simconfig import SimConfig

    for cls in (SchedulerConfig, SimConfig):
        hints = typing.get_type_hints(cls)
        overrides: dict[str, dict[str, Any]] = {
            f.name: {"type": str, "choices": None, "metavar": "V[,V...]"}
            for f in dataclasses.fields(cls)
            if hints[f.name] is not bool
        }
        if "schedule_policy" in overrides:
            overrides["schedule_policy"].update(metavar="NAME", help="one policy (or --policy)")
        if "dp" in overrides:
            overrides["dp"].update(metavar="N|N-M|N,M", help="replicas: a list or a range")
        add_config_args(p, cls, overrides=overrides)


# ---- settings -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    spec: PlanSpec
    candidates: list[Candidate]
    own: dict[str, Any]
    calibration: str | None


def _merged(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """Settings of --config and the flags (flags win), and the flag labels of given keys."""
    from radixsched.cli.simulate import _normalise_keys
    from radixsched.sim.settings.limits import RunConfigError
    from radixsched.sim.settings.simconfig import SimConfig

    names = {f.name for c in (SchedulerConfig, SimConfig) for f in dataclasses.fields(c)}
    own = {*WORKLOAD_KEYS, *SLO_KEYS, *OWN_KEYS}
    flags = {k: v for k, v in vars(args).items() if (k in names or k in own) and v is not None}
    file: dict[str, Any] = {}
    if args.config:
        try:
            file = _normalise_keys(load_yaml(args.config))
        except RunConfigError as e:
            text = str(e) if str(e).startswith(args.config) else f"{args.config}: {e}"
            raise CliError(text) from e
    return {**file, **flags}, {k: "--" + k.replace("_", "-") for k in flags}


def _number(own: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = own.get(key, default)
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise CliError(f"--{key.replace('_', '-')}: expected a number, got {value!r}") from None
    if not (math.isfinite(out) and lo < out <= hi):
        raise CliError(f"--{key.replace('_', '-')}: must be in ({lo:g}, {hi:g}], got {value!r}")
    return out


def _slo(merged: dict[str, Any], own: dict[str, Any]) -> Any:
    from radixsched.sim.plan.capacity import Slo

    def ms(key: str) -> float | None:
        source = own if key in own else merged
        if source.get(key) is None:
            return None
        return _number(source, key, 0.0, 0.0, 1e9) / 1e3

    slo = Slo(
        ms("slo_ttft_ms"),
        ms("slo_tpot_ms"),
        ms("slo_e2e_ms"),
        _number(own, "slo_attainment", 0.9, 0.0, 1.0),
    )
    if slo.ttft_s is None and slo.tpot_s is None and slo.e2e_s is None:
        raise CliError(
            "--slo-ttft-ms: a plan needs a latency target (--slo-ttft-ms, "
            "--slo-tpot-ms or --slo-e2e-ms)"
        )
    return slo


def _target(merged: dict[str, Any]) -> float | None:
    value = merged.pop("request_rate", None)
    if value is None:
        return None
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise CliError(f"--request-rate: expected requests per second, got {value!r}") from None
    if not (math.isfinite(rate) and rate > 0):
        raise CliError(f"--request-rate: a target must be a finite rate > 0, got {value!r}")
    return rate


def _inputs(args: argparse.Namespace) -> PlanInputs:
    """Everything the plan needs, every problem found before any work (``CliError``)."""
    from radixsched.cli.simulate import _policy_list
    from radixsched.sim.plan.pricing import PriceError, parse_prices, price_table
    from radixsched.sim.plan.search import PlanSpec
    from radixsched.sim.plan.space import SpaceError, expand, parse_deployments
    from radixsched.sim.settings.limits import RunConfigError

    merged, labels = _merged(args)
    own = {k: merged.pop(k) for k in OWN_KEYS if k in merged}
    slo = _slo(merged, own)
    target = _target(merged)
    try:
        one = merged.pop("schedule_policy", None)
        policies = _policy_list(own.get("policy") or one or ",".join(DEFAULT_POLICIES))
        candidates = expand(merged, policies, parse_deployments(own.get("deployments")), labels)
        prices = price_table(parse_prices(own.get("gpu_price")))
    except (SpaceError, RunConfigError, PriceError) as e:
        raise CliError(str(e)) from e
    rs = candidates[0].settings
    sched = rs.scheduler_config()
    spec = PlanSpec(
        workload=rs.workload.spec or DEFAULT_WORKLOAD,
        num_requests=rs.workload.num_requests,
        seed=sched.seed if rs.workload.seed is None else rs.workload.seed,
        hit_unit=sched.hit_unit,
        slo=slo,
        tolerance=_number(own, "tolerance", 0.05, 0.0, 1.0),
        target_rate=target,
        prices=prices,
    )
    if errors := _preflight(candidates, spec, own, args.config):
        raise CliError("\n".join(dict.fromkeys(errors)))
    return PlanInputs(spec, candidates, own, rs.sim.get("calibration"))


def _preflight(
    candidates: list[Candidate], spec: PlanSpec, own: dict[str, Any], config: str | None
) -> list[str]:
    """Every problem of every candidate (``simulate``'s checks, less a model that does not
    fit: that candidate is pruned), prices, SLOs against a step's time, outputs, jobs."""
    from radixsched.cli.simulate import _input_files
    from radixsched.sim.plan.planner import fit_error, min_step_s
    from radixsched.sim.plan.pricing import FLAG, deployment_gpus, missing_prices
    from radixsched.sim.preflight import check

    errors: list[str] = []
    fastest: tuple[float, str] | None = None
    gpus: list[str] = []
    for c in candidates:
        if fit_error(c.settings.sim_config()):  # pruned when the plan runs, with the reason
            continue
        errs = check(c.settings, [c.policy], default_workload=DEFAULT_WORKLOAD)
        errors += errs
        if errs:
            continue
        gpus += [g for g, _ in deployment_gpus(c.settings.sim_config())]
        step = min_step_s(c.settings.sim_config())
        if fastest is None or step < fastest[0]:
            fastest = (step, f"{c.gpu} tp{c.tp}")
    if errors:
        return errors
    for gpu in missing_prices(gpus, spec.prices):
        errors.append(
            f"{FLAG}: no price for {gpu} (searched by --gpu); give {FLAG} "
            f"{gpu.lower()}=DOLLARS_PER_HOUR"
        )
    errors += spec.slo.step_errors(fastest)
    jobs = own.get("jobs")
    if jobs is not None and (not str(jobs).isdigit() or int(jobs) < 1):
        errors.append(f"--jobs: must be a positive integer, got {jobs!r}")
    outputs = [(f"--{k}", str(own[k])) for k in ("json", "report") if own.get(k)]
    inputs = _input_files(candidates[0].settings, config)
    return errors + output_errors(outputs, inputs)


# ---- running -------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from radixsched.sim.plan.planner import run_plan
    from radixsched.sim.plan.search import load_for
    from radixsched.sim.workloads.load import WorkloadError

    meta = run_metadata(getattr(args, "_argv", None))
    inputs = _inputs(args)
    spec, own = inputs.spec, inputs.own
    console = rich_console(160)  # the plan's table is wide
    try:
        loaded = load_for(spec)
    except WorkloadError as e:
        raise CliError(str(e)) from e
    for line in _header(inputs, loaded):
        console.print(line, highlight=False, markup=False)
    jobs = int(own["jobs"]) if own.get("jobs") is not None else _default_jobs(inputs)
    start = time.perf_counter()
    display, advance = _progress(console, len(inputs.candidates), bool(own.get("quiet")))
    results = run_plan(
        spec,
        inputs.candidates,
        loaded,
        jobs=jobs,
        ray_address=own.get("ray"),
        on_result=advance,
        display=display,
    )
    elapsed = time.perf_counter() - start
    return _finish(console, inputs, results, elapsed, meta)


def _default_jobs(inputs: PlanInputs) -> int:
    from radixsched.sim.policy_runs import default_jobs

    if inputs.own.get("ray"):
        return 0  # the cluster's CPUs
    return default_jobs(len(inputs.candidates))


def _progress(console: Any, total: int, quiet: bool) -> tuple[Any, Any]:
    """A progress display (candidates done of ``total``, time left) and ``advance(result)``,
    which moves it on."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]candidates"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=quiet,
    )
    task = progress.add_task("", total=total)

    def advance(result: CandidateResult) -> None:
        rate = result.max_request_rate
        what = f"{result.candidate.label}: " + (
            f"{rate:.3g} req/s" if rate is not None else result.status
        )
        progress.update(task, advance=1, description=what[:60])

    return progress, advance


def _header(inputs: PlanInputs, loaded: Any) -> list[str]:
    from radixsched.sim.plan.table import calibration_error

    spec = inputs.spec
    wl = loaded.base
    arrivals = (
        f"the trace's timestamps scaled (its own rate {loaded.trace_rate:.3g} req/s)"
        if loaded.trace_rate is not None
        else "Poisson at each rate tried"
    )
    goal = (
        f"the fewest GPUs that sustain {spec.target_rate:g} req/s"
        if spec.target_rate is not None
        else "each candidate's capacity, ranked by capacity per dollar"
    )
    lines = [
        f"workload  {wl.name}: {wl.params_text}",
        f"          {len(wl.requests):,} requests, {wl.num_prompt_tokens:,} prompt tokens, "
        f"{wl.num_output_tokens:,} output; arrivals: {arrivals}; optimal hit rate "
        f"{loaded.optimal_hit_rate:.1%}",
        f"SLO       {spec.slo.describe()}",
        f"search    {len(inputs.candidates)} candidates; {goal}; bisection to "
        f"±{spec.tolerance:.0%} of the rate",
    ]
    if inputs.calibration:
        lines.append(f"          {calibration_error(inputs.calibration)}")
    return lines


def _finish(
    console: Any,
    inputs: PlanInputs,
    results: list[CandidateResult],
    elapsed: float,
    meta: dict[str, Any],
) -> int:
    from radixsched.sim.plan.result import rank
    from radixsched.sim.plan.table import recommendation, render

    spec = inputs.spec
    ranked = rank(results, spec.target_rate)
    title = (
        f"Plan: cost at {spec.target_rate:g} req/s"
        if spec.target_rate is not None
        else "Plan: capacity per dollar"
    ) + f" (capacity within ±{spec.tolerance:.0%}; prices $/GPU-hour)"
    render(console, ranked, spec.target_rate, spec.tolerance, title)
    if inputs.calibration:  # the step times' own error, beside the bisection's tolerance
        from radixsched.sim.plan.table import calibration_error

        console.print(calibration_error(inputs.calibration), highlight=False, markup=False)
    for line in recommendation(ranked, spec.target_rate):
        console.print(line, highlight=False, markup=False)
    sims = sum(len(r.capacity.probes) for r in results if r.capacity is not None)
    console.print(f"plan took {elapsed:.1f} s: {sims} simulations", highlight=False)
    own = inputs.own
    if own.get("json"):
        _write_json(str(own["json"]), inputs, ranked, meta)
        console.print(f"wrote {own['json']}", highlight=False)
    if own.get("report"):
        from radixsched.sim.plan.report import write_plan_report

        write_plan_report(str(own["report"]), ranked, spec, meta)
        console.print(f"wrote {own['report']}", highlight=False)
    return 0


def _write_json(
    path: str, inputs: PlanInputs, ranked: list[CandidateResult], meta: dict[str, Any]
) -> None:
    import json

    from radixsched.sim.plan.result import plan_json

    with open(path, "w", encoding="utf-8") as f:
        json.dump(plan_json(inputs.spec, ranked, meta), f, indent=2, default=str)
        f.write("\n")
