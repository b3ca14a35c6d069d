from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.sweep import main
from radixsched.results.charts import plotly_js
from radixsched.sim.sweep.config import (
    MAX_SERIES,
    SweepConfig,
    SweepError,
    metric_names,
    resolve_settings,
    validate_points,
)
from radixsched.sim.sweep.executors import (
    LocalExecutor,
    RayExecutor,
    RunOutcome,
    run_guarded,
    simulate_point,
)
from radixsched.sim.sweep.report import render_sweep_report
from radixsched.sim.sweep.result import run_sweep

TINY = {
    "workload": "shared-prefix:groups=3,prompts=4,system_len=256,question_len=32,output_len=16",
    "request_rate": 50,
    "max_total_tokens": 20000,
}


def fake_run(settings: dict[str, Any]) -> dict[str, Any]:
    """A deterministic stand-in for a simulation (keeps the machinery tests instant)."""
    if settings.get("page_size") == 0:
        raise ValueError("page_size must be >= 1")
    a = float(settings.get("a", 0))
    b = {"x": 1.0, "y": 2.0}.get(str(settings.get("b", "x")), 0.0)
    return {"hit_rate": a / 10 + b, "ttft_s.p99": a * b, "wall_s": 1.23, "policy": "fcfs"}


# ---- config --------------------------------------------------------------------------------


def test_points_are_the_cartesian_product_last_key_fastest() -> None:
    cfg = SweepConfig.from_mapping(
        {"base": {"a": 0, "c": 1}, "vary": {"a": [1, 2], "b": ["x", "y", "z"]}}
    )
    pts = cfg.points()
    assert len(pts) == 6
    assert [(p["a"], p["b"]) for p in pts[:3]] == [(1, "x"), (1, "y"), (1, "z")]
    assert all(p["c"] == 1 for p in pts)
    assert cfg.varied == ("a", "b") and cfg.metrics == ("hit_rate", "ttft_s.p99")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"base": {}}, "vary"),
        ({"vary": {"a": 1}}, "non-empty list"),
        ({"vary": {"a": []}}, "non-empty list"),
        ({"vary": {"a": [1]}, "extra": 1}, "top-level"),
        ({"vary": {"a": [1]}, "metrics": []}, "metrics"),
        ({"vary": {"a": [1]}, "base": [1]}, "mappings"),
        ([1, 2], "mapping"),
    ],
)
def test_config_errors(data: Any, match: str) -> None:
    with pytest.raises(SweepError, match=match):
        SweepConfig.from_mapping(data)


def test_resolve_settings_routes_keys() -> None:
    r = resolve_settings(
        {
            "schedule_policy": "lpm",
            "sched.page_size": 16,
            "dp": 2,
            "sim.router": "least-load",
            "workload": "multi-turn",
            "request_rate": "inf",
            "workload.num_requests": 10,
            "workload_seed": 3,
        }
    )
    assert r.sched == {"schedule_policy": "lpm", "page_size": 16}
    assert r.sim == {"dp": 2, "router": "least-load"}
    assert r.workload.spec == "multi-turn" and math.isinf(r.workload.request_rate or 0)
    assert (r.workload.num_requests, r.workload.seed) == (10, 3)
    assert resolve_settings({}).workload.request_rate is None
    with pytest.raises(SweepError, match="unknown setting"):
        resolve_settings({"no_such_flag": 1})
    with pytest.raises(SweepError, match="unknown setting"):
        resolve_settings({"sim.schedule_policy": "lpm"})
    with pytest.raises(SweepError, match="request_rate"):
        resolve_settings({"request_rate": "fast"})
    with pytest.raises(SweepError, match="request_rate"):
        resolve_settings({"request_rate": 0})


def test_validate_points_reports_the_run() -> None:
    validate_points([{"page_size": 4, "dp": 2}])
    with pytest.raises(SweepError, match="run 1"):
        validate_points([{"page_size": 4}, {"page_size": 0}])
    with pytest.raises(SweepError, match="run 0"):
        validate_points([{"dp": 2, "no_such": 1}])


# ---- machinery with a fake run -------------------------------------------------------------


def test_run_sweep_rows_errors_and_outputs(tmp_path: Path) -> None:
    cfg = SweepConfig.from_mapping(
        {"name": "t", "base": {"page_size": 1}, "vary": {"a": [1, 2, 4], "b": ["x", "y"]}}
    )
    seen: list[int] = []
    res = run_sweep(cfg, run_fn=fake_run, on_result=lambda i, o: seen.append(i))
    assert sorted(seen) == list(range(6))
    rows = res.rows()
    assert rows[0] == {
        "run": 0,
        "a": 1,
        "b": "x",
        "hit_rate": 1.1,
        "ttft_s.p99": 1.0,
        "policy": "fcfs",
        "error": None,
    }
    assert all("wall_s" not in r for r in rows)  # real time stays out of the rows
    paths = res.write(tmp_path / "out")
    with paths["csv"].open() as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 6 and list(csv_rows[0])[-1] == "error"
    doc = json.loads(paths["json"].read_text())
    assert doc["rows"] == rows
    assert doc["timing"][0] == {"run": 0, "run_wall_s": res.outcomes[0].wall_s, "wall_s": 1.23}
    html = paths["report"].read_text()
    # One chart per (varied setting, metric): 2 x 2, drawn by the inlined plotly.js.
    assert html.count('class="plotly-graph-div"') == 4
    assert "hit_rate vs a" in html and "ttft_s.p99 vs b" in html
    assert "b=x" in html and "a=4" in html  # one line per combination of the others
    # Axes say what they show, with units.
    assert "cache hit rate" in html and "TTFT p99 (s)" in html
    assert html.count(plotly_js()) == 1
    assert "http" not in html.replace(plotly_js(), "").replace("http://www.w3.org/", "")


