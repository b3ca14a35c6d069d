"""A fit that tells the truth: physical bounds on mfu/mbu, constants that end at a bound named
as a model mismatch, the held-out (leave one run out) error beside the fit's own, and both
recorded in the calibration file (version 2; version 1 still read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixsched.cli.calibrate import render_errors, render_honesty
from radixsched.cli.main import main
from radixsched.sim.calibrate.diagnose import at_bounds
from radixsched.sim.calibrate.holdout import leave_one_out, summarise
from radixsched.sim.calibrate.params import CalibrateError, FitResult, param_bounds, upper_bounds
from radixsched.sim.cost.calibration_file import read_calibration, write_calibration
from radixsched.sim.cost.roofline import CONSTANTS
from radixsched.sim.cost.table import CalibrationError

DATA = Path(__file__).parent / "data" / "calibration"
VLLM = DATA / "vllm_benchmark_serving.json"
GUIDELLM = DATA / "guidellm_benchmarks.json"


def _err(ttft: float, itl: float, e2e: float) -> dict:
    return {
        m: {"error": {"mean": v}} for m, v in (("ttft_s", ttft), ("itl_s", itl), ("e2e_s", e2e))
    }


def test_mfu_at_the_bound_is_named_a_mismatch_with_the_cached_prefix_cause() -> None:
    consts = {**CONSTANTS, "mfu": 0.9, "mbu": 0.5}
    (m,) = at_bounds(consts, 0.9)
    assert m.constant == "mfu" and m.bound == 0.9
    assert "cached" in m.cause and "model mismatch" in m.describe()
    # Widened by the user, the same value is no longer at a bound.
    assert at_bounds(consts, 1.0) == []
    assert at_bounds({**CONSTANTS, "mfu": 0.5}, 0.9) == []


def test_mbu_and_times_at_their_upper_bounds_are_named_but_zero_times_are_not() -> None:
    upper = upper_bounds(0.9)
    consts = {**CONSTANTS, "mbu": 0.9, "request_latency_s": upper["request_latency_s"]}
    assert {m.constant for m in at_bounds(consts, 0.9)} == {"mbu", "request_latency_s"}
    assert at_bounds({**CONSTANTS, "step_overhead_s": 0.0, "sched_per_req_s": 0.0}, 0.9) == []


def test_bounds_keep_efficiencies_physical_and_reject_nonsense() -> None:
    lower, upper = param_bounds(0.9)
    assert lower[0] == pytest.approx(1 / 0.9) and lower[2] == pytest.approx(1 / 0.9)
    assert (lower <= upper).all()
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(CalibrateError, match="max_efficiency"):
            param_bounds(bad)


def test_summaries_are_mean_absolute_errors() -> None:
    s = summarise([_err(0.1, -0.2, -0.05), _err(-0.3, 0.0, 0.15)])
    assert (s.ttft, s.itl, s.e2e, s.runs) == pytest.approx((0.2, 0.1, 0.1, 2))
    assert summarise([]).runs == 0


def test_one_run_has_no_held_out_error() -> None:
    full = FitResult(dict(CONSTANTS), [], 0, 0.0)
    assert leave_one_out([], full) == []


def test_the_file_records_both_errors_and_version_1_is_still_read(tmp_path: Path) -> None:
    p = tmp_path / "cal.json"
    honesty = {
        "holdout": [{"run": "a", **_err(0.2, 0.1, 0.3)}],
        "summary": {"in_sample": {"e2e_s": 0.02}, "held_out": {"e2e_s": 0.3}},
        "at_bounds": [],
    }
    write_calibration(p, constants={"mfu": 0.6}, fitted_on={}, fit=[], honesty=honesty)
    doc = json.loads(p.read_text())
    assert doc["version"] == 2 and doc["summary"]["held_out"]["e2e_s"] == 0.3
    assert read_calibration(p).constants == {"mfu": 0.6}
    doc["version"] = 1
    p.write_text(json.dumps(doc))
    assert read_calibration(p).constants == {"mfu": 0.6}
    doc["version"] = 3
    p.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=r"version 3 is not supported .*versions 1, 2"):
        read_calibration(p)


def test_cli_prints_in_sample_and_says_held_out_was_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    args = ["calibrate", str(VLLM), "--gpu", "cpu", "-o", str(out), "--iterations", "1"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "in-sample" in text and "held out: not measured" in text
    doc = json.loads(out.read_text())
    assert doc["summary"]["held_out"] is None and doc["holdout"] == []
    assert set(doc["summary"]["in_sample"]) >= {"ttft_s", "e2e_s"}


def test_cli_refuses_a_max_efficiency_outside_0_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(VLLM), "--gpu", "cpu", "--max-efficiency", "1.5"]) == 2
    assert "--max-efficiency must be in (0, 1]" in capsys.readouterr().err


def test_cli_held_out_errors_sit_beside_the_fit_and_a_tight_bound_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fixtures' server has mfu 0.07 on the cpu preset: held under 0.03, mfu must end at
    # the bound and be reported as a mismatch; two runs give two held-out predictions.
    src = json.loads(GUIDELLM.read_text())
    src["benchmarks"] = src["benchmarks"][:2]
    two = tmp_path / "two.json"
    two.write_text(json.dumps(src))
    out = tmp_path / "cal.json"
    args = ["calibrate", str(two), "--gpu", "cpu", "-o", str(out), "--iterations", "1"]
    assert main([*args, "--max-efficiency", "0.03", "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["holdout"]) == 2 and doc["summary"]["held_out"]["runs"] == 2
    assert doc["constants"]["mfu"] <= 0.03 + 1e-9
    assert "mfu" in [m["constant"] for m in doc["at_bounds"]]
    text = render_errors(doc["fit"], doc["holdout"]) + "\n" + render_honesty(doc)
    assert "held-out TTFT" in text and "held out (leave one run out)" in text
    assert "warning: mfu ended at its bound" in text and "cached" in text
