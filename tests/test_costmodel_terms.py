"""The cost model's newer terms and settings: prefill efficiency, scheduler CPU time, the
per-request fixed latency, closed-loop clients, context length, config.json models, engine
modes, and every constant as a flag recorded in the JSON output."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixsched.cli.main import main
from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.hardware import get_gpu
from radixsched.sim.cost.hfconfig import ModelConfigError, load_hf_config
from radixsched.sim.cost.models import get_model, resolve_model
from radixsched.sim.cost.roofline import CostModel, CostModelError, shape_of
from radixsched.sim.deploy.closed_loop import scheduler_arrivals
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload

EMPTY = np.zeros(0, dtype=np.int64)


def mkreq(rid: str, n: int = 100, out: int = 8, at: float = 0.0) -> Req:
    return Req(
        rid,
        np.arange(n, dtype=np.int32) + 1000 * int(rid.strip("r") or 0),
        SamplingParams(max_new_tokens=out, ignore_eos=True),
        arrival_time=at,
    )


def extend(n: int, prefix: int = 0) -> ExtendEntry:
    return ExtendEntry(mkreq("r1"), prefix, np.zeros(n, np.int32), EMPTY, EMPTY, True)


def cm(**kw: object) -> CostModel:
    return CostModel(get_gpu("H100"), get_model("llama-3.1-8b"), **kw)  # type: ignore[arg-type]


# ---- step terms -------------------------------------------------------------------------------


def test_prefill_efficiency_grows_with_tokens() -> None:
    # Compute-bound prefills: at T tokens matmuls reach T / (T + T0) of mfu.
    for n in (256, 2048):
        batch = Batch([extend(n)], [])
        ideal = cm(prefill_eff_tokens=0.0, step_overhead_s=0.0).step_time(batch)
        slow = cm(prefill_eff_tokens=512.0, step_overhead_s=0.0).step_time(batch)
        assert slow == pytest.approx(ideal * (1 + 512 / n), rel=1e-12)


def test_scheduler_cpu_time_is_a_constant_plus_per_entry_terms() -> None:
    dec = [DecodeEntry(mkreq(f"r{i}"), 0, 99, EMPTY) for i in range(6)]
    batch = Batch([extend(64), extend(32)], dec)
    base = cm().step_time(batch)
    timed = cm(sched_step_s=3e-4, sched_per_req_s=2e-5, sched_per_prefill_s=1e-4).step_time(batch)
    assert timed - base == pytest.approx(3e-4 + 8 * 2e-5 + 2 * 1e-4, rel=1e-9)


def test_step_terms_rebuild_the_step_time() -> None:
    c = cm(tp=2, sched_step_s=1e-4, prefill_eff_tokens=100.0)
    for batch in (
        Batch([extend(700, 300)], []),
        Batch([], [DecodeEntry(mkreq("r2"), 0, 999, EMPTY)]),
    ):
        comp, mem, tokens, entries, other = c.step_terms(shape_of(batch))
        compute = comp / c.mfu * (1 + c.prefill_eff_tokens / tokens)
        expect = max(compute, mem / c.mbu) + c.step_overhead_s + other
        assert c.step_time(batch) == pytest.approx(expect, rel=1e-12)
        assert entries == 1


@pytest.mark.parametrize(
    "kw",
    [{"sched_step_s": -1.0}, {"request_latency_s": math.inf}, {"prefill_eff_tokens": -5.0}],
)
def test_bad_new_constants(kw: dict[str, float]) -> None:
    with pytest.raises(CostModelError, match="finite number >= 0"):
        cm(**kw)  # type: ignore[arg-type]


# ---- arrivals: fixed latency and closed loop ----------------------------------------------------


def _run(reqs: list[Req], **sim: object) -> list[Req]:
    wl = Workload("t", {}, reqs, has_timestamps=True)
    cfg = SimConfig(model="llama-3.1-8b", gpu="h100", **sim)  # type: ignore[arg-type]
    return simulate(wl, SchedulerConfig(), cfg, check_integrity=True).requests


def test_request_latency_is_added_to_ttft_and_e2e_only() -> None:
    reqs = [mkreq(f"r{i}", at=i * 10.0) for i in range(4)]  # never overlapping
    # (0 given: the engine mode's default front-end time would be in both runs.)
    plain = _run([mkreq(r.rid, at=r.arrival_time) for r in reqs], request_latency_ms=0.0)
    late = _run(reqs, request_latency_ms=7.0)
    for a, b in zip(plain, late, strict=True):
        assert b.times.arrival == a.times.arrival  # the client's send time
        ttft = (b.times.first_token or 0) - b.times.arrival
        assert ttft == pytest.approx((a.times.first_token or 0) - a.times.arrival + 0.007)
        assert np.diff(b.times.token_times) == pytest.approx(np.diff(a.times.token_times))


def test_scheduler_arrivals_are_spaced_by_the_front_end() -> None:
    sends = [0.0, 0.0, 0.0, 0.0105, 1.0]
    assert scheduler_arrivals(sends, 0.001, 0.0) == pytest.approx([0.001] * 3 + [0.0115, 1.001])
    spaced = scheduler_arrivals(sends, 0.001, 0.004)
    assert spaced == pytest.approx([0.001, 0.005, 0.009, 0.013, 1.001])


@given(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=30),
    st.floats(0, 0.01),
    st.floats(0, 0.01),
)
def test_scheduler_arrivals_are_a_single_server_queue(
    gaps: list[float], latency: float, serial: float
) -> None:
    sends = list(itertools.accumulate(gaps))
    got = scheduler_arrivals(sends, latency, serial)
    for i, (t, a) in enumerate(zip(sends, got, strict=True)):
        assert a >= t + latency  # never before it could have got there
        if i:
            assert a >= got[i - 1] + serial - 1e-12  # the front end takes one at a time
            # ... and no later than it must: straight through, or right after the previous
            assert a == pytest.approx(t + latency) or a == pytest.approx(got[i - 1] + serial)


def test_a_closed_loops_clients_sent_together_are_prefilled_first_alone() -> None:
    """Four clients whose requests finish in one step send again together; the front end
    hands the first over alone, and it is prefilled before the others arrive (a real server
    ran prefill batches of 1 then 3, every round). Without a front-end time they arrive
    together and share one prefill."""

    def second_round(**sim: object) -> list[float]:
        reqs = [mkreq(f"r{i}", n=1500, out=4) for i in range(8)]
        done = _run(reqs, max_concurrency=4, **sim)
        firsts = sorted((r.times.first_token or 0.0) for r in done)
        return firsts[4:]

    together = second_round()
    assert len(set(together)) == 1  # one prefill of 4
    staggered = second_round(request_serial_ms=0.05)
    assert staggered[0] < staggered[1] == staggered[2] == staggered[3]


def _in_flight_max(reqs: list[Req]) -> int:
    events = sorted(
        [(r.times.arrival, 1) for r in reqs] + [(r.times.finish or 0.0, -1) for r in reqs],
        key=lambda e: (e[0], e[1]),
    )
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("n", [1, 3])
def test_closed_loop_keeps_at_most_n_requests_in_flight(n: int) -> None:
    reqs = [mkreq(f"r{i}", n=50 + 10 * i, out=5 + i) for i in range(10)]
    done = _run(reqs, max_concurrency=n, request_latency_ms=2.0)
    assert all(r.finish is not None and r.finish.reason.value == "length" for r in done)
    assert _in_flight_max(done) == n
    order = sorted(done, key=lambda r: r.times.arrival)
    assert [r.rid for r in order] == [f"r{i}" for i in range(10)]  # sent in arrival order
    if n == 1:  # each is sent when the previous finished
        for prev, nxt in itertools.pairwise(order):
            assert nxt.times.arrival == pytest.approx(prev.times.finish)


def test_closed_loop_with_more_clients_than_requests_is_open_loop() -> None:
    def reqs() -> list[Req]:
        return [mkreq(f"r{i}", n=60, out=6) for i in range(5)]

    a = _run(reqs())
    b = _run(reqs(), max_concurrency=50)
    assert [r.times.token_times for r in a] == [r.times.token_times for r in b]


def test_closed_loop_waits_for_arrival_times_too() -> None:
    reqs = [mkreq(f"r{i}", at=5.0 * i) for i in range(3)]
    done = _run(reqs, max_concurrency=2)
    assert [r.times.arrival for r in done] == [0.0, 5.0, 10.0]


# ---- context length, models from config.json ---------------------------------------------------

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_context_length_overrides_the_models_limit() -> None:
    long = [
        Req("big", np.arange(140_000, dtype=np.int32) % 50000, SamplingParams(4, ignore_eos=True))
    ]
    wl = lambda: Workload("t", {}, [long[0]], has_timestamps=True)  # noqa: E731
    base = SimConfig(model="llama-3.1-8b", gpu="h200")
    run = simulate(wl(), SchedulerConfig(), base)
    assert run.result.extra["rejected"] == 1
    raised = SimConfig(model="llama-3.1-8b", gpu="h200", context_length=262_144)
    run = simulate(wl(), SchedulerConfig(), raised)
    assert run.result.extra["rejected"] == 0 and run.result.num_completed == 1
    with pytest.raises(CostModelError, match="context_length"):
        load_cost_model(context_length=1)


def test_config_json_gives_the_presets_shape(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(LLAMA_8B))
    spec = resolve_model(str(tmp_path / "llama"))  # a model directory
    preset = get_model("llama-3.1-8b")
    assert spec.name == "llama"
    assert spec.kv_bytes_per_token == preset.kv_bytes_per_token
    assert spec.total_params == pytest.approx(preset.total_params, rel=0.01)
    assert spec.head_dim == 128 and spec.max_context_len == 131072 and not spec.is_moe
    cost = load_cost_model(model=str(tmp_path / "llama" / "config.json"), gpu="h100")
    assert cost.kv_capacity_tokens() == pytest.approx(
        load_cost_model(gpu="h100").kv_capacity_tokens(), rel=1e-4
    )


def test_config_json_moe_mla_quantized_and_multimodal(tmp_path: Path) -> None:
    mixtral = {
        **LLAMA_8B,
        "model_type": "mixtral",
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    p = tmp_path / "mixtral.json"
    p.write_text(json.dumps(mixtral))
    m = load_hf_config(p)
    assert (m.num_experts, m.experts_per_token) == (8, 2)
    assert m.total_params == pytest.approx(46.7e9, rel=0.01)
    assert m.active_params == pytest.approx(12.9e9, rel=0.01)
    deepseek = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
    }
    p.write_text(json.dumps(deepseek))
    d = load_hf_config(p)
    assert d.total_params == pytest.approx(671e9, rel=0.01)
    assert d.active_params == pytest.approx(37.5e9, rel=0.02)
    assert d.dtype_bytes == 1 and d.kv_bytes == 2
    assert d.kv_bytes_per_token == 61 * 576 * 2  # the latent, not K and V heads
    preset = get_model("deepseek-v3")
    assert preset.kv_bytes_per_token == d.kv_bytes_per_token
    # MLA's latent is replicated on every tensor-parallel rank.
    c8 = CostModel(get_gpu("h200"), preset, tp=8)
    assert c8.kv_bytes_per_token_per_gpu == preset.kv_bytes_per_token
    assert c8.kv_capacity_tokens() > 100_000
    vlm = {"model_type": "llava", "text_config": LLAMA_8B, "vision_config": {}}
    p.write_text(json.dumps(vlm))
    assert load_hf_config(p).num_layers == 32


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "invalid JSON"),
        ("[]", "expected a JSON object"),
        ('{"hidden_size": 8}', "num_hidden_layers"),
    ],
)
def test_bad_config_json(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ModelConfigError, match=match):
        load_hf_config(p)
    with pytest.raises(ModelConfigError, match=r"no config\.json"):
        load_hf_config(tmp_path / "missing")


# ---- the CLI: engine modes, flags recorded ---------------------------------------------------------

SMALL = "shared-prefix:groups=4,prompts=4,system_len=256,question_len=32,output_len=16"


def _simulate_json(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "r.json"
    rc = main(
        ["simulate", "--workload", SMALL, "--policy", "fcfs", "--quiet", "--json", str(out), *flags]
    )
    assert rc == 0
    return json.loads(out.read_text())


def test_every_constant_is_a_flag_recorded_in_the_json(tmp_path: Path) -> None:
    doc = _simulate_json(
        tmp_path,
        *("--mfu", "0.4", "--mbu", "0.7", "--step-overhead-ms", "2", "--sched-per-req-ms", "0.01"),
        *("--request-latency-ms", "3", "--prefill-eff-tokens", "32", "--gpu", "a100"),
        *("--request-serial-ms", "0.5"),
    )
    c = doc["config"]["cost_model"]
    assert (c["mfu"], c["mbu"], c["step_overhead_s"], c["prefill_eff_tokens"]) == (
        0.4,
        0.7,
        0.002,
        32.0,
    )
    assert c["sched_per_req_s"] == pytest.approx(1e-5) and c["request_latency_s"] == 0.003
    assert c["gpu"] == "A100-80G" and c["link_bw"] == 300e9
    assert doc["config"]["sim"]["request_latency_ms"] == 3.0
    assert c["request_serial_s"] == 0.0005 and doc["config"]["sim"]["request_serial_ms"] == 0.5
    # The latency is part of every request's TTFT.
    assert doc["results"][0]["ttft_s"]["p50"] > 0.003


def test_engine_mode_vllm_takes_vllms_defaults_unless_a_flag_is_given(tmp_path: Path) -> None:
    sched = _simulate_json(tmp_path, "--engine-mode", "vllm")["config"]["scheduler"]
    # The default GPU, an H200: vllm serve's max_num_seqs there is 1024 (256 on an A100).
    assert sched["enable_mixed_chunk"] is True and sched["max_running_requests"] == 1024
    assert sched["schedule_conservativeness"] == 0.0
    sched = _simulate_json(tmp_path, "--engine-mode", "vllm", "--max-running-requests", "64")[
        "config"
    ]["scheduler"]
    assert sched["max_running_requests"] == 64
    assert _simulate_json(tmp_path)["config"]["scheduler"]["enable_mixed_chunk"] is False


def test_unaligned_chunks_need_token_pages(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["simulate", "--workload", SMALL, "--quiet", "--engine-mode", "vllm", "--page-size", "16"]
    )
    assert rc == 2
    assert "--chunk-alignment none" in capsys.readouterr().err


# ---- the new settings in the run-settings schema (--config, sweep, early checks) ----------------


def test_config_file_takes_the_cost_model_engine_mode_and_closed_loop_keys(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        "engine-mode: vllm\nsim.mfu: 0.4\nrequest_latency_ms: 2\nmax_concurrency: 2\n"
        "context_length: 4096\nmax_running_requests: 64\n"
    )
    doc = _simulate_json(tmp_path, "--config", str(run), "--mbu", "0.6")
    sim, sched, cost = (doc["config"][k] for k in ("sim", "scheduler", "cost_model"))
    assert sim["engine_mode"] == "vllm" and sim["max_concurrency"] == 2
    assert sim["context_length"] == 4096 and sim["request_latency_ms"] == 2.0
    # vLLM's defaults, except the key the file gives.
    assert sched["enable_mixed_chunk"] is True and sched["schedule_conservativeness"] == 0.0
    assert sched["max_running_requests"] == 64
    assert (cost["mfu"], cost["mbu"], cost["request_latency_s"]) == (0.4, 0.6, 0.002)
    assert doc["meta"]["command"]


def test_sweep_settings_apply_the_engine_mode() -> None:
    from radixsched.sim.preflight import check
    from radixsched.sim.settings.runconfig import resolve

    rs = resolve({"engine_mode": "vllm", "max_running_requests": 32})
    cfg = rs.scheduler_config()
    assert cfg.enable_mixed_chunk and cfg.max_running_requests == 32
    assert not resolve({}).scheduler_config().enable_mixed_chunk
    (err,) = check(resolve({"engine_mode": "vlm"}), default_workload=SMALL)
    assert "unknown engine_mode 'vlm'" in err and "did you mean 'vllm'" in err


# Generating this workload takes far longer than the checks below may.
HEAVY = "shared-prefix:groups=4000,prompts=8,system_len=4096"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-concurrency", "0"], "max_concurrency must be >= 1"),
        (["--max-concurrency", "2", "--enable-dp-attention", "--dp", "2"], "not supported"),
        (["--mfu", "1.5"], "mfu must be in (0, 1]"),
        (["--sched-per-req-ms", "-1"], "sched_per_req_s must be a finite number >= 0"),
        (["--engine-mode", "vllm", "--page-size", "16"], "--chunk-alignment none"),
        (["--context-length", "1"], "context_length must be >= 2"),
        (["--model", "/no/such/config.json"], "no config.json"),
        (["--gpu", "a100-80gb", "--model", "llama-3.1-70b"], "does not fit"),
    ],
)
def test_new_settings_fail_before_the_workload_is_built(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    t0 = time.perf_counter()
    assert main(["simulate", "--workload", HEAVY, "--quiet", *args]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and needle in errors[0], errors
    assert time.perf_counter() - t0 < 20  # the heavy workload was never generated


def test_a_bad_engine_mode_in_a_config_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("engine_mode: vlm\nchunk_alignment: tokens\n")
    assert main(["simulate", "--workload", HEAVY, "--config", str(run)]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(errors) == 2
    assert "did you mean 'vllm'" in errors[0] and "chunk_alignment 'tokens'" in errors[1]


def test_header_names_the_engine_mode_and_the_terms_switched_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(
        [
            *("simulate", "--workload", SMALL, "--policy", "fcfs", "--quiet"),
            *("--max-concurrency", "3", "--request-latency-ms", "4", "--gpu", "A100_80GB"),
        ]
    )
    assert rc == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on A100-80G x tp1" in out
    assert "engine sglang; closed loop, 3 clients" in out
    assert "request latency 4 ms" in out and "scheduler" not in out.split("cost model")[1][:80]