def test_failed_run_is_recorded_and_sweep_goes_on() -> None:
    cfg = SweepConfig.from_mapping({"vary": {"page_size": [1, 0, 2]}})
    res = run_sweep(cfg, run_fn=fake_run)
    assert res.num_failed == 1
    rows = res.rows()
    assert rows[1]["error"] is not None and "ValueError: page_size" in str(rows[1]["error"])
    assert rows[0]["error"] is None and rows[2]["hit_rate"] == 1.0
    assert "ValueError: page_size" in render_sweep_report(res)


def test_guarded_outcome() -> None:
    ok = run_guarded(fake_run, {"a": 1})
    assert ok.error is None and ok.metrics is not None and ok.wall_s >= 0
    bad = run_guarded(fake_run, {"page_size": 0})
    assert bad.metrics is None and bad.error is not None and "test_sweep.py" in bad.error


def test_many_combinations_plot_their_mean(tmp_path: Path) -> None:
    others = list(range(MAX_SERIES + 1))
    cfg = SweepConfig.from_mapping({"vary": {"a": [1, 2], "c": others}, "metrics": ["hit_rate"]})
    res = run_sweep(cfg, run_fn=fake_run)
    html = render_sweep_report(res)
    assert f"mean over {len(others)} combinations of c" in html


def test_categorical_and_missing_metric() -> None:
    cfg = SweepConfig.from_mapping(
        {"vary": {"b": ["x", "y"]}, "metrics": ["hit_rate", "no_such_metric"]}
    )
    html = render_sweep_report(run_sweep(cfg, run_fn=fake_run))
    assert "No numeric values for: no_such_metric" in html
    assert html.count('class="plotly-graph-div"') == 1
    assert '"x":["x","y"]' in html and '"type":"category"' in html


def test_executor_outcome_count_is_checked() -> None:
    class Short:
        def map(self, run_fn: Any, points: Any, on_result: Any = None) -> list[RunOutcome]:
            return []

    cfg = SweepConfig.from_mapping({"vary": {"a": [1]}})
    with pytest.raises(RuntimeError, match="0 outcomes"):
        run_sweep(cfg, run_fn=fake_run, executor=Short())


# ---- real simulations: in-process, local processes and Ray give identical rows ---------------

SMALL = {
    "name": "small",
    "base": TINY,
    "vary": {"schedule_policy": ["fcfs", "lpm"], "dp": [1, 2]},
}


@pytest.fixture(scope="module")
def serial_rows() -> list[dict[str, Any]]:
    return run_sweep(SweepConfig.from_mapping(SMALL), run_fn=simulate_point).rows()


def test_simulated_sweep_is_sane(serial_rows: list[dict[str, Any]]) -> None:
    assert [r["error"] for r in serial_rows] == [None] * 4
    assert all(r["num_requests"] == 12 for r in serial_rows)
    assert all(0.0 < float(r["hit_rate"]) < 1.0 for r in serial_rows)


def test_local_processes_match_in_process(serial_rows: list[dict[str, Any]]) -> None:
    res = run_sweep(
        SweepConfig.from_mapping(SMALL), run_fn=simulate_point, executor=LocalExecutor(2)
    )
    assert res.rows() == serial_rows


def test_points_on_one_workload_load_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixsched.sim.sweep import executors as sweep
    from radixsched.sim.workloads import load as workloads

    loads: list[str] = []
    real = workloads.load_workload

    def counting(spec: str, **kw: Any) -> Any:
        loads.append(spec)
        return real(spec, **kw)

    monkeypatch.setattr(workloads, "load_workload", counting)
    monkeypatch.setattr(sweep, "_last_workload", None)

    def run(point: dict[str, Any]) -> dict[str, Any]:
        row = dict(simulate_point(point))
        del row["wall_s"], row["requests_per_wall_s"]  # real time
        return row

    points = [dict(TINY, schedule_policy=p) for p in ("fcfs", "lpm", "fcfs")]
    rows = [run(p) for p in points]
    assert len(loads) == 1
    assert rows[0] == rows[2]
    monkeypatch.setattr(sweep, "_last_workload", None)
    assert run(points[1]) == rows[1]  # a reused workload gives the run a fresh one gives
    run(dict(TINY, request_rate=60))  # other arrivals: another workload
    assert len(loads) == 3
    # A trace file changed on disk is read again.
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 40, "output_length": 4}\n')
    point = dict(TINY, workload=f"jsonl:{trace}")
    run(point)
    run(point)
    assert len(loads) == 4
    trace.write_text('{"input_length": 50, "output_length": 4}\n')
    os.utime(trace, ns=(0, 10**9))
    assert run(point)["num_requests"] == 1
    assert len(loads) == 5


