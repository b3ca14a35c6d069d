"""``bench --sweep`` and ``calibrate --profile`` against the real engine (tiny-random, CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from radixsched.cli import main
from radixsched.config import SchedulerConfig
from radixsched.engine.loader import load_model
from radixsched.server.app import ServerThread, create_app, engine_for_model
from radixsched.server.bench import sweep_rates
from radixsched.sim.costmodel import CalibratedCostModel, load_cost_model
from radixsched.sim.result_files import read_result_file

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
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "radixsched-bench-sweep"
    stages = [r["stage"] for r in doc["runs"]]
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
