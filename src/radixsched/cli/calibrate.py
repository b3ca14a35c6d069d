"""``radixsched calibrate``: fit the simulator to measured runs, or profile the local engine.

``radixsched calibrate RESULTS... --output cal.json`` reads client-side results
(``radixsched bench [--sweep]``, ``sglang.bench_serving``, vLLM's ``benchmark_serving``,
GuideLLM; ``sim.calibrate.readers``), fits the cost model's constants (``sim.calibrate.fit``), prints
the fit's error per run and writes a calibration file for ``simulate --calibration``.

``radixsched calibrate --profile --model NAME --output table.json`` times the real engine's
forward passes over a grid of batch shapes on the local device and writes the step-time table
``--calibration`` accepts."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixsched.cli.common import COMMAND_HELP, CliError, scheduler_choices
from radixsched.config import SchedulerConfig, add_config_args, config_from_args

if TYPE_CHECKING:
    from radixsched.sim.calibrate.measured import MeasuredRun
    from radixsched.sim.calibrate.replay import Replay
    from radixsched.sim.settings.simconfig import SimConfig

logger = logging.getLogger(__name__)

# Output tokens per streamed chunk from which a run's TTFT is said to be its first chunk's,
# several tokens in.
COALESCED = 1.5


def add_calibrate_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "calibrate",
        help=COMMAND_HELP["calibrate"],
        description="Fit the cost model's constants to client-side benchmark results "
        "(radixsched bench, sglang.bench_serving JSONL, vLLM bench serve / benchmark_serving "
        "JSON, GuideLLM 0.2-0.8 JSON, inference-perf per-request reports) and write a "
        "calibration file for 'simulate --calibration'. With --profile, time the local engine "
        "over a grid of batch shapes instead.",
    )
    p.add_argument("results", nargs="*", metavar="RESULTS", help="result files to fit on")
    p.add_argument(
        "-o",
        "--output",
        default="calibration.json",
        metavar="PATH",
        help="file to write (default: %(default)s)",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="model preset or config.json (default: the model the results name)",
    )
    p.add_argument(
        "--gpu",
        default="h200",
        metavar="NAME",
        help="GPU preset the runs ran on, any case ('cpu' for the local engine; default: h200)",
    )
    p.add_argument(
        "--tp", type=int, default=1, metavar="N", help="tensor-parallel degree (default: 1)"
    )
    p.add_argument(
        "--max-total-tokens",
        type=int,
        metavar="N",
        help="the server's KV capacity in tokens (default: from the results, else the model)",
    )
    p.add_argument(
        "--engine-mode",
        default="sglang",
        choices=["sglang", "vllm"],
        help="engine whose scheduling is modelled (default: sglang)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=16,
        metavar="N",
        help="fit steps tried (each one replay of every run) at the chosen front-end time, "
        "after 4 at each of its 5 candidates (default: 16)",
    )
    p.add_argument(
        "--max-efficiency",
        type=float,
        default=0.9,
        metavar="F",
        help="the most of the GPU's peak FLOP/s (mfu) and bandwidth (mbu) the fit may credit "
        "it with, in (0, 1] (default: %(default)s; a constant that ends there is reported as "
        "a model mismatch)",
    )
    p.add_argument(
        "--no-holdout",
        action="store_true",
        help="skip the leave-one-run-out fits (each run predicted by a fit on the others; "
        "they cost one fit per run)",
    )
    p.add_argument(
        "--workload",
        metavar="SPEC",
        help="the prompts the benchmark sent (a workload spec or trace, as 'simulate' takes): "
        "each measured request replays the trace's next prompt of its length, so the replay "
        "shares the prefixes the server saw (default: what the result files record)",
    )
    p.add_argument(
        "--check",
        metavar="FILE|default",
        help="fit nothing: predict the runs with a calibration file's constants (fitted on "
        "other runs) or with the uncalibrated defaults ('default'), and print the errors",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    prof = p.add_argument_group("profile")
    prof.add_argument("--profile", action="store_true", help="profile the local engine")
    prof.add_argument("--device", default="cpu", metavar="NAME", help="torch device (default: cpu)")
    prof.add_argument(
        "--dtype", metavar="NAME", help="float32, bfloat16, float16 (default: by device)"
    )
    for flag, default, what in (
        ("--batch-sizes", "1,2,4,8,16", "batch sizes"),
        ("--prefill-tokens", "16,64,256,1024", "new tokens per prefill request"),
        ("--decode-context", "64,256,1024", "context tokens per decode request"),
    ):
        prof.add_argument(
            flag, default=default, metavar="N,N,...", help=f"{what} (default: {default})"
        )
    prof.add_argument(
        "--repeats", type=int, default=5, metavar="N", help="timed repeats per shape (default: 5)"
    )
    add_config_args(p, SchedulerConfig, choices=scheduler_choices())
    p.set_defaults(func=cmd_calibrate)
    return p


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise CliError(f"{flag} must be comma-separated integers, got {text!r}") from e
    if not values or min(values) < 1:
        raise CliError(f"{flag} must list integers >= 1, got {text!r}")
    return sorted(set(values))


def _percent(x: float) -> str:
    return f"{x * 100:+6.1f}%"


def render_errors(
    errors: list[dict[str, Any]],
    holdout: list[dict[str, Any]] | None = None,
    *,
    how: str = "in-sample",
) -> str:
    """Per run: the fit's predicted/measured means and errors (``how`` says whose constants
    predicted them), and beside them (``holdout``) the errors of the run predicted by a fit
    on the other runs."""
    held = holdout or []
    extra = f" {'held-out TTFT':>13} {'E2E':>7}" if held else ""
    lines = [
        f"{'run':<16} {'TTFT ms':>17} {'err':>7} {'ITL ms':>15} {'err':>7} "
        f"{'E2E ms':>17} {'err':>7} {'p90 E2E':>7}{extra}"
    ]
    for k, e in enumerate(errors):
        t, i, d = e["ttft_s"], e["itl_s"], e["e2e_s"]
        out = ""
        if k < len(held):
            h = held[k]
            out = f" {_percent(h['ttft_s']['error']['mean']):>13} {_percent(h['e2e_s']['error']['mean'])}"
        lines.append(
            f"{str(e['run'])[:16]:<16} "
            f"{t['predicted']['mean'] * 1e3:8.2f}/{t['measured']['mean'] * 1e3:<8.2f} "
            f"{_percent(t['error']['mean'])} "
            f"{i['predicted']['mean'] * 1e3:7.3f}/{i['measured']['mean'] * 1e3:<7.3f} "
            f"{_percent(i['error']['mean'])} "
            f"{d['predicted']['mean'] * 1e3:8.2f}/{d['measured']['mean'] * 1e3:<8.2f} "
            f"{_percent(d['error']['mean'])} {_percent(d['error']['p90'])}{out}"
        )
    note = "; held-out = predicted by a fit without that run" if held else ""
    lines.append(f"(predicted/measured means; err = relative error, {how}{note})")
    return "\n".join(lines)


def render_honesty(honesty: dict[str, Any]) -> str:
    """The mean errors in-sample and held out, and the constants that ended at a bound."""
    ins, out = honesty["summary"]["in_sample"], honesty["summary"]["held_out"]
    lines = [
        f"mean |error| in-sample (the runs fitted on): TTFT {ins['ttft_s'] * 100:.1f}%, "
        f"E2E {ins['e2e_s'] * 100:.1f}%"
    ]
    if out is None:
        lines.append(
            "held out: not measured (one run, or --no-holdout): the in-sample error flatters "
            "the fit; expect more on other runs"
        )
    else:
        lines.append(
            f"mean |error| held out (leave one run out): TTFT {out['ttft_s'] * 100:.1f}%, "
            f"E2E {out['e2e_s'] * 100:.1f}%: what to expect on a run not fitted on"
        )
    for m in honesty["at_bounds"]:
        lines.append(
            f"warning: {m['constant']} ended at its bound ({m['value']:.4g}, bound "
            f"{m['bound']:.4g}): a model mismatch, not a measurement. Likely: {m['cause']}"
        )
    return "\n".join(lines)


def _replay_configs(
    args: argparse.Namespace, runs: list[Any]
) -> tuple[SchedulerConfig, dict[str, Any]]:
    """The scheduler settings and capacity the runs were served with: a radixsched server's
    own (from its /server_info), else the flags."""
    from radixsched.sim.settings.engine_modes import scheduler_defaults

    given = set(vars(args))
    server_sched = next(
        (r.workload.get("scheduler") for r in runs if r.workload.get("scheduler")), None
    )
    if server_sched:
        names = {f.name for f in dataclasses.fields(SchedulerConfig)}
        values = {k: v for k, v in server_sched.items() if k in names}
        values.update({k: v for k, v in vars(args).items() if k in names})
        run = next(r for r in runs if r.workload.get("scheduler") is server_sched)
        where = f"{run.path}: {run.name}: config.server.scheduler"
        try:
            sched = SchedulerConfig(**values)
        except (TypeError, ValueError) as e:  # a value of the wrong type or out of range
            raise CliError(f"{where}: unusable settings ({e})") from e
        for key, valid in scheduler_choices().items():
            if getattr(sched, key) not in valid:
                raise CliError(
                    f"{where}: {key} {getattr(sched, key)!r} unknown to this build "
                    f"(valid: {', '.join(valid)})"
                )
    else:
        sched = config_from_args(
            SchedulerConfig, args, **scheduler_defaults(args.engine_mode, given, args.gpu)
        )
    slots = args.max_total_tokens or next(
        (r.workload.get("kv_slots") for r in runs if r.workload.get("kv_slots")), None
    )
    return sched, {"max_total_tokens": slots}


def _check_output(output: str, results: list[str]) -> None:
    """Fail before the fit (minutes) when ``output`` cannot be written, or is one of the
    result files (which writing it would destroy)."""
    out = Path(output)
    if out.is_dir():
        raise CliError(f"--output {output}: is a directory")
    if not out.parent.is_dir():
        raise CliError(f"--output {output}: no directory {out.parent}")
    for given in results:
        try:
            same = out.samefile(given)
        except OSError:  # either one missing or unreadable: not the same file
            same = False
        if same:
            raise CliError(
                f"--output {output} is the result file {given}: writing it would destroy "
                "the measurements (give another --output)"
            )


def _replay(run: MeasuredRun, index: int, sched: SchedulerConfig, sim: SimConfig) -> Replay:
    """``build_replay``; an error it raises names the run and its file."""
    from radixsched.sim.calibrate.params import CalibrateError
    from radixsched.sim.calibrate.replay import build_replay

    try:
        return build_replay(run, index, sched, sim)
    except CalibrateError:  # names them already
        raise
    except (ValueError, OSError) as e:  # a workload that cannot be regenerated, ...
        raise CliError(f"{run.path}: {run.name}: cannot replay its requests: {e}") from e


def _note_structure(runs: list[MeasuredRun]) -> None:
    """One line per file whose prompts' prefix structure is unknown (what the replay assumes
    and what that may cost), and one per run whose timings the replay cannot reproduce."""
    notes = ((r.path.split(":")[0], r.structure_note) for r in runs if r.prompts is None)
    for path, note in dict.fromkeys(notes):
        if note:
            logger.warning("%s: %s", path, note)
    per_file: dict[str, list[float]] = {}
    for r in runs:
        if r.tokens_per_chunk is not None and r.tokens_per_chunk >= COALESCED:
            per_file.setdefault(r.path.split(":")[0], []).append(r.tokens_per_chunk)
    for path, ks in per_file.items():
        span = f"{min(ks):.1f}" + ("" if max(ks) - min(ks) < 0.05 else f"-{max(ks):.1f}")
        logger.warning(
            "%s: streamed chunks carried %s tokens each on average (%d of its runs): a run's "
            "TTFT is its first chunk's, which waited for all of that chunk's tokens (a "
            "tokenizer holding back partial characters, a stream interval), so it reads high "
            "against the replay's first token",
            path, span, len(ks),
        )  # fmt: skip


def _with_workload(spec: str, runs: list[MeasuredRun]) -> list[MeasuredRun]:
    """The runs with their prompts taken from the user's trace ``spec`` (matched by send
    order and prompt length); a spec that cannot be loaded is a flag error."""
    from radixsched.sim.calibrate.prompts import with_trace
    from radixsched.sim.workloads.load import load_workload

    try:
        trace = [r.prompt_ids for r in load_workload(spec).requests]
    except (ValueError, OSError) as e:
        raise CliError(f"--workload {spec}: {e}") from e
    if not trace:
        raise CliError(f"--workload {spec}: no requests")
    out = []
    for run in runs:
        matched, exact = with_trace(run, trace)
        if exact < len(run.requests):
            logger.warning(
                "%s: %s: %d of %d requests match a --workload prompt of their length; the "
                "others replay the trace's next prompt cut or extended to it",
                run.path,
                run.name,
                exact,
                len(run.requests),
            )
        out.append(matched)
    return out


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.profile:
        return _cmd_profile(args)
    from radixsched.sim.calibrate.fit import fit, fitted_on
    from radixsched.sim.calibrate.measured import ResultFileError, read_result_files
    from radixsched.sim.calibrate.params import CalibrateError
    from radixsched.sim.cost.build import resolve_specs
    from radixsched.sim.cost.calibration_file import write_calibration
    from radixsched.sim.cost.roofline import CostModelError
    from radixsched.sim.settings.simconfig import SimConfig

    if not args.results:
        raise CliError("give result files to fit on (or --profile)")
    _check_max_efficiency(args.max_efficiency)
    if args.check is None:
        _check_output(args.output, args.results)
    else:  # a file that cannot be used fails before the results are read
        _check_constants(args, None)
    try:
        every = read_result_files(args.results)
    except ResultFileError as e:
        raise CliError(str(e)) from e
    runs = [r for r in every if r.requests]
    unused = [f"{r.path}: {r.name}: {r.num_failed} failed" for r in every if not r.requests]
    if not runs:
        raise CliError("\n".join(["no run in these files has a successful request:", *unused]))
    for line in unused:
        logger.warning("%s, none succeeded: not fitted on", line)
    if args.workload:
        runs = _with_workload(args.workload, runs)
    _note_structure(runs)
    model = args.model or next((r.model for r in runs if r.model), None)
    if model is None:
        raise CliError("the results do not name their model: give --model")
    try:
        gpu_spec, model_spec = resolve_specs(args.gpu, model)
        sched, extra = _replay_configs(args, runs)
        sim = SimConfig(
            model=model,
            gpu=args.gpu,
            tp=args.tp,
            max_total_tokens=extra["max_total_tokens"],
            context_length=next(
                (r.workload.get("context_len") for r in runs if r.workload.get("context_len")), None
            ),
            engine_mode=args.engine_mode,
        )
        replays = [_replay(r, i, sched, sim) for i, r in enumerate(runs)]
        if args.check is not None:
            return _report_check(args, replays, model_spec.name)

        def progress(it: int, obj: float, consts: dict[str, float]) -> None:
            if not args.quiet:
                print(
                    f"iteration {it}: error {math.sqrt(obj):.4f}  mfu {consts['mfu']:.3g} "
                    f"mbu {consts['mbu']:.3g} overhead {consts['step_overhead_s'] * 1e3:.3f} ms "
                    f"per-entry {consts['sched_per_req_s'] * 1e6:.1f} us "
                    f"latency {consts['request_latency_s'] * 1e3:.3f} ms "
                    f"front end {consts['request_serial_s'] * 1e3:.3f} ms",
                    file=sys.stderr,
                )

        result = fit(
            replays,
            max_iterations=args.iterations,
            on_iteration=progress,
            max_efficiency=args.max_efficiency,
        )
        honesty = _honesty(args, replays, result)
    except (CalibrateError, CostModelError, ValueError) as e:
        raise CliError(str(e)) from e
    try:
        write_calibration(
            args.output,
            constants=result.constants,
            fitted_on=fitted_on(
                runs,
                model=model_spec.name,
                gpu=gpu_spec.name,
                tp=args.tp,
                engine_mode=args.engine_mode,
            ),
            fit=result.errors,
            honesty=honesty,
        )
    except OSError as e:
        raise CliError(f"{args.output}: cannot write: {e.strerror or e}") from e
    except ValueError as e:  # a constant or an error that is not finite
        raise CliError(f"{args.output}: not written: the fit is not finite ({e})") from e
    if not args.quiet:
        print(render_errors(result.errors, honesty["holdout"]))
        print(render_honesty(honesty))
        c = result.constants
        print(
            "constants: "
            + "  ".join(f"{k} {v:.4g}" for k, v in c.items())
            + f"\nwrote {args.output} (use: radixsched simulate --model {model_spec.name} "
            f"--gpu {gpu_spec.name} --calibration {args.output})"
        )
    return 0


def _check_constants(args: argparse.Namespace, model: str | None) -> dict[str, float]:
    """``--check``'s constants; a file that cannot be used is a one-line error. With the
    model known, a file fitted on another model or GPU is warned about."""
    from radixsched.sim.calibrate.check import check_constants
    from radixsched.sim.cost.hardware import get_gpu

    try:
        constants, warnings = check_constants(
            args.check, get_gpu(args.gpu), model or "", args.engine_mode
        )
    except (ValueError, OSError) as e:  # (CalibrationError and PresetError are ValueErrors)
        raise CliError(f"--check {e}") from e
    for line in warnings if model else []:
        logger.warning("%s", line)
    return constants


def _report_check(args: argparse.Namespace, replays: list[Replay], model: str) -> int:
    """``--check``: each run predicted with fixed constants, then the mean errors."""
    from radixsched.sim.calibrate.check import predict_runs
    from radixsched.sim.calibrate.holdout import summarise

    errors = predict_runs(replays, _check_constants(args, model))
    s = summarise(errors)
    source = "the defaults" if args.check == "default" else args.check
    if not args.quiet:
        print(render_errors(errors, how=f"constants of {source}, not fitted to these runs"))
    print(
        f"mean absolute error over {s.runs} runs: TTFT {s.ttft:.1%}  ITL {s.itl:.1%}  "
        f"E2E {s.e2e:.1%}"
    )
    return 0


def _check_max_efficiency(value: float) -> None:
    if not (0.0 < value <= 1.0):  # (NaN fails too)
        raise CliError(f"--max-efficiency must be in (0, 1], got {value}")


def _honesty(args: argparse.Namespace, replays: list[Replay], result: Any) -> dict[str, Any]:
    """The held-out errors (leave one run out), both summaries, the constants at a bound."""
    from radixsched.sim.calibrate.diagnose import at_bounds
    from radixsched.sim.calibrate.holdout import leave_one_out, summarise

    def progress(i: int, name: str) -> None:
        if not args.quiet:
            print(f"holding out run {i + 1}/{len(replays)} ({name})", file=sys.stderr)

    held = (
        []
        if args.no_holdout
        else leave_one_out(replays, result, max_iterations=args.iterations, on_run=progress)
    )
    return {
        "holdout": held,
        "summary": {
            "in_sample": summarise(result.errors).to_json(),
            "held_out": summarise(held).to_json() if held else None,
        },
        "at_bounds": [m.to_json() for m in at_bounds(result.constants, result.max_efficiency)],
    }


def _cmd_profile(args: argparse.Namespace) -> int:
    from radixsched.engine.profile import ProfileGrid, profile_engine

    if not args.model:
        raise CliError("--profile needs --model (a local engine model: tiny-random, ...)")
    _check_output(args.output, [])
    grid = ProfileGrid(
        batch_sizes=_ints(args.batch_sizes, "--batch-sizes"),
        prefill_tokens=_ints(args.prefill_tokens, "--prefill-tokens"),
        decode_context=_ints(args.decode_context, "--decode-context"),
        repeats=max(args.repeats, 1),
    )
    try:
        rows, info = profile_engine(args.model, grid, device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError) as e:
        raise CliError(str(e)) from e
    from radixsched.sim.cost.calibration_file import write_calibration

    try:
        write_calibration(args.output, constants={}, fitted_on=info, rows=rows)
    except OSError as e:
        raise CliError(f"{args.output}: cannot write: {e.strerror or e}") from e
    if not args.quiet:
        for r in rows:
            print(
                f"{r['kind']:<8} batch {r['batch_size']:>4}  tokens {r['num_tokens']:>7}  "
                f"{r['ms']:9.3f} ms"
            )
        print(
            f"wrote {args.output} ({len(rows)} shapes; use: radixsched simulate --model "
            f"{args.model} --gpu {info['gpu']} --calibration {args.output})"
        )
    return 0
