"""``radixsched plan``'s inputs and parts: bad input fails in one line naming the flag, exit 2,
before any simulation; the search space, prices, bisection and roofline bound on their own."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cli.main import main
from radixsched.sim.plan.capacity import Probe, find_capacity

TINY = "shared-prefix:groups=4,prompts=4,system_len=256,output_len=16"


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any workload load or simulation fails the test: bad input stops before them."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("ran work on bad input")

    monkeypatch.setattr("radixsched.sim.simulate.simulate", refuse)
    monkeypatch.setattr("radixsched.sim.plan.search.load_for", refuse)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--slo-tpot-ms", "0.5"], "--slo-tpot-ms"),  # a step reads 16 GB of weights: > 3 ms
        (["--slo-ttft-ms", "1", "--gpu", "h200"], "--slo-ttft-ms"),
        (["--slo-e2e-ms", "0.1"], "--slo-e2e-ms"),
        (["--slo-ttft-ms", "100", "--gpu", ","], "--gpu"),
        (["--slo-ttft-ms", "100", "--tp", ""], "--tp"),
        (["--slo-ttft-ms", "100", "--policy", ","], "--policy"),
        (["--slo-ttft-ms", "100", "--dp", "3-1"], "--dp"),
        (["--slo-ttft-ms", "100", "--deployments", ""], "--deployments"),
        (["--slo-ttft-ms", "5000", "--gpu", "cpu"], "--gpu-price"),
        (["--slo-ttft-ms", "5000", "--gpu", "h200,cpu", "--gpu-price", "h200=3"], "--gpu-price"),
        (["--slo-ttft-ms", "100", "--gpu-price", "h200=-1"], "--gpu-price"),
        (["--slo-ttft-ms", "100", "--gpu-price", "h900=2"], "--gpu-price"),
        (["--slo-ttft-ms", "100", "--gpu-price", "h200"], "--gpu-price"),
        ([], "--slo-ttft-ms"),  # no target at all
        (["--slo-ttft-ms", "100", "--slo-attainment", "1.5"], "--slo-attainment"),
        (["--slo-ttft-ms", "100", "--tolerance", "0"], "--tolerance"),
        (["--slo-ttft-ms", "100", "--request-rate", "inf"], "--request-rate"),
        (["--slo-ttft-ms", "100", "--chunked-prefill-size", "512,x"], "--chunked-prefill-size"),
        (["--slo-ttft-ms", "100", "--prefill-instances", "2"], "--deployments"),
        (["--slo-ttft-ms", "100", "--jobs", "0"], "--jobs"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    args: list[str], flag: str, capsys: Any, no_simulation: None
) -> None:
    code = main(["plan", "--workload", TINY, "--quiet", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("radixsched: error: ") and flag in err[0], err


def test_a_bad_value_of_one_candidate_is_refused_before_any_work(
    capsys: Any, no_simulation: None
) -> None:
    code = main(
        ["plan", "--workload", TINY, "--slo-ttft-ms", "100", "--router", "cache-aware,nope",
         "--dp", "2", "--quiet"]
    )  # fmt: skip
    assert code == 2
    assert "unknown router 'nope'" in capsys.readouterr().err


def test_search_space_expansion() -> None:
    from radixsched.sim.plan.space import expand, parse_deployments, values_of

    assert values_of("dp", "1-3,8") == [1, 2, 3, 8]
    assert values_of("gpu", ["h100", "h200"]) == ["h100", "h200"]
    assert parse_deployments("colocated,1:3") == [None, (1, 3)]
    cands = expand(
        {"gpu": "h100,h200", "dp": "1,2", "router": "round-robin,cache-aware"},
        ["lpm"],
        parse_deployments("colocated,1:1"),
        {},
    )
    # one co-located replica has no router: its two router choices are one candidate
    labels = [c.label for c in cands]
    assert len(labels) == len(set(labels))
    assert len(cands) == 2 * (1 + 2 + 2 + 2)
    split = [c for c in cands if c.deployment == (1, 1) and c.dp == 2]
    assert {c.deployment_label for c in split} == {"2P:2D"}
    sim = split[0].settings.sim_config()
    assert (sim.prefill_instances, sim.decode_instances, sim.disaggregation) == (2, 2, True)


def test_prices() -> None:
    from radixsched.sim.cost.hardware import GPUS
    from radixsched.sim.plan.pricing import hourly_cost, parse_prices, price_table
    from radixsched.sim.settings.simconfig import SimConfig

    table = price_table(parse_prices("h100=2.5"))
    assert table["H100"] == 2.5
    assert set(GPUS) - set(table) == {"CPU"}  # every GPU preset has a list price
    assert hourly_cost(SimConfig(gpu="h100", tp=2, dp=3), table) == pytest.approx(15.0)
    split = SimConfig(
        gpu="h100", disaggregation=True, prefill_instances=1, decode_instances=2, decode_gpu="h200"
    )
    assert hourly_cost(split, table) == pytest.approx(2.5 + 2 * table["H200"])


def probe_with_capacity(capacity: float, calls: list[float]) -> Any:
    def probe(rate: float) -> Probe:
        calls.append(rate)
        met = rate <= capacity
        return Probe(rate, 1.0 if met else 0.0, met, 0.5, 0, 0, 0, 0, 0, 0, 0, 0)

    return probe


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.floats(0.01, 1e4),
    start=st.floats(0.01, 1e4),
    tolerance=st.sampled_from([0.01, 0.05, 0.2]),
)
def test_bisection_brackets_the_capacity(capacity: float, start: float, tolerance: float) -> None:
    calls: list[float] = []
    found = find_capacity(
        probe_with_capacity(capacity, calls),
        start=start,
        lowest=1e-3,
        highest=1e5,
        tolerance=tolerance,
    )
    assert found.status == "ok"
    assert found.upper is not None
    assert found.rate <= capacity < found.upper <= found.rate * (1 + tolerance)
    assert len(calls) < 60


def test_bisection_reports_a_capacity_outside_the_range() -> None:
    above = find_capacity(
        probe_with_capacity(1e9, []), start=1, lowest=0.1, highest=100, tolerance=0.05
    )
    assert (above.status, above.rate, above.upper) == ("above range", 100, None)
    below = find_capacity(
        probe_with_capacity(1e-9, []), start=1, lowest=0.1, highest=100, tolerance=0.05
    )
    assert (below.status, below.rate) == ("below range", 0.0)
    stopped = find_capacity(
        probe_with_capacity(5, []), start=1, lowest=0.1, highest=100, tolerance=0.05,
        give_up_below=20,
    )  # fmt: skip
    assert stopped.status == "stopped early" and stopped.upper is not None
    assert stopped.upper <= 20


def test_roofline_bound_is_above_the_simulated_capacity(tmp_path: Path) -> None:
    from radixsched.sim.plan.capacity import Slo, roofline_rate
    from radixsched.sim.plan.search import PlanSpec, evaluate, load_for
    from radixsched.sim.plan.space import expand

    workload = "shared-prefix:groups=16,prompts=8,system_len=1024,output_len=64"
    spec = PlanSpec(workload, None, 0, 1, Slo(None, None, 60.0), 0.05, None)
    loaded = load_for(spec)
    for cand in expand({"workload": workload, "tp": "1,2"}, ["lpm"], [None], {}):
        bound = roofline_rate(
            loaded.tokens, cand.settings.sim_config(), cand.settings.scheduler_config()
        )
        found = evaluate(spec, cand, None)
        assert math.isfinite(bound)
        # a loose SLO: the capacity is where the finite trace still keeps up
        assert found.rate <= bound


def test_calibration_error_is_read_from_the_file(tmp_path: Path) -> None:
    import json

    from radixsched.sim.plan.table import calibration_error

    doc = {
        "format": "radixsched-calibration",
        "version": 1,
        "fit": [
            {"name": "a", "ttft_s": {"error": {"p50": 0.04, "p99": -0.12}},
             "itl_s": {"error": {"p50": 0.02}}},
            {"name": "b", "ttft_s": {"error": {"p50": 0.07}}, "e2e_s": {"error": {"p50": 0.3}}},
        ],
    }  # fmt: skip
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    text = calibration_error(str(path))
    assert "2 run(s)" in text and "TTFT 12%" in text and "ITL 2%" in text and "E2E 30%" in text
    path.write_text(json.dumps({**doc, "fit": []}))
    assert "records no replay error" in calibration_error(str(path))
