"""``radixsched plan`` end to end on tiny workloads: the capacity it reports is checked by
``simulate`` itself, capacities move the right way with replicas and SLOs, pruned candidates
would indeed not run, and on a workload built for it the plan prefers a cache-aware router and
policy."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.main import main

SHARED = "shared-prefix:groups=16,prompts=8,system_len=1024,output_len=64"
MULTI = (
    "multi-turn:conversations=16,turns=3,first_len=512,turn_len=64,output_len=32,think_time_s=0.5"
)
FEW_SHOT = "few-shot:questions=128,shots=3"
SMALL_KV = ["--max-total-tokens", "20000"]


def plan(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "plan.json"
    code = main(["plan", *args, "--quiet", "--jobs", "1", "--json", str(out)])
    assert code == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def simulate_attainment(tmp_path: Path, rate: float, *args: str) -> float:
    """SLO attainment as ``simulate`` reports it at ``rate`` (Poisson, the same seed)."""
    out = tmp_path / "simulate.json"
    code = main(["simulate", "--request-rate", repr(rate), *args, "--quiet", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())["results"][0]
    return float(result["slo"]["attainment"])


@pytest.mark.parametrize(
    ("workload", "slo"),
    [
        (SHARED, ["--slo-ttft-ms", "100", "--slo-tpot-ms", "20"]),
        (SHARED, ["--slo-tpot-ms", "10"]),
        (MULTI, ["--slo-ttft-ms", "50"]),
        (FEW_SHOT, ["--slo-ttft-ms", "40"]),
    ],
)
def test_capacity_is_confirmed_by_simulate(tmp_path: Path, workload: str, slo: list[str]) -> None:
    settings = ["--workload", workload, "--policy", "lpm", *SMALL_KV, *slo]
    doc = plan(tmp_path, *settings)
    best = doc["best"]
    assert best["status"] == "ok"
    rate = best["max_request_rate"]
    assert rate > 0
    # simulate takes --policy and the same settings; its SLO share counts what the plan's does
    assert simulate_attainment(tmp_path, rate, *settings) >= 0.9
    assert simulate_attainment(tmp_path, 1.1 * rate, *settings) < 0.9
    assert best["slo_attainment"] >= 0.9
    assert best["cost_per_hour"] == pytest.approx(3.99)  # one H200 at its list price


def test_more_replicas_and_looser_slos_never_lower_capacity(tmp_path: Path) -> None:
    from radixsched.sim.plan.capacity import Slo
    from radixsched.sim.plan.search import PlanSpec, evaluate
    from radixsched.sim.plan.space import expand

    cands = expand(
        {"workload": SHARED, "dp": "1-3", "max_total_tokens": "20000"}, ["lpm"], [None], {}
    )
    assert [c.dp for c in cands] == [1, 2, 3]

    def capacity(cand: Any, ttft_ms: float) -> float:
        spec = PlanSpec(SHARED, None, 0, 1, Slo(ttft_ms / 1e3, 0.02, None), 0.05, None)
        return evaluate(spec, cand, None).rate

    by_dp = [capacity(c, 100) for c in cands]
    assert by_dp[0] > 0
    assert by_dp == sorted(by_dp), by_dp
    assert by_dp[2] > by_dp[0]
    by_slo = [capacity(cands[0], ms) for ms in (50, 100, 400)]
    assert by_slo == sorted(by_slo), by_slo


def test_pruned_candidates_would_not_run(tmp_path: Path, capsys: Any) -> None:
    # 70B in bf16 is 141 GB of weights: not on one L40S, nor on two; it fits four H200s at tp2.
    doc = plan(
        tmp_path,
        "--workload",
        SHARED,
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "l40s,h200",
        "--tp",
        "1,2",
        "--policy",
        "lpm",
        "--slo-ttft-ms",
        "2000",
    )
    pruned = [c for c in doc["candidates"] if c["status"] == "pruned"]
    assert {(c["gpu"], c["tp"]) for c in pruned} == {("L40S", 1), ("L40S", 2), ("H200", 1)}
    assert all("does not fit" in c["reason"] for c in pruned)
    assert doc["best"]["gpu"] == "H200" and doc["best"]["tp"] == 2
    capsys.readouterr()
    # simulate refuses each pruned one before running
    for c in pruned:
        code = main(
            ["simulate", "--workload", SHARED, "--model", "llama-3.1-70b", "--gpu", c["gpu"],
             "--tp", str(c["tp"]), "--policy", "lpm", "--quiet"]
        )  # fmt: skip
        assert code == 2
        assert "does not fit" in capsys.readouterr().err


def test_a_request_longer_than_the_kv_pool_is_pruned(tmp_path: Path) -> None:
    # Each request is 1,024 + 128 prompt tokens and 64 output: 1,216 tokens.
    doc = plan(
        tmp_path,
        "--workload",
        SHARED,
        "--max-total-tokens",
        "1000,20000",
        "--policy",
        "lpm",
        "--slo-ttft-ms",
        "100",
    )
    by_kv = {c["max_total_tokens"]: c for c in doc["candidates"]}
    assert by_kv[1000]["status"] == "pruned"
    assert "1,216 tokens" in by_kv[1000]["reason"] and "1,000" in by_kv[1000]["reason"]
    assert by_kv[20000]["status"] == "ok"
    # it would not run: the simulator fails every request that cannot fit
    from radixsched.config import SchedulerConfig
    from radixsched.sim.settings.simconfig import SimConfig
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import load_workload

    wl = load_workload(SHARED, request_rate=1.0)
    run = simulate(wl, SchedulerConfig(schedule_policy="lpm"), SimConfig(max_total_tokens=1000))
    assert run.result.num_completed == 0


def write_tenants(path: Path, tenants: int = 8, per: int = 16) -> None:
    """One long system prompt shared by all, then a long document per tenant, then a short
    question: the prefix a cache-aware router keeps together and ``lpm`` batches."""
    rng = random.Random(0)
    system = list(range(1, 1025))
    rows = []
    for t in range(tenants):
        doc = [rng.randrange(5000, 120000) for _ in range(2048)]
        for _ in range(per):
            question = [rng.randrange(5000, 120000) for _ in range(32)]
            rows.append({"input_ids": system + doc + question, "output_length": 32,
                         "tenant": f"t{t}"})  # fmt: skip
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plan_prefers_cache_aware_router_and_policy(tmp_path: Path) -> None:
    trace = tmp_path / "tenants.jsonl"
    write_tenants(trace)
    doc = plan(
        tmp_path,
        "--workload",
        f"jsonl:{trace}",
        "--dp",
        "2",
        "--router",
        "round-robin,cache-aware",
        "--policy",
        "fcfs,lpm",
        "--max-total-tokens",
        "7000",
        "--slo-ttft-ms",
        "300",
        "--slo-tpot-ms",
        "30",
    )
    rates = {(c["router"], c["policy"]): c["max_request_rate"] for c in doc["candidates"]}
    best = doc["best"]
    assert (best["router"], best["policy"]) == ("cache-aware", "lpm"), rates
    assert best["gpus"] == 2
    worst = rates[("round-robin", "fcfs")]
    assert worst is None or best["max_request_rate"] > 1.2 * worst
    assert doc["runner_up"] is not None


def test_target_rate_finds_the_fewest_gpus(tmp_path: Path) -> None:
    settings = ["--workload", SHARED, "--policy", "lpm", *SMALL_KV, "--slo-ttft-ms", "100"]
    one = plan(tmp_path, *settings)["best"]["max_request_rate"]
    doc = plan(tmp_path, *settings, "--dp", "1-4", "--request-rate", repr(2.5 * one))
    best = doc["best"]
    assert best["max_request_rate"] >= 2.5 * one
    assert 1 < best["dp"] < 4, [(c["dp"], c["status"]) for c in doc["candidates"]]
    for c in doc["candidates"]:  # fewer replicas miss the target; more are not needed
        if c["dp"] < best["dp"]:
            assert c["status"] == "below target"
            assert c["max_request_rate"] is None
        elif c["dp"] > best["dp"]:
            assert c["status"] == "stopped early"
    # simulate agrees: one replica fewer misses the SLOs at the target rate
    fewer = [*settings, "--dp", str(best["dp"] - 1)]
    assert simulate_attainment(tmp_path, 2.5 * one, *fewer) < 0.9


def test_report_and_json_shape(tmp_path: Path) -> None:
    report = tmp_path / "plan.html"
    doc = plan(
        tmp_path, "--workload", SHARED, "--policy", "fcfs,lpm", *SMALL_KV,
        "--chunked-prefill-size", "512,8192", "--slo-ttft-ms", "100", "--report", str(report),
    )  # fmt: skip
    keys = {"gpu", "tp", "dp", "policy", "disaggregation", "chunked_prefill_size",
            "max_request_rate", "gpus", "cost_per_hour", "cost_per_million_output_tokens",
            "slo_attainment", "hit_rate"}  # fmt: skip
    assert len(doc["candidates"]) == 4
    for c in doc["candidates"]:
        assert keys <= set(c)
    assert keys <= set(doc["best"])
    html = report.read_text()
    assert "capacity-cost" in html and "latency-rate" in html


def test_ray_gives_the_local_result() -> None:
    ray = pytest.importorskip("ray")
    from radixsched.sim.plan.capacity import Slo
    from radixsched.sim.plan.planner import run_plan
    from radixsched.sim.plan.pricing import price_table
    from radixsched.sim.plan.search import PlanSpec, load_for
    from radixsched.sim.plan.space import expand

    spec = PlanSpec(SHARED, None, 0, 1, Slo(0.1, None, None), 0.05, None, price_table({}))
    cands = expand({"workload": SHARED, "max_total_tokens": "20000"}, ["lpm"], [None], {})
    loaded = load_for(spec)
    local = run_plan(spec, cands, loaded, jobs=1, ray_address=None, on_result=lambda r: None)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # no room to start a local cluster here
        pytest.skip(f"ray could not start: {e}")
    try:
        remote = run_plan(spec, cands, loaded, jobs=2, ray_address="auto", on_result=print)
        assert ray.is_initialized()  # a session we did not start is left running
    finally:
        ray.shutdown()
    assert [r.max_request_rate for r in remote] == [r.max_request_rate for r in local]
    assert local[0].max_request_rate is not None
