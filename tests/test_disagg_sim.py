"""Prefill/decode disaggregation in the simulator (``sim.disagg``): the accelerated schedulers
against the reference, conservation across instances, a decode instance never prefilling,
the TTFT identity over an infinitely fast link, the best P:D ratio against co-located
serving, and the CLI, config and sweep surfaces."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import golden
from radixsched.cache.base import IntegrityError
from radixsched.cluster.disagg import decode_role
from radixsched.config import SchedulerConfig
from radixsched.sim.cost.hardware import LINKS, PresetError, get_link
from radixsched.sim.deploy import disagg_loop
from radixsched.sim.deploy.disagg import KVLinks, LinkModel
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.settings.deployment import gpu_count
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.sweep.config import SweepConfig, validate_points
from radixsched.sim.sweep.result import run_sweep
from radixsched.sim.workloads.load import Workload, load_workload

SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"
SHARED = "shared-prefix:groups=6,prompts=5,system_len=700,question_len=90,output_len=40"
LONG_OUT = "shared-prefix:groups=4,prompts=6,system_len=300,question_len=50,output_len=400"


def _split(**sim: Any) -> SimConfig:
    return SimConfig(disaggregation=True, **sim)


def _run(
    w: Workload,
    sched: dict[str, Any],
    sim: SimConfig,
    *,
    accelerate: bool = True,
    check: bool = True,
) -> SimRun:
    return simulate(w, SchedulerConfig(**sched), sim, accelerate=accelerate, check_integrity=check)


# ---- the accelerated schedulers give the reference's schedule ------------------------------------

SHAPES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    # Long prompts, small decode pools: requests rejected at one door, others held back.
    "mooncake-1p2d": (
        lambda: load_workload(f"mooncake:{SAMPLE}", num_requests=40),
        {"chunked_prefill_size": 2048},
        {"prefill_instances": 1, "decode_instances": 2, "max_total_tokens": 60_000,
         "decode_max_total_tokens": 40_000},
    ),
    "shared-2p2d-tight": (
        lambda: load_workload(SHARED, request_rate=200.0),
        {"chunked_prefill_size": 512, "page_size": 16},
        {"prefill_instances": 2, "decode_instances": 2, "max_total_tokens": 6000,
         "decode_max_total_tokens": 3000, "disaggregation_link": "roce"},
    ),
    # Long outputs in a small decode pool: retraction offloads and reloads.
    "offload-1p2d": (
        lambda: load_workload(LONG_OUT, request_rate=100.0),
        {"num_reserved_decode_tokens": 8},
        {"prefill_instances": 1, "decode_instances": 2, "max_total_tokens": 8000,
         "decode_max_total_tokens": 4000},
    ),
    # A slow handshake under a backlog: the refresh touches bootstrapping requests.
    "handshake-1p1d": (
        lambda: load_workload(SHARED, request_rate=400.0),
        {"chunked_prefill_size": 512},
        {"prefill_instances": 1, "decode_instances": 1, "max_total_tokens": 6000,
         "disaggregation_bootstrap_ms": 20.0},
    ),
    "priority-2p1d": (
        lambda: load_workload(f"jsonl:{golden._random_trace(48, 11, priorities=True)}"),
        {"enable_priority_scheduling": True, "chunked_prefill_size": 512},
        {"prefill_instances": 2, "decode_instances": 1, "max_total_tokens": 4000,
         "disaggregation_bootstrap_ms": 0.0},
    ),
}  # fmt: skip
POLICIES = ("fcfs", "lpm", "dfs-weight", "hrrn")
CASES = [
    (shape, policy)
    for shape in sorted(SHAPES)
    for policy in (("fcfs", "lof") if shape.startswith("priority") else POLICIES)
]


@pytest.mark.parametrize(("shape", "policy"), CASES)
def test_accelerated_equals_reference(shape: str, policy: str) -> None:
    build, sched, sim = SHAPES[shape]
    w = build()
    sched = {"schedule_policy": policy, **sched}
    fast = _run(w, sched, _split(**sim))  # integrity and conservation after every step
    ref = _run(w, sched, _split(**sim), accelerate=False, check=False)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(w.requests)
    assert a["trace"] == b["trace"], "per-request tokens or times differ"
    assert a["replicas"] == b["replicas"] and golden.comparable(a) == golden.comparable(b)
    assert fast.result.extra["disaggregation"] == ref.result.extra["disaggregation"]


def test_the_shapes_exercise_what_they_claim() -> None:
    runs = {name: _run(b(), s, _split(**m), check=False) for name, (b, s, m) in SHAPES.items()}
    assert runs["mooncake-1p2d"].result.extra["rejected"] > 0
    assert runs["offload-1p2d"].result.retractions > 0
    held = runs["shared-2p2d-tight"].result.extra["disaggregation"]["bootstrap_wait_s"]
    assert held["max"] > 0.05  # a full decode instance held requests back


def test_the_refresh_touches_bootstrapping_requests_in_both_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.queue import WaitingQueue

    touched = {True: 0, False: 0}
    orig = WaitingQueue.ahead_of_refresh

    def counting(self: WaitingQueue) -> Any:
        out = orig(self)
        touched[isinstance(self, NativeWaitingQueue)] += bool(out)
        return out

    monkeypatch.setattr(WaitingQueue, "ahead_of_refresh", counting)
    build, sched, sim = SHAPES["handshake-1p1d"]
    w = build()
    for accelerate in (True, False):
        _run(w, {"schedule_policy": "lpm", **sched}, _split(**sim), accelerate=accelerate)
    assert touched[True] > 0 and touched[False] > 0


# ---- conservation ------------------------------------------------------------------------------------


def test_no_request_is_lost_when_a_decode_instance_is_full() -> None:
    w = load_workload(LONG_OUT, request_rate=200.0)
    run = _run(  # conservation across instances is checked after every step and event
        w,
        {"num_reserved_decode_tokens": 32, "page_size": 4},
        _split(prefill_instances=2, decode_instances=1, decode_max_total_tokens=2500),
    )
    r = run.result
    assert r.num_completed == len(w.requests) and r.num_aborted == 0
    d = r.extra["disaggregation"]
    assert d["bootstrap_wait_s"]["p90"] > 1.0  # most waited on their prefill side
    assert r.retractions > 0  # and decoding offloaded some
    for req in run.requests:
        assert req.output_len == req.sampling.max_new_tokens


def test_the_conservation_check_catches_kv_on_two_decode_instances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[disagg_loop.Cluster] = []
    orig = disagg_loop.Cluster.check_conservation

    def corrupt(self: disagg_loop.Cluster) -> None:
        for leg in self.legs.values():  # a landed request also "on" the other decode instance
            other = decode_role(self.dec[1 - leg.d].sched)
            if leg.landed_s is not None and not leg.req.finished and leg.req not in other.arrived:
                other.arrived.append(leg.req)
                seen.append(self)
                break
        orig(self)

    monkeypatch.setattr(disagg_loop.Cluster, "check_conservation", corrupt)
    with pytest.raises(IntegrityError, match="not only"):
        _run(load_workload(SHARED, request_rate=200.0), {}, _split(decode_instances=2))
    assert seen


# ---- roles ---------------------------------------------------------------------------------------------


def test_decode_instances_never_prefill_and_prefill_instances_never_decode() -> None:
    run = _run(load_workload(SHARED, request_rate=200.0), {"chunked_prefill_size": 256},
               _split(prefill_instances=2, decode_instances=2), check=False)  # fmt: skip
    insts = run.result.extra["disaggregation"]["instances"]
    assert [i["role"] for i in insts] == ["prefill", "prefill", "decode", "decode"]
    for i in insts:
        if i["role"] == "decode":
            assert i["prefill_steps"] == 0 and i["prefill_tokens_computed"] == 0
            assert i["decode_steps"] > 0
        else:
            assert i["decode_steps"] == 0 and i["prefill_steps"] > 0
    assert sum(i["num_requests"] for i in insts if i["role"] == "decode") == 30


def test_per_role_gpus_and_tp() -> None:
    sim = _split(prefill_instances=2, decode_instances=3, prefill_gpu="h100", decode_tp=2,
                 model="llama-3.1-70b", tp=4)  # fmt: skip
    assert gpu_count(sim) == 2 * 4 + 3 * 2
    w = load_workload(SHARED, request_rate=50.0, num_requests=12)
    run = _run(w, {}, sim, check=False)
    d = run.result.extra["disaggregation"]
    assert d["prefill"]["gpu"] == "H100" and d["prefill"]["tp"] == 4
    assert d["decode"]["gpu"] == "H200" and d["decode"]["tp"] == 2
    assert run.result.extra["gpus"] == 14 and run.result.extra["deployment"] == "2P:3D"
    assert d["prefill"]["kv_capacity_tokens"] != d["decode"]["kv_capacity_tokens"]


# ---- the link ------------------------------------------------------------------------------------------


def test_link_presets_and_overrides() -> None:
    assert set(LINKS) == {"nvlink", "infiniband", "roce", "pcie"}
    assert get_link("InfiniBand") is get_link("ib") is LINKS["infiniband"]
    with pytest.raises(PresetError, match="valid: nvlink"):
        get_link("ethernet")
    assert LINKS["nvlink"].bandwidth > LINKS["pcie"].bandwidth > LINKS["roce"].bandwidth
    link = LinkModel.of(_split(disaggregation_link="roce", disaggregation_link_latency_ms=0.2))
    assert link.bandwidth == LINKS["roce"].bandwidth and link.latency_s == pytest.approx(2e-4)
    assert link.bootstrap_s == link.latency_s  # the handshake defaults to one latency
    inf = LinkModel.of(_split(disaggregation_link_bandwidth_gb_s=math.inf))
    assert math.isinf(inf.bandwidth) and inf.to_json()["bandwidth_gb_s"] is None


def test_transfers_queue_on_the_senders_and_receivers_links() -> None:
    links = KVLinks(LinkModel("x", 1e9, 0.5, 0.0), 1000.0, 2000.0, 2, 2)
    # 1000 tokens x max(1000, 2000) bytes at 1 GB/s: 2 ms on the links, then 0.5 s latency.
    assert links.send(0, 0, 1.0, 1000) == pytest.approx((1.0, 1.502))
    assert links.send(0, 1, 1.0, 1000) == pytest.approx((1.002, 1.504))  # P0's egress busy
    assert links.send(1, 1, 1.0, 1000) == pytest.approx((1.004, 1.506))  # D1's ingress busy
    assert links.send(1, 0, 5.0, 1000) == pytest.approx((5.0, 5.502))  # both free again


# ---- TTFT = co-located prefill + transfer over an infinitely fast link --------------------------------


def _spaced(n: int, gap: float) -> Workload:
    w = load_workload(
        "shared-prefix:groups=4,prompts=2,system_len=900,question_len=300,output_len=24"
    )
    reqs = w.requests[:n]
    for i, r in enumerate(reqs):
        r.arrival_time = r.times.arrival = i * gap
    return Workload(w.name, w.params, reqs, True, arrivals=f"every {gap} s")


@pytest.mark.parametrize(("latency_ms", "request_ms"), [(0.0, None), (0.4, None), (0.4, 3.0)])
def test_ttft_is_the_colocated_prefill_plus_the_transfer(
    latency_ms: float, request_ms: float | None
) -> None:
    w = _spaced(8, 5.0)  # one request at a time: the co-located prefill is the same step
    coloc = simulate(w, SchedulerConfig(), SimConfig(request_latency_ms=request_ms))
    split = simulate(
        w,
        SchedulerConfig(),
        _split(
            disaggregation_link_bandwidth_gb_s=math.inf,
            disaggregation_link_latency_ms=latency_ms,
            disaggregation_bootstrap_ms=0.0,
            request_latency_ms=request_ms,  # client-side times: both include it
        ),
        check_integrity=True,
    )
    by_rid = {r.rid: r for r in coloc.requests}
    for r in split.requests:
        c = by_rid[r.rid]
        ttft_c = c.times.first_token - c.times.arrival  # type: ignore[operator]
        ttft_s = r.times.first_token - r.times.arrival  # type: ignore[operator]
        assert ttft_s == pytest.approx(ttft_c + latency_ms / 1e3, abs=1e-12)
        assert r.output_ids == c.output_ids
        gaps_c = [b - a for a, b in itertools.pairwise(c.times.token_times)]
        gaps_s = [b - a for a, b in itertools.pairwise(r.times.token_times)]
        assert gaps_s == pytest.approx(gaps_c, abs=1e-12)  # decoding alone either way


def test_a_finite_link_adds_the_bytes_over_the_bandwidth() -> None:
    w = _spaced(4, 5.0)
    coloc = simulate(w, SchedulerConfig(), SimConfig())
    split = simulate(w, SchedulerConfig(), _split(
        disaggregation_link_bandwidth_gb_s=10.0, disaggregation_link_latency_ms=0.1,
        disaggregation_bootstrap_ms=0.3,
    ))  # fmt: skip
    per_token = 2 * 32 * 8 * 128 * 2  # llama-3.1-8b at tp 1: K and V, 32 layers, 8 heads
    by_rid = {r.rid: r for r in coloc.requests}
    for r in split.requests:
        c = by_rid[r.rid]
        extra = 0.3e-3 + 0.1e-3 + r.prompt_len * per_token / 10e9
        ttft_c = c.times.first_token - c.times.arrival  # type: ignore[operator]
        assert r.times.first_token - r.times.arrival == pytest.approx(ttft_c + extra, abs=1e-12)  # type: ignore[operator]


# ---- the best P:D ratio against co-located serving ------------------------------------------------------

# Long prompts, long outputs and a tight TPOT SLO: co-located prefills stall decoding.
BUILT = {
    "workload": "shared-prefix:groups=120,prompts=1,system_len=6000,question_len=2000,output_len=512",
    "request_rate": 6,
    "slo_ttft_ms": 3000,
    "slo_tpot_ms": 12,
}
RATIOS = {
    "vary": {
        "deployment": [
            {"name": "co-located x4", "dp": 4},
            {
                "name": "1P:3D",
                "disaggregation": True,
                "prefill_instances": 1,
                "decode_instances": 3,
            },
            {
                "name": "2P:2D",
                "disaggregation": True,
                "prefill_instances": 2,
                "decode_instances": 2,
            },
            {
                "name": "3P:1D",
                "disaggregation": True,
                "prefill_instances": 3,
                "decode_instances": 1,
            },
        ]
    },
    "best": "slo.goodput_requests_per_s",
    "metrics": ["slo.goodput_requests_per_s", "tpot_s.p99", "ttft_s.p99"],
}


def test_the_best_ratio_beats_colocated_goodput() -> None:
    cfg = SweepConfig.from_mapping({"base": BUILT, **RATIOS})
    result = run_sweep(cfg)
    rows = result.rows()
    assert [r["deployment"] for r in rows] == ["co-located x4", "1P:3D", "2P:2D", "3P:1D"]
    assert all(r["error"] is None and r["gpus"] == 4 for r in rows)
    best = result.best_run()
    assert best is not None and rows[best]["deployment"] != "co-located x4"
    goodput = [float(r["slo.goodput_requests_per_s"]) for r in rows]  # type: ignore[arg-type]
    assert goodput[best] == max(goodput) > 1.5 * goodput[0]
    text = result.best_text()
    assert text is not None and text.startswith("best by slo.goodput_requests_per_s (max)")


def test_the_example_sweep_is_valid() -> None:
    path = Path(__file__).resolve().parents[1] / "examples" / "disagg-sweep.yaml"
    cfg = SweepConfig.load(path)
    assert cfg.best is not None and cfg.best.goal == "max"
    points = cfg.points()
    assert points[0]["deployment"] == "co-located x8"
    gpus = {gpu_count(SimConfig(**{k: v for k, v in p.items() if k in SimConfig.__dataclass_fields__})) for p in points}  # fmt: skip
    assert gpus == {8}  # every ratio on the baseline's GPU count
    for p in points:
        p["workload"] = f"mooncake:{SAMPLE}"
    validate_points(points, cfg.varied, list(cfg.cases))


# ---- the CLI, run configs and errors ---------------------------------------------------------------------


def test_simulate_cli_outputs_show_both_roles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    out, rep = tmp_path / "r.json", tmp_path / "r.html"
    code = main([
        "simulate", "--quiet", "--workload", SHARED, "--request-rate", "50", "--policy",
        "fcfs,lpm", "--disaggregation", "--prefill-instances", "1", "--decode-instances", "2",
        "--disaggregation-decode-tp", "2", "--disaggregation-link", "nvlink",
        "--json", str(out), "--report", str(rep),
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "1P:2D on 5 GPUs" in printed and "P queue p99" in printed
    doc = json.loads(out.read_text())
    assert doc["config"]["disaggregation"]["decode"]["tp"] == 2
    res = doc["results"][0]
    assert res["deployment"] == "1P:2D" and res["gpus"] == 5
    d = res["disaggregation"]
    for key in ("bootstrap_wait_s", "prefill_queue_wait_s", "transfer_s", "decode_queue_wait_s"):
        assert set(d[key]) >= {"mean", "p50", "p99"}
    assert d["link"]["link"] == "nvlink" and len(d["instances"]) == 3
    html = rep.read_text()
    assert "Prefill/decode disaggregation" in html and 'id="disagg-instances"' in html
    assert "chart-disagg-util" in html


def test_a_run_config_can_split_the_deployment(tmp_path: Path) -> None:
    from radixsched.cli.main import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"workload: '{SHARED}'\nrequest_rate: 50\ndisaggregation: true\n"
        "prefill_instances: 2\ndecode_instances: 1\ndisaggregation_link: pcie\n"
        f"json: {tmp_path / 'o.json'}\n"
    )
    assert main(["simulate", "--quiet", "--config", str(cfg)]) == 0
    res = json.loads((tmp_path / "o.json").read_text())["results"][0]
    assert res["deployment"] == "2P:1D" and res["disaggregation"]["link"]["link"] == "pcie"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--disaggregation", "--dp", "2"], "--dp must stay 1"),
        (["--disaggregation", "--disaggregation-link", "wifi"], "unknown link 'wifi'"),
        (["--disaggregation", "--decode-instances", "0"], "decode_instances must be >= 1"),
        (["--disaggregation", "--decode-tp", "3"], "decode instances: tp=3 must be >= 1 and divide"),
        (["--disaggregation", "--enable-dp-attention"], "--enable-dp-attention"),
        (["--disaggregation", "--decode-router", "nope"], "invalid choice"),
        (["--disaggregation", "--max-concurrency", "4"], "not --max-concurrency clients"),
    ],
)  # fmt: skip
def test_bad_disaggregation_settings_are_one_line_errors(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    assert main(["simulate", "--quiet", "--workload", SHARED, *args]) == 2
    out, err = capsys.readouterr()
    assert needle in err and "Traceback" not in err and out == ""


def test_disaggregation_mode_is_not_a_run_setting(tmp_path: Path) -> None:
    from radixsched.sim.preflight import check
    from radixsched.sim.settings.runconfig import resolve

    errors = check(resolve({"disaggregation_mode": "decode"}))
    assert any("set per instance role" in e for e in errors)


def test_the_simulator_path_never_imports_torch() -> None:
    import subprocess

    code = (
        "import sys\n"
        "from radixsched.config import SchedulerConfig\n"
        "from radixsched.sim.simulate import SimConfig, simulate\n"
        "from radixsched.sim.workloads.load import load_workload\n"
        f"w = load_workload({SHARED!r}, request_rate=50.0, num_requests=8)\n"
        "simulate(w, SchedulerConfig(), SimConfig(disaggregation=True, decode_instances=2))\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
