"""``bench --sweep`` and ``calibrate --profile`` against the real engine (tiny-random, CPU)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from radixsched.cli.main import main
from radixsched.client.bench import BENCH_WORKLOAD_DEFAULTS, sweep_rates
from radixsched.config import SchedulerConfig
from radixsched.engine.loader import load_model
from radixsched.server.app import ServerThread, create_app
from radixsched.server.build import engine_for_model
from radixsched.sim.calibrate.measured import read_result_file
from radixsched.sim.calibrate.replay import build_replay
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.table import CalibratedCostModel
from radixsched.sim.settings.simconfig import SimConfig

WORKLOAD = "shared-prefix:groups=2,prompts=4,system_len=64,question_len=16,output_len=6"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    engine, served = engine_for_model(
        load_model("tiny-random"), SchedulerConfig(), kv_slots=4096, context_len=512
    )
    st = ServerThread(create_app(engine, served)).start()
    yield st
    st.stop()


def test_sweep_rates_lie_strictly_between() -> None:
    assert sweep_rates(10.0, 50.0, 3) == [20.0, 30.0, 40.0]
    assert sweep_rates(50.0, 10.0, 1) == [30.0]
    assert sweep_rates(1.0, 2.0, 0) == []


def test_bench_sweep_writes_one_file_calibrate_reads(server: ServerThread, tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    rc = main(
        [
            *("bench", "--url", server.url, "--workload", WORKLOAD),
            *("--sweep", "--sweep-rates", "1", "--json", str(out), "--quiet"),
            *("--requests-csv", str(tmp_path / "rows.csv")),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "radixsched-bench-sweep"
    assert doc["meta"]["version"] and "--sweep" in doc["meta"]["command"]
    stages = [r["stage"] for r in doc["runs"]]
    with open(tmp_path / "rows.csv", newline="") as f:
        policies = [row["policy"] for row in csv.DictReader(f)]
    assert policies == [f"fcfs ({stage})" for stage in stages for _ in range(8)]
    assert stages[:2] == ["synchronous", "throughput"] and stages[2].startswith("rate ")
    sync, probe, rate = doc["runs"]
    assert sync["config"]["bench"]["max_concurrency"] == 1
    assert probe["config"]["bench"]["max_concurrency"] is None
    lo = sync["results"][0]["throughput"]["requests_per_s"]
    hi = probe["results"][0]["throughput"]["requests_per_s"]
    assert min(lo, hi) < rate["config"]["bench"]["request_rate"] < max(lo, hi)
    # Every run starts from a flushed cache: the first request of each group misses.
    for run in doc["runs"]:
        assert run["config"]["bench"]["flush_cache"] is True
        assert 0 < run["results"][0]["hit_rate"] < 1
        recs = run["requests"]
        assert len(recs) == 8 and all(len(r["token_times"]) == 6 for r in recs)
        assert all(r["sent_at"] <= r["token_times"][0] <= r["finished_at"] for r in recs)
    runs = read_result_file(out)
    assert [r.max_concurrency for r in runs] == [1, None, None]
    assert runs[0].workload["spec"] == WORKLOAD and runs[0].workload["kv_slots"] == 4096
    assert runs[0].model == "tiny-random"
    cal = tmp_path / "cal.json"
    assert (
        main(
            ["calibrate", str(out), "--gpu", "cpu", "-o", str(cal), "--iterations", "2", "--quiet"]
        )
        == 0
    )
    fitted = json.loads(cal.read_text())
    assert fitted["fitted_on"]["engine"] == "radixsched"
    assert [e["run"] for e in fitted["fit"]] == stages


def test_sweep_needs_a_json_file(server: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", server.url, "--sweep"]) == 2
    assert "--sweep needs --json" in capsys.readouterr().err
    assert main(
        ["bench", "--url", server.url, "--sweep", "--json", "x.json", "--sweep-rates", "-1"]
    )
    assert "--sweep-rates must be >= 0" in capsys.readouterr().err


def test_replays_regenerate_the_prompts_bench_sent(server: ServerThread, tmp_path: Path) -> None:
    """A spec that leaves params out was sent with bench's defaults for them; the replay
    regenerates those very requests (not the simulator's larger defaults)."""
    out = tmp_path / "one.json"
    spec = "shared-prefix:groups=2,prompts=2,system_len=48"
    assert (
        main(["bench", "--url", server.url, "--workload", spec, "--json", str(out), "--quiet"]) == 0
    )
    (run,) = read_result_file(out)
    assert (
        run.workload["params"]["output_len"]
        == BENCH_WORKLOAD_DEFAULTS["shared-prefix"]["output_len"]
    )
    replay = build_replay(run, 0, SchedulerConfig(), SimConfig(model="tiny-random", gpu="cpu"))
    (wl,) = replay.workloads
    sent = {r["rid"]: r for r in json.loads(out.read_text())["requests"]}
    assert len(wl.requests) == len(sent) == 4
    for r in wl.requests:
        assert r.prompt_len == sent[r.rid]["prompt_len"]
        assert r.sampling.max_new_tokens == sent[r.rid]["output_len"]
        assert r.arrival_time == sent[r.rid]["sent_at"]


def test_profile_writes_a_step_table_simulate_accepts(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    rc = main(
        [
            *("calibrate", "--profile", "--model", "tiny-random", "-o", str(out), "--quiet"),
            *("--batch-sizes", "1,4", "--prefill-tokens", "16,64", "--decode-context", "32,128"),
            *("--repeats", "2"),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert len(rows) == 2 * (2 + 2)
    assert {(r["kind"], r["batch_size"], r["num_tokens"]) for r in rows} >= {
        ("prefill", 4, 256),
        ("decode", 1, 32),
    }
    assert all(r["ms"] > 0 for r in rows)
    assert doc["fitted_on"]["model"] == "tiny-random" and doc["fitted_on"]["gpu"] == "CPU"
    cost = load_cost_model(gpu="cpu", model="tiny-random", calibration=out)
    assert isinstance(cost, CalibratedCostModel) and cost.table.num_points == len(rows)
    rc = main(
        [
            *("simulate", "--workload", WORKLOAD, "--model", "tiny-random", "--gpu", "cpu"),
            *("--calibration", str(out), "--quiet", "--policy", "fcfs"),
        ]
    )
    assert rc == 0


def _finished(server: ServerThread) -> float:
    import httpx

    from radixsched.server.metrics import parse_counter

    text = httpx.get(server.url + "/metrics", timeout=10).text
    return parse_counter(text, 'radixsched_requests_finished_total{finish_reason="length"}')


@pytest.mark.parametrize("warmup", [True, False])
def test_the_sweep_first_sends_the_workload_once_unrecorded(
    server: ServerThread, tmp_path: Path, warmup: bool
) -> None:
    out = tmp_path / "sweep.json"
    before = _finished(server)
    argv = ["bench", "--url", server.url, "--workload", WORKLOAD, "--sweep", "--quiet"]
    argv += ["--sweep-rates", "0", "--json", str(out)]
    assert main(argv + ([] if warmup else ["--no-sweep-warmup"])) == 0
    stages = [r["stage"] for r in json.loads(out.read_text())["runs"]]
    assert stages == ["synchronous", "throughput"]
    assert _finished(server) - before == 8 * (len(stages) + warmup)
