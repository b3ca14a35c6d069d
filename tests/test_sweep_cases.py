"""Sweep configs that vary several settings together (cases) and name the best run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.sweep import main
from radixsched.sim.sweep.config import SweepConfig, SweepError
from radixsched.sim.sweep.report import render_sweep_report
from radixsched.sim.sweep.result import run_sweep


def fake_run(settings: dict[str, Any]) -> dict[str, Any]:
    """A stand-in simulation: goodput from the deployment's settings."""
    if settings.get("dp") == 0:
        raise ValueError("dp must be >= 1")
    split = settings.get("disaggregation", False)
    p, d = settings.get("prefill_instances", 0), settings.get("decode_instances", 0)
    goodput = (p * d if split else 2 * settings.get("dp", 1)) + settings.get("a", 0)
    return {"slo.goodput_requests_per_s": float(goodput), "ttft_s.p99": 1.0 / goodput}


CASES = {
    "deployment": [
        {"name": "co-located", "dp": 4},
        {"name": "1P:3D", "disaggregation": True, "prefill_instances": 1, "decode_instances": 3},
        {"disaggregation": True, "prefill_instances": 2, "decode_instances": 2},
    ]
}


def test_cases_merge_their_settings_and_label_the_point() -> None:
    cfg = SweepConfig.from_mapping({"base": {"x": 1}, "vary": {**CASES, "a": [0, 1]}})
    labels = ("co-located", "1P:3D", "disaggregation=True, prefill_instances=2, decode_instances=2")
    assert dict(cfg.vary)["deployment"] == labels
    points = cfg.points()
    assert len(points) == 6
    assert points[0] == {"x": 1, "dp": 4, "deployment": "co-located", "a": 0}
    assert cfg.settings_of(points[3]) == {
        "x": 1, "disaggregation": True, "prefill_instances": 1, "decode_instances": 3, "a": 1,
    }  # fmt: skip
    vary = cfg.to_json()["vary"]
    assert vary["deployment"][0] == {"name": "co-located", "dp": 4} and vary["a"] == [0, 1]


@pytest.mark.parametrize(
    ("vary", "match"),
    [
        ({"d": [{"dp": 1}, 2]}, r"vary.d\[1\]: every value"),
        ({"d": [{"name": "a", "dp": 1}, {"name": "a", "dp": 2}]}, "two cases are named 'a'"),
        ({"d": [{}]}, "non-empty mapping"),
    ],
)
def test_bad_cases(vary: dict[str, Any], match: str) -> None:
    with pytest.raises(SweepError, match=match):
        SweepConfig.from_mapping({"vary": vary})


@pytest.mark.parametrize(
    ("best", "goal"),
    [
        ("slo.goodput_requests_per_s", "max"),
        ("throughput.output_tokens_per_s", "max"),
        ("ttft_s.p99", "min"),
        ("disaggregation.transfer_s.p99", "min"),
        ("makespan_s", "min"),
        ("retractions", "min"),
        ({"metric": "ttft_s.p99", "goal": "max"}, "max"),
    ],
)
def test_the_best_metric_knows_which_way_is_better(best: Any, goal: str) -> None:
    cfg = SweepConfig.from_mapping({"vary": CASES, "best": best})
    assert cfg.best is not None and cfg.best.goal == goal


def test_bad_best() -> None:
    with pytest.raises(SweepError, match="goal must be max or min"):
        SweepConfig.from_mapping({"vary": CASES, "best": {"metric": "x", "goal": "up"}})
    with pytest.raises(SweepError, match="metric name or"):
        SweepConfig.from_mapping({"vary": CASES, "best": 3})


def test_the_best_run_is_named_in_every_output(tmp_path: Path) -> None:
    cfg = SweepConfig.from_mapping(
        {"name": "pd", "vary": CASES, "best": "slo.goodput_requests_per_s",
         "metrics": ["ttft_s.p99"]}
    )  # fmt: skip
    res = run_sweep(cfg, run_fn=fake_run)
    rows = res.rows()
    assert [r["deployment"] for r in rows] == list(dict(cfg.vary)["deployment"])
    assert [r["slo.goodput_requests_per_s"] for r in rows] == [8.0, 3.0, 4.0]
    assert res.best_run() == 0
    text = res.best_text()
    assert text == (
        "best by slo.goodput_requests_per_s (max): run 0 (deployment=co-located) with 8; "
        "deployment=1P:3D: 3; deployment=disaggregation=True, prefill_instances=2, "
        "decode_instances=2: 4"
    )
    paths = res.write(tmp_path / "out")
    doc = json.loads(paths["json"].read_text())
    assert doc["best"] == {
        "run": 0,
        "metric": "slo.goodput_requests_per_s",
        "goal": "max",
        "value": 8.0,
        "settings": {"deployment": "co-located"},
    }
    html = render_sweep_report(res)
    assert 'class="best"' in html and "Best by slo.goodput_requests_per_s" in html
    # The judged metric is a column of the runs table even when it is not plotted.
    assert "<th>slo.goodput_requests_per_s</th>" in html
    cfg_min = SweepConfig.from_mapping({"vary": CASES, "best": "ttft_s.p99"})
    assert run_sweep(cfg_min, run_fn=fake_run).best_run() == 0


def test_a_case_sweep_runs_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(
        "base:\n"
        "  workload: 'shared-prefix:groups=3,prompts=4,system_len=256,question_len=32,"
        "output_len=16'\n"
        "  request_rate: 50\n"
        "  slo_ttft_ms: 1000\n"
        "  slo_tpot_ms: 50\n"
        "vary:\n"
        "  deployment:\n"
        "    - {name: co-located x2, dp: 2}\n"
        "    - {name: '1P:1D', disaggregation: true}\n"
        "best: slo.goodput_requests_per_s\n"
        "metrics: [slo.attainment, disaggregation.transfer_s.p99]\n"
    )
    assert main([str(cfg), "--jobs", "1", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "best by slo.goodput_requests_per_s (max): run" in out
    rows = json.loads((tmp_path / "o" / "sweep.json").read_text())["rows"]
    assert [r["deployment"] for r in rows] == ["co-located x2", "1P:1D"]
    assert rows[0]["gpus"] == rows[1]["gpus"] == 2
    assert (
        rows[1]["disaggregation.transfer_s.p99"] > 0
        and "disaggregation.transfer_s.p99" not in rows[0]
    )


def test_a_bad_case_fails_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "vary:\n  deployment:\n    - {name: ok, dp: 1}\n"
        "    - {name: split, disaggregation: true, decode_instances: 0}\n"
    )
    assert main([str(cfg), "--jobs", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "run 1 (deployment=split): decode_instances must be >= 1" in err
