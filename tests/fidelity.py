"""The fidelity check shared by the live test (``test_calibrate_e2e``) and its recording
(``test_calibrate_recorded``): calibrate on sweeps of ``radixsched serve --model tiny-random``,
simulate held-out arrival processes of the same workload, compare with what was measured.

Bounds (issue 16's): mean E2E and mean ITL within 5%, mean TTFT within 10%, p90 E2E within
10% of measured. A held-out statistic is its median over the measurement rounds."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from radixsched.cli.main import main
from radixsched.client.bench import BENCH_WORKLOAD_DEFAULTS
from radixsched.config import SchedulerConfig
from radixsched.sim.calibrate.measured import read_result_file
from radixsched.sim.cost.calibration_file import read_calibration
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload

# 512-token questions behind a 192-token shared prompt, 32 output tokens: the engine is the
# bottleneck (a prefill takes about 8 ms), not the client and the HTTP process that share the
# 2-core machine with it (with 32-token questions their per-token work saturated a core).
WORKLOAD = "shared-prefix:groups=8,prompts=8,system_len=192,question_len=512,output_len=32"
BOUNDS = {"e2e_mean": 0.05, "itl_mean": 0.05, "ttft_mean": 0.10, "e2e_p90": 0.10}
STATS: dict[str, Callable[[Any], float]] = {
    "e2e_mean": lambda r: float(r.e2e_s.mean),
    "itl_mean": lambda r: float(r.itl_s.mean),
    "ttft_mean": lambda r: float(r.ttft_s.mean),
    "e2e_p90": lambda r: float(r.e2e_s.p90),
}

Stats = dict[str, float]


def stats_of(result: Any) -> Stats:
    """The compared statistics of a ``PolicyResult``."""
    return {key: stat(result) for key, stat in STATS.items()}


def held_out_processes(sweep: Path) -> dict[str, dict[str, Any]]:
    """A closed loop of 4 clients (between the synchronous run and the probe's 64), and Poisson
    arrivals at 3/4 of the synchronous rate (about half the server's capacity: nearer
    saturation, identical 64-request runs differed by 20-30%, a measurement no prediction
    can be held to within 5%)."""
    doc = json.loads(read_text(sweep))
    assert [r["stage"] for r in doc["runs"]][:2] == ["synchronous", "throughput"]
    sync_rps = doc["runs"][0]["results"][0]["throughput"]["requests_per_s"]
    return {
        "concurrency 4": {"max_concurrency": 4, "request_rate": float("inf")},
        "rate": {"request_rate": round(0.75 * sync_rps, 2)},
    }


def predict_held_out(
    sweeps: Sequence[Path],
    held_out: Mapping[str, Mapping[str, Any]],
    measured: Mapping[str, Sequence[Stats]],
    cal: Path,
) -> dict[str, Stats]:
    """Calibrate on ``sweeps`` into ``cal``, simulate each held-out process with the server's
    settings and the new file: each statistic's error against its median over ``measured``."""
    # (--no-holdout: the held-out runs here are separate files; leave-one-out would refit
    # once per sweep stage.)
    args = ["calibrate", *map(str, sweeps), "--gpu", "cpu", "-o", str(cal), "--quiet"]
    assert main([*args, "--no-holdout"]) == 0
    fitted = read_calibration(cal)
    assert fitted.fitted_on["model"] == "tiny-random" and fitted.fitted_on["gpu"] == "CPU"
    assert len(fitted.fitted_on["runs"]) == sum(len(read_result_file(p)) for p in sweeps)
    server = _server_info(sweeps[0])
    sched = SchedulerConfig(**server["scheduler"])
    report = {}
    for name, kw in held_out.items():
        wl = load_workload(
            WORKLOAD, request_rate=kw["request_rate"], seed=0, defaults=BENCH_WORKLOAD_DEFAULTS
        )
        sim = SimConfig(
            model="tiny-random",
            gpu="cpu",
            calibration=str(cal),
            max_total_tokens=server["kv_slots"],
            context_length=server["context_len"],
            max_concurrency=kw.get("max_concurrency"),
        )
        predicted = stats_of(simulate(wl, sched, sim).result)
        report[name] = {
            key: predicted[key] / statistics.median(m[key] for m in measured[name]) - 1
            for key in STATS
        }
    return report


def _server_info(sweep: Path) -> dict[str, Any]:
    text = read_text(sweep)
    info: dict[str, Any] = json.loads(text)["runs"][0]["config"]["server"]
    return info


def read_text(path: Path) -> str:
    if path.suffix == ".gz":
        import gzip

        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text()


def failures(report: Mapping[str, Stats], bounds: Mapping[str, float] = BOUNDS) -> list[str]:
    return [
        f"{name} {key} {errs[key]:+.1%} (bound {bound:.0%})"
        for name, errs in report.items()
        for key, bound in bounds.items()
        if abs(errs[key]) > bound
    ]


# ---- the same loop with GuideLLM as the client (test_calibrate_guidellm*) -------------------

# What the GuideLLM loop is held to, on the 2-core machine: the means of E2E and ITL within
# 10%. Its TTFT is each stream's first chunk, and with tiny-random's byte tokenizer a chunk
# carries ~3.8 tokens (random bytes wait for whole UTF-8 characters): the measured TTFT is a
# few decode steps in, which the per-token replay cannot see (calibrate says so). Its client
# (httpx, one worker process) also shares the two cores with the server; the recording misses
# the 5% bounds of the loop above (held out: E2E -9% and +7%, ITL -8% and +0.5%).
GUIDELLM_BOUNDS = {"e2e_mean": 0.10, "itl_mean": 0.10}

# GuideLLM's synthetic data shaped like WORKLOAD: 512-token prompts behind one of 8 shared
# 192-token prefixes, 32 output tokens.
GUIDELLM_DATA = (
    "kind=synthetic_text,prompt_tokens=512,output_tokens=32,prefix_tokens=192,prefix_count=8"
)
STAT_KEYS = {"e2e_mean": ("e2e_s", "mean"), "itl_mean": ("itl_s", "mean")}
STAT_KEYS |= {"ttft_mean": ("ttft_s", "mean"), "e2e_p90": ("e2e_s", "p90")}


def check_held_out_files(
    sweeps: Sequence[Path],
    held_out: Mapping[str, Sequence[Path]],
    server: Mapping[str, Any],
    cal: Path,
) -> dict[str, Stats]:
    """Calibrate on ``sweeps`` (result files of any client) into ``cal``, then replay each
    held-out file's run with the fitted constants (``calibrate --check``'s path): per held-out
    process, each statistic's error as its median over the rounds' files."""
    from radixsched.sim.calibrate.check import check_constants, predict_runs
    from radixsched.sim.calibrate.replay import build_replay
    from radixsched.sim.cost.hardware import get_gpu

    slots = ["--max-total-tokens", str(server["kv_slots"])]
    args = ["calibrate", *map(str, sweeps), "--gpu", "cpu", *slots, "-o", str(cal)]
    assert main([*args, "--no-holdout", "--quiet"]) == 0
    constants, _ = check_constants(str(cal), get_gpu("cpu"), "tiny-random", None)
    sched = SchedulerConfig(**server["scheduler"])
    sim = SimConfig(
        model="tiny-random",
        gpu="cpu",
        max_total_tokens=server["kv_slots"],
        context_length=server["context_len"],
    )
    report = {}
    for name, files in held_out.items():
        runs = [run for f in files for run in read_result_file(f)]
        replays = [build_replay(run, i, sched, sim) for i, run in enumerate(runs)]
        errors = predict_runs(replays, constants)
        report[name] = {
            key: statistics.median(float(e[metric]["error"][stat]) for e in errors)
            for key, (metric, stat) in STAT_KEYS.items()
        }
    return report
