"""``radixsched calibrate``: result-file readers, the fit, calibration files, and the
held-out loop from sglang.bench_serving and GuideLLM result files.

The fixtures under ``tests/data/calibration`` are written in each tool's documented layout
by ``make_fixtures.py`` from a "server" whose truth is the simulator with known constants
(``TRUTH`` there), so a correct fit must find predictions that match.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import pytest

from radixsched.cli.main import main
from radixsched.config import SchedulerConfig
from radixsched.sim.calibrate.fit import fit
from radixsched.sim.calibrate.measured import MeasuredRun, ResultFileError, read_result_file
from radixsched.sim.calibrate.replay import build_replay, predict
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.calibration_file import check_fitted_on, read_calibration
from radixsched.sim.cost.roofline import CostModel
from radixsched.sim.cost.table import CalibratedCostModel
from radixsched.sim.settings.simconfig import SimConfig

DATA = Path(__file__).parent / "data" / "calibration"
SGLANG = DATA / "sglang_bench_serving.jsonl"
GUIDELLM = DATA / "guidellm_benchmarks.json"
VLLM = DATA / "vllm_benchmark_serving.json"
SIM = SimConfig(model="tiny-random", gpu="cpu", max_total_tokens=131072, context_length=4096)
BOUNDS = {"e2e_s": 0.05, "itl_s": 0.05, "ttft_s": 0.10}


# ---- readers ------------------------------------------------------------------------------


def test_sglang_reader_reads_every_run_and_its_arrival_process() -> None:
    runs = read_result_file(SGLANG)
    assert [(r.request_rate, r.max_concurrency) for r in runs] == [
        (math.inf, 1),
        (math.inf, None),
        (40.0, None),
        (80.0, None),
        (math.inf, 4),
    ]
    line = json.loads(SGLANG.read_text().splitlines()[0])
    first = runs[0].requests[0]
    assert first.prompt_len == line["input_lens"][0]
    assert first.ttft_s == line["ttfts"][0]
    assert first.e2e_s == pytest.approx(line["ttfts"][0] + sum(line["itls"][0]))
    assert first.sent_at is None and runs[0].model == "tiny-random"
    assert all(len(r.requests) == 48 for r in runs)


def test_vllm_and_guidellm_readers() -> None:
    (v,) = read_result_file(VLLM)
    assert (v.source, v.max_concurrency, v.request_rate, v.model) == (
        "vllm",
        4,
        math.inf,
        "tiny-random",
    )
    g = read_result_file(GUIDELLM)
    assert [r.name for r in g] == [
        "synchronous",
        "throughput",
        "poisson@40",
        "poisson@80",
        "concurrent@4",
    ]
    assert g[0].max_concurrency == 1 and g[4].max_concurrency == 4 and g[2].request_rate == 40
    # Send times are kept, relative to the run's first send.
    sends = [m.sent_at for m in g[2].requests]
    assert min(s for s in sends if s is not None) == 0.0 and all(s is not None for s in sends)
    # GuideLLM and sglang describe the same simulated runs: same TTFTs.
    s = read_result_file(SGLANG)
    assert [m.ttft_s for m in g[0].requests] == pytest.approx(
        [m.ttft_s for m in s[0].requests], abs=2e-6
    )


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("a.jsonl", '{"backend": "sglang", "request_rate": 1}\n', "rerun with --output-details"),
        ("b.jsonl", '{"ttfts": []}\nnot json\n', r"b\.jsonl:2: invalid JSON"),
        ("c.json", '{"benchmarks": []}', "without successful requests"),
        ("d.json", '{"hello": 1}', "not a result file"),
        ("e.json", '{"model_id": "m", "request_rate": "inf"}', "--save-detailed"),
    ],
)
def test_bad_result_files_name_the_file(tmp_path: Path, name: str, text: str, match: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ResultFileError, match=match):
        read_result_file(p)


# ---- the fit ----------------------------------------------------------------------------------


def _replays(runs: list[MeasuredRun]) -> list:
    return [build_replay(r, i, SchedulerConfig(), SIM) for i, r in enumerate(runs)]


def _without_sends(run: MeasuredRun) -> MeasuredRun:
    reqs = tuple(dataclasses.replace(m, sent_at=None) for m in run.requests)
    return dataclasses.replace(run, requests=reqs)


def _check(errors: dict, bounds: dict[str, float]) -> None:
    for metric, bound in bounds.items():
        err = errors[metric]["error"]["mean"]
        assert abs(err) <= bound, (metric, errors)
    assert abs(errors["e2e_s"]["error"]["p90"]) <= 0.10, errors


@pytest.mark.parametrize("path", [GUIDELLM, SGLANG], ids=["guidellm", "sglang"])
def test_held_out_concurrency_is_predicted_from_a_fit_on_the_other_runs(path: Path) -> None:
    runs = read_result_file(path)
    train, held = runs[:-1], runs[-1]
    result = fit(_replays(train), max_iterations=16)
    # Predict the held-out closed-loop run: 4 clients, not its recorded sends.
    errors = predict(
        build_replay(_without_sends(held), 99, SchedulerConfig(), SIM), result.constants
    )
    _check(errors, BOUNDS)


def test_fit_with_send_times_matches_every_run_and_finds_the_true_constants() -> None:
    result = fit(_replays(read_result_file(GUIDELLM)), max_iterations=16)
    for e in result.errors:
        for metric in ("ttft_s", "itl_s", "e2e_s"):
            assert abs(e[metric]["error"]["mean"]) < 0.05, e
    c = result.constants
    # make_fixtures.TRUTH: the per-entry time and the fixed latency are well determined.
    assert c["sched_per_req_s"] == pytest.approx(0.15e-3, rel=0.15)
    assert c["request_latency_s"] == pytest.approx(5e-3, rel=0.15)
    assert 0 < c["mfu"] <= 1 and 0 < c["mbu"] <= 1


def test_calibrate_cli_writes_a_file_simulate_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    rc = main(["calibrate", str(VLLM), "--gpu", "cpu", "-o", str(out), "--iterations", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "concurrency 4" in text and "wrote" in text
    doc = json.loads(out.read_text())
    on = doc["fitted_on"]
    assert (on["model"], on["gpu"], on["tp"]) == ("tiny-random", "CPU", 1)
    assert {"engine", "engine_version", "date", "radixsched_version", "runs"} <= set(on)
    assert len(on["runs"]) == 1 and len(doc["fit"]) == 1
    assert on["runs"][0]["source"] == "vllm" and on["engine"] == "vllm"
    cost = load_cost_model(gpu="cpu", model="tiny-random", calibration=out)
    assert isinstance(cost, CostModel)
    assert cost.sched_per_req_s == pytest.approx(doc["constants"]["sched_per_req_s"])
    # A flag given explicitly wins over the file.
    assert load_cost_model(gpu="cpu", model="tiny-random", calibration=out, mfu=0.5).mfu == 0.5


def test_calibration_used_for_another_model_or_gpu_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.calibration_file import write_calibration

    p = tmp_path / "other.json"
    write_calibration(p, constants={"mfu": 0.4}, fitted_on={"model": "Llama-3.1-8B", "gpu": "a100"})
    cal = read_calibration(p)
    assert check_fitted_on(cal, model="llama-3.1-8b", gpu="A100-80G") == []
    with caplog.at_level(logging.WARNING):
        cost = build_cost_model(SimConfig(model="qwen2.5-7b", gpu="h100", calibration=str(p)))
    assert cost.mfu == 0.4
    text = caplog.text
    assert "fitted on model 'Llama-3.1-8B'" in text and "fitted on gpu 'a100'" in text


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"format": "radixsched-calibration", "version": 7}, "version 7"),
        (
            {"format": "radixsched-calibration", "version": 1, "constants": {"mfu": "x"}},
            "expected a number",
        ),
        (
            {"format": "radixsched-calibration", "version": 1, "constants": {"speed": 1}},
            "unknown constant",
        ),
        ({"format": "radixsched-calibration", "version": 1, "constants": {"mbu": -1}}, ">= 0"),
    ],
)
def test_bad_calibration_documents(tmp_path: Path, doc: dict, match: str) -> None:
    from radixsched.sim.cost.table import CalibrationError

    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=match):
        read_calibration(p)


def test_a_calibration_document_may_carry_a_step_table(tmp_path: Path) -> None:
    from radixsched.sim.cost.calibration_file import write_calibration

    p = tmp_path / "t.json"
    rows = [
        {"kind": "decode", "batch_size": 1, "num_tokens": 100, "ms": 2.0},
        {"kind": "decode", "batch_size": 1, "num_tokens": 1000, "ms": 3.0},
    ]
    write_calibration(p, constants={"request_latency_s": 0.004}, fitted_on={}, rows=rows)
    cost = load_cost_model(gpu="cpu", model="tiny-random", calibration=p)
    assert isinstance(cost, CalibratedCostModel)
    assert cost.base.request_latency_s == 0.004
    assert cost.table.num_points == 2


def test_result_files_may_be_gzipped(tmp_path: Path) -> None:
    import gzip

    for src in (GUIDELLM, SGLANG):
        packed = tmp_path / (src.name + ".gz")
        packed.write_bytes(gzip.compress(src.read_bytes()))
        runs = read_result_file(packed)
        assert all(r.path.startswith(str(packed)) for r in runs)
        plain = read_result_file(src)
        assert [dataclasses.replace(r, path="") for r in runs] == [
            dataclasses.replace(r, path="") for r in plain
        ]
    broken = tmp_path / "cut.json.gz"
    broken.write_bytes(gzip.compress(GUIDELLM.read_bytes())[:200])
    with pytest.raises(ResultFileError, match=r"cut\.json\.gz: cannot read"):
        read_result_file(broken)