def test_points_at_other_rates_reuse_the_prompts(
    monkeypatch: pytest.MonkeyPatch, built_blocks: list[int]
) -> None:
    from radixsched.sim.sweep import executors as sweep

    built = built_blocks
    monkeypatch.setattr(sweep, "_last_workload", None)
    monkeypatch.setattr(sweep, "_prompts", None)
    trace = Path(__file__).parent / "data" / "mooncake_sample.jsonl"
    point = dict(TINY, workload=f"mooncake:{trace}", num_requests=30)
    first = simulate_point(dict(point, request_rate=4))
    n = len(built)
    assert n
    second = simulate_point(dict(point, request_rate=8))
    assert len(built) == n  # the same 30 requests' prompts, lent
    assert first["num_requests"] == second["num_requests"] == 30
    assert first["ttft_s.mean"] != second["ttft_s.mean"]  # other arrivals all the same


def test_ray_matches_local(serial_rows: list[dict[str, Any]]) -> None:
    ray = pytest.importorskip("ray")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # Ray cannot start here (sandbox, ports, shm)
        pytest.skip(f"ray could not start: {e}")
    try:
        res = run_sweep(
            SweepConfig.from_mapping(SMALL), run_fn=simulate_point, executor=RayExecutor()
        )
        assert ray.is_initialized()  # a session we did not start is left running
    finally:
        ray.shutdown()
    assert res.rows() == serial_rows


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"base": TINY, "vary": {"router": ["round-robin", "cache-aware"]}, "name": "cli"}
        )
    )
    out = tmp_path / "out"
    assert main([str(cfg), "--jobs", "1", "--out", str(out)]) == 0
    assert (out / "sweep.csv").exists() and (out / "report.html").exists()
    assert "run 2/2" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"vary": {"schedule_policyy": ["lpm"]}}))
    assert main([str(bad), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "schedule_policyy" in err and "did you mean 'schedule_policy'" in err
    assert not (tmp_path / "o2").exists()


def test_example_config_is_valid() -> None:
    path = Path(__file__).resolve().parents[1] / "examples" / "sweep.yaml"
    cfg = SweepConfig.load(path)
    validate_points(cfg.points())
    assert len(cfg.points()) >= 4


# ---- checked before any run: one line per problem -------------------------------------------


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("base: {workload: '" + TINY["workload"] + "'}\nvary: {dp: [1]}\nmetrics: [hit_rat]\n",
         "unknown metric 'hit_rat' (did you mean 'hit_rate'?)"),
        ("vary:\n  schedule_policy: [lpmm, fcfs]\n", "run 0 (schedule_policy=lpmm): unknown policy"),
        ("base: {gpu: h1000}\nvary: {dp: [1, 2]}\n", "every run: unknown GPU 'h1000'"),
        ("base: {workload: 'mooncake:/no/trace.jsonl'}\nvary: {dp: [1, 2]}\n",
         "every run: /no/trace.jsonl: no such file"),
        ("base:\n  workload: [oops\nvary: {dp: [1]}\n", "bad.yaml:3:5: invalid YAML"),
        ("base: {policy: lpm}\nvary: {dp: [1]}\n", "for simulate only"),
        ("vary: {router: [cache-awar]}\nbase: {dp: 2}\n", "did you mean 'cache-aware'"),
    ],
)  # fmt: skip
def test_bad_configs_fail_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    cfg = write_yaml(tmp_path / "bad.yaml", text)
    out = tmp_path / "out"
    assert main([str(cfg), "--jobs", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "run 1/" not in captured.out  # nothing ran
    lines = [ln for ln in captured.err.splitlines() if ln]
    assert len(lines) == 1 and needle in lines[0], captured.err
    assert "Traceback" not in captured.err and not out.exists()


def test_metric_names_cover_every_result_key() -> None:
    names = metric_names()
    for key in ("hit_rate", "ttft_s.p95", "ttft_s.std", "e2e_s.p99", "slo.attainment",
                "load.overloaded", "throughput.output_tokens_per_s", "lockstep.utilisation",
                "kv_capacity_tokens"):  # fmt: skip
        assert key in names, key
    assert "wall_s" not in names  # kept out of the rows


def test_without_a_rate_a_sweep_sends_generated_requests_at_once() -> None:
    row = simulate_point({**TINY, "request_rate": None, "slo_ttft_ms": 1e6})
    assert row["load.arrival_span_s"] == 0.0
    assert row["slo.attainment"] == 1.0


def test_an_unusable_out_folder_fails_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_yaml(
        tmp_path / "ok.yaml", "base: {workload: '" + TINY["workload"] + "'}\nvary: {dp: [1]}\n"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    assert main([str(cfg), "--out", str(blocker / "out")]) == 2
    captured = capsys.readouterr()
    assert "is not a writable folder" in captured.err and "run 1/" not in captured.out
