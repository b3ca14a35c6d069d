"""The command line as a newcomer meets it, run as a subprocess (``python -m radixsched``):
--version, help text that lists what it accepts, no silent flag abbreviations, every setting
and output path checked before any work, warnings on overload, a non-zero exit when nothing
was served, one table that fits 100 columns, outputs that record what was run, --config,
--requests-csv and SLO goodput."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from radixsched.policies import POLICIES
from radixsched.results.metrics import REQUEST_COLUMNS
from radixsched.sim.cost.hardware import GPUS
from radixsched.sim.settings.runconfig import RATE_RULE
from radixsched.sim.workloads.load import WORKLOADS

SMALL = "shared-prefix:groups=4,prompts=4,system_len=256,question_len=32,output_len=16"
SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"
SCRIPT = Path(sys.executable).parent / "radixsched"


def cli(
    *args: str, columns: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "radixsched", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a failed command that ran nothing (no traceback, no table)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, proc.stderr
    assert "Policy comparison" not in proc.stdout
    return errors[0]


def doc(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# ---- what was run --------------------------------------------------------------------------------


def test_version_from_the_script_and_python_m() -> None:
    expected = f"radixsched {version('radixsched')}"
    for cmd in ([str(SCRIPT), "--version"], [sys.executable, "-m", "radixsched", "--version"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == expected, proc


def test_header_json_and_report_record_what_was_run(tmp_path: Path) -> None:
    out, report = tmp_path / "r.json", tmp_path / "r.html"
    proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs,lpm", "--request-rate", "20",
               "--dp", "2", "--json", str(out), "--report", str(report), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    head = " ".join(proc.stdout.split("Policy comparison")[0].split())
    assert f"radixsched {version('radixsched')}" in head
    # Workload params as a spec writes them, every one of them, not a Python dict.
    assert "groups=4, prompts=4, system_len=256, question_len=32, output_len=16" in head
    assert "{'" not in head
    assert "H200 x tp1, dp 2, router cache-aware" in head
    assert "compat radixsched" in head and "mfu 0.55" in head and "poisson 20 req/s" in head
    d = doc(out)
    assert d["meta"]["version"] == version("radixsched")
    assert re.match(r"\d{4}-\d\d-\d\dT", d["meta"]["created"])
    assert "--dp 2" in d["meta"]["command"]
    cfg = d["config"]
    assert cfg["policies"] == ["fcfs", "lpm"] and cfg["dp"] == 2
    assert cfg["router"] == "cache-aware" and cfg["compat"] == "radixsched"
    assert cfg["cost_model"]["mfu"] == 0.55 and cfg["cost_model"]["gpu"] == "H200"
    assert d["workload"]["params"]["system_len"] == 256
    html = report.read_text(encoding="utf-8")
    assert version("radixsched") in html and d["meta"]["created"] in html
    assert "step_overhead_s" in html and "cache-aware" in html


# ---- help text -----------------------------------------------------------------------------------


def test_simulate_help_lists_values_and_states_each_default_once() -> None:
    proc = cli("simulate", "--help", columns=100)
    assert proc.returncode == 0
    text = proc.stdout
    assert "SchedulerConfig" not in text and "SimConfig" not in text
    assert "scheduler (SGLang's flag names):" in text
    assert "see --help of simulate" not in text
    assert not [ln for ln in text.splitlines() if ln.count("(default") > 1]
    assert "{" + ",".join(GPUS) + "}" in text and {"H100", "L40S", "MI300X"} <= set(GPUS)
    assert "--tp N, --tp-size N" in text
    assert "--dp-size" in text
    seed_help = " ".join(text.split("--seed N")[1].split("\n  --")[0].split())
    assert "workload" in seed_help and "--workload-seed" in seed_help
    # Every workload and every one of its params, with defaults.
    for kind in WORKLOADS.values():
        assert kind.name in text
        for p in kind.params:
            if p.name != "path":
                assert f"{p.name}=" in text, (kind.name, p.name)
    assert " ".join(RATE_RULE.split()) in " ".join(text.split())


def test_bench_help_lists_its_own_workload_defaults() -> None:
    text = cli("bench", "--help", columns=100).stdout
    assert "groups=8, prompts=8, system_len=256, question_len=32, output_len=32" in text
    assert "exit status" in text


def test_flag_prefixes_are_errors_with_a_suggestion() -> None:
    proc = cli("simulate", "--request-rat", "5")
    line = one_error(proc)
    assert "--request-rat" in line and "did you mean --request-rate" in line
    line = one_error(cli("simulate", "--compat", "sglan"))
    assert "did you mean 'sglang'" in line
    assert "did you mean 'simulate'" in one_error(cli("simulat"))


def test_sglang_tp_size_and_dp_size_are_accepted(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs", "--tp-size", "2",
               "--dp-size", "2", "--json", str(out), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sim = doc(out)["config"]["sim"]
    assert (sim["tp"], sim["dp"]) == (2, 2)


def test_policy_and_schedule_policy_together_are_an_error() -> None:
    line = one_error(cli("simulate", "--policy", "fcfs,lpm", "--schedule-policy", "hrrn"))
    assert "--policy" in line and "--schedule-policy" in line


def test_schedule_policy_alone_runs_that_policy(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    proc = cli("simulate", "--workload", SMALL, "--schedule-policy", "hrrn", "--json", str(out),
               "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [r["policy"] for r in doc(out)["results"]] == ["hrrn"]


# ---- checked before any work ---------------------------------------------------------------------

# Loading and simulating this takes far longer than the checks below may.
HEAVY = "shared-prefix:groups=4000,prompts=8,system_len=4096"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "h1000"], "invalid choice: 'h1000'"),
        (["--json", "/nonexistent/dir/x.json"], "/nonexistent/dir does not exist"),
        (["--report", "/"], "is a directory"),
        (["--requests-csv", "/nonexistent/r.csv"], "/nonexistent does not exist"),
        (["--policy", "lpmm"], "did you mean 'lpm'"),
        (["--router", "cache-awar", "--dp", "2"], "did you mean 'cache-aware'"),
        (["--model", "llama-3.1-70b", "--gpu", "l40s"], "does not fit"),
        (["--disable-radix-cache", "--schedule-policy", "shortest-prefill-first"], "prefix"),
    ],
)
def test_bad_settings_fail_before_the_workload_is_built(args: list[str], needle: str) -> None:
    t0 = time.perf_counter()
    line = one_error(cli("simulate", "--workload", HEAVY, *args))
    assert needle in line
    assert not re.search(r"error: (fcfs|lpm): ", line)  # not blamed on a policy
    assert time.perf_counter() - t0 < 20  # the heavy workload was never generated


def test_a_missing_trace_fails_before_any_run() -> None:
    line = one_error(cli("simulate", "--workload", "mooncake:/no/such/trace.jsonl"))
    assert "/no/such/trace.jsonl: no such file" in line


def test_several_problems_are_one_line_each() -> None:
    proc = cli("simulate", "--workload", HEAVY, "--policy", "fcfs,nope", "--json", "/x/y/z.json")
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("radixsched: error:")]
    assert len(errors) == 2 and "nope" in errors[0] and "/x/y" in errors[1]


# ---- traces as users ship them -------------------------------------------------------------------


def test_gzipped_trace_gives_the_same_results(tmp_path: Path) -> None:
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    results = []
    for spec in (f"mooncake:{SAMPLE}", f"mooncake:{gz}"):
        out = tmp_path / f"{len(results)}.json"
        proc = cli("simulate", "--workload", spec, "--policy", "lpm", "--num-requests", "60",
                   "--json", str(out), "--quiet")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        r = doc(out)["results"][0]
        results.append((r["hit_rate"], r["ttft_s"], r["num_requests"]))
    assert results[0] == results[1]


def test_non_utf8_trace_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"input_length": 10, "output_length": 2, "tenant": "caf\xe9"}\n')
    line = one_error(cli("simulate", "--workload", f"jsonl:{bad}"))
    assert f"{bad}:1" in line and "UTF-8" in line


# ---- warnings, exit status, the table ------------------------------------------------------------


def test_serving_nothing_is_an_error_and_no_policy_is_best(tmp_path: Path) -> None:
    out = tmp_path / "none.json"
    proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs,lpm", "--max-total-tokens",
               "10", "--json", str(out), "--quiet")  # fmt: skip
    assert proc.returncode == 1
    assert "served any of the 16 requests" in proc.stderr and "does not fit" in proc.stderr
    assert "Best" not in proc.stdout and "Recommended" not in proc.stdout
    assert "No policy served any request" in proc.stdout
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("fcfs", "lpm"))]
    assert len(rows) == 2 and all(ln.split()[-1] == "16" for ln in rows)  # the failed column
    assert all(r["num_completed"] == 0 and r["num_aborted"] == 16 for r in doc(out)["results"])


def test_overload_is_a_warning_with_offered_and_served_rates(tmp_path: Path) -> None:
    out = tmp_path / "over.json"
    proc = cli("simulate", "--workload", f"mooncake:{SAMPLE}", "--policy", "fcfs,lpm",
               "--json", str(out), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "warning: overloaded" in proc.stderr
    assert re.search(r"served [\d.]+ req/s \(offered [\d.]+x that\)", proc.stderr)
    load = doc(out)["results"][0]["load"]
    assert load["overloaded"] and load["offered_requests_per_s"] > load["served_requests_per_s"]
    calm = cli("simulate", "--workload", SMALL, "--policy", "fcfs", "--request-rate", "2",
               "--quiet")  # fmt: skip
    assert calm.returncode == 0 and "overloaded" not in calm.stderr


@pytest.mark.parametrize("columns", [None, 80])
def test_one_table_fits_with_a_legend_and_the_runtime_once(columns: int | None) -> None:
    proc = cli("simulate", "--workload", SMALL, "--policy", "all", "--request-rate", "20",
               "--quiet", columns=columns)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    width = columns or 100
    lines = proc.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= width
    header = [ln for ln in lines if ln.startswith("policy ")]
    assert len(header) == 1 and "hit rate" in header[0] and "TTFT p99" in header[0]
    assert "wall" not in proc.stdout
    assert proc.stdout.count("Simulator runtime") == 1
    assert "higher is better" in proc.stdout and "TPOT = time per output token" in proc.stdout
    for name in POLICIES:
        assert any(ln.startswith(name + " ") for ln in lines), name
    if columns is None:
        assert "failed" in header[0] and "retract" in header[0]


# ---- config file, per-request output, SLO --------------------------------------------------------


def test_config_file_with_flags_overriding(tmp_path: Path) -> None:
    out = tmp_path / "cfg.json"
    run = tmp_path / "run.yaml"
    run.write_text(
        f"workload: '{SMALL}'\nrequest-rate: 25\npolicy: [fcfs, lpm]\ngpu: h100\n"
        f"page_size: 16\njson: {out}\nquiet: true\n",
        encoding="utf-8",
    )
    proc = cli("simulate", "--config", str(run), "--gpu", "l40s")
    assert proc.returncode == 0, proc.stderr
    d = doc(out)
    assert d["config"]["sim"]["gpu"] == "L40S"  # the flag won
    assert d["config"]["scheduler"]["page_size"] == 16
    assert [r["policy"] for r in d["results"]] == ["fcfs", "lpm"]
    assert d["workload"]["request_rate"] == 25 and d["workload"]["arrivals"] == "poisson 25 req/s"


def test_config_file_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [oops\n", encoding="utf-8")
    assert f"{bad}:" in one_error(cli("simulate", "--config", str(bad)))
    typo = tmp_path / "typo.yaml"
    typo.write_text("request_rat: 5\n", encoding="utf-8")
    assert "did you mean 'request_rate'" in one_error(cli("simulate", "--config", str(typo)))


def test_requests_csv_has_one_row_per_request_and_policy(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    paths = {"csv": tmp_path / "req.csv", "parquet": tmp_path / "req.parquet"}
    out = tmp_path / "r.json"
    for kind, path in paths.items():
        proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs,lpm", "--request-rate",
                   "20", "--requests-csv", str(path), "--json", str(out), "--quiet",
                   "--slo-ttft-ms", "40")  # fmt: skip
        assert proc.returncode == 0, (kind, proc.stderr)
    with paths["csv"].open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert tuple(reader.fieldnames or ()) == REQUEST_COLUMNS
    assert len(rows) == 32 and {r["policy"] for r in rows} == {"fcfs", "lpm"}
    results = {r["policy"]: r for r in doc(out)["results"]}
    for policy, res in results.items():
        mine = [r for r in rows if r["policy"] == policy]
        ttft = [float(r["ttft_s"]) for r in mine]
        assert sum(ttft) / len(ttft) == pytest.approx(res["ttft_s"]["mean"])
        assert sum(int(r["cached_tokens"]) for r in mine) == res["cached_tokens"]
        met = sum(r["slo_met"] == "True" for r in mine)
        assert met == res["slo"]["met"]
    table = pq.read_table(paths["parquet"]).to_pylist()
    assert [r["request_id"] for r in table] == [r["request_id"] for r in rows]
    assert [r["ttft_s"] for r in table] == pytest.approx([float(r["ttft_s"]) for r in rows])


def test_slo_goodput_in_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "slo.json"
    proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs", "--request-rate", "20",
               "--slo-ttft-ms", "1000000", "--slo-tpot-ms", "1000000", "--json", str(out),
               "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SLO met" in proc.stdout and "100.0%" in proc.stdout
    slo = doc(out)["results"][0]["slo"]
    assert slo["attainment"] == 1.0 and slo["met"] == 16 and slo["ttft_ms"] == 1e6
    strict = cli("simulate", "--workload", SMALL, "--policy", "fcfs", "--slo-ttft-ms", "0.001",
                 "--json", str(out), "--quiet")  # fmt: skip
    assert strict.returncode == 0
    assert doc(out)["results"][0]["slo"]["attainment"] == 0.0
    assert "must be a positive number" in one_error(cli("simulate", "--slo-ttft-ms", "-5"))


def test_without_a_rate_generated_workloads_arrive_at_once(tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    proc = cli("simulate", "--workload", SMALL, "--policy", "fcfs", "--json", str(out), "--quiet")
    assert proc.returncode == 0
    assert doc(out)["workload"]["arrivals"] == "all at t=0"
    trace = tmp_path / "trace.json"
    assert cli("simulate", "--workload", f"mooncake:{SAMPLE}", "--policy", "fcfs",
               "--num-requests", "20", "--json", str(trace), "--quiet").returncode == 0  # fmt: skip
    assert doc(trace)["workload"]["arrivals"] == "trace timestamps"


def test_example_run_config_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "run.yaml"
    out = tmp_path / "example.json"
    proc = cli("simulate", "--config", str(example), "--num-requests", "48", "--json", str(out),
               "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = doc(out)
    assert [r["policy"] for r in d["results"]] == ["fcfs", "lpm", "dfs-weight"]
    assert d["config"]["slo"] == {"ttft_ms": 2000.0, "tpot_ms": 100.0}
