"""The roofline cost model, calibration tables and ``CostModelRunner``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.hardware import GPUS, MIB, MODELS, ModelSpec, PresetError, get_gpu
from radixsched.sim.cost.models import get_model
from radixsched.sim.cost.roofline import (
    CostModel,
    CostModelError,
    StepShape,
    decode_shape,
    shape_of,
)
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.cost.table import CalibratedCostModel, CalibrationError, load_calibration

EMPTY = np.zeros(0, dtype=np.int64)


def cm(gpu: str = "H100", model: str = "llama-3.1-8b", **kw: object) -> CostModel:
    return CostModel(get_gpu(gpu), get_model(model), **kw)  # type: ignore[arg-type]


def mkreq(rid: str = "r", prompt_len: int = 100, out: int = 16, **kw: object) -> Req:
    sp = SamplingParams(max_new_tokens=out, ignore_eos=True, **kw)  # type: ignore[arg-type]
    return Req(rid, np.arange(prompt_len) % 1000, sp)


def extend(req: Req, prefix: int, new: int, *, last: bool = True, host: int = 0) -> ExtendEntry:
    ids = np.zeros(new, dtype=np.int32)
    return ExtendEntry(req, prefix, ids, EMPTY, EMPTY, last, host_load_len=host)


def decode(req: Req, position: int) -> DecodeEntry:
    return DecodeEntry(req, 0, position, EMPTY)


def decode_batch(lens: list[int]) -> Batch:
    return Batch([], [decode(mkreq(f"d{i}", n), n - 1) for i, n in enumerate(lens)])


# ---- presets -----------------------------------------------------------------------------


def test_kv_bytes_per_token_of_presets() -> None:
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 131072  # 2*32*8*128*2
    assert get_model("llama-3.1-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert get_model("qwen2.5-7b").kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert get_model("qwen2.5-72b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert get_model("mixtral-8x7b").kv_bytes_per_token == 131072


def architecture_params(m: ModelSpec) -> int:
    """Parameter count implied by the shapes (no biases, standard attention)."""
    h, d = m.hidden_size, m.head_dim
    attn = h * m.num_heads * d * 2 + h * m.num_kv_heads * d * 2
    mlp = 3 * h * m.intermediate_size * m.num_experts
    router = h * m.num_experts if m.is_moe else 0
    norms = 2 * h
    # Input and output embeddings (one matrix when tied), final norm.
    embeddings = (1 if m.tied_embeddings else 2) * m.vocab_size * h + h
    return m.num_layers * (attn + mlp + router + norms) + embeddings


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if not m.mla_kv_dim])
def test_published_parameter_counts_match_the_shapes(name: str) -> None:
    m = get_model(name)
    assert architecture_params(m) == pytest.approx(m.total_params, rel=0.01)
    if not m.is_moe:
        assert m.active_params == m.total_params


def test_mixtral_active_and_total_params() -> None:
    m = get_model("mixtral-8x7b")
    assert m.total_params == pytest.approx(46.7e9, rel=0.01)
    assert m.active_params == pytest.approx(12.9e9, rel=0.01)
    # Shared + 2 experts = active; shared + 8 experts = total.
    assert m.shared_params + 2 * m.expert_params == pytest.approx(m.active_params)
    assert m.shared_params + 8 * m.expert_params == pytest.approx(m.total_params)


def test_required_presets_exist_and_lookup_is_case_insensitive() -> None:
    gpus = {"H100", "H100-PCIe", "H200", "B200", "A100-40G", "A100-80G", "L40S", "MI300X"}
    assert gpus <= set(GPUS)
    models = {
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "codellama-34b",
        "llama-3.1-70b",
        "llama-3.3-70b",
        "qwen2.5-7b",
        "qwen3-32b",
        "mixtral-8x7b",
        "deepseek-v3",
    }
    assert models <= set(MODELS)
    assert get_gpu("h200").memory_bytes == 143_771 * MIB
    assert get_model("LLAMA-3.1-8B").name == "llama-3.1-8b"
    with pytest.raises(PresetError, match="valid: H100, H100-PCIe"):
        get_gpu("V100")


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("a100", "A100-80G"),
        ("A100_80GB", "A100-80G"),
        ("a100-40gb", "A100-40G"),
        ("h100 sxm", "H100"),
        ("H100-SXM5", "H100"),
        ("h100_pcie", "H100-PCIe"),
        ("mi300", "MI300X"),
        ("b200", "B200"),
    ],
)
def test_gpu_spellings(spelling: str, name: str) -> None:
    assert get_gpu(spelling).name == name


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Llama-2-7b-hf", "llama-2-7b"),
        ("llama2-70b", "llama-2-70b"),
        ("CodeLlama-34b-Instruct-hf", "codellama-34b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ],
)
def test_model_spellings(spelling: str, name: str) -> None:
    assert get_model(spelling).name == name


def test_local_engine_models_are_presets_in_float32() -> None:
    tiny = get_model("tiny-random")
    assert (tiny.num_layers, tiny.hidden_size, tiny.dtype_bytes) == (2, 64, 4)
    smol = get_model("smollm2-135m")
    assert smol.tied_embeddings and smol.total_params == pytest.approx(134.5e6, rel=0.01)


# ---- configuration and capacity ------------------------------------------------------------


def test_capacity_formula() -> None:
    c = cm()
    expected = int((81_559 * MIB * 0.88 - 8.03e9 * 2) // 131072)
    assert c.kv_capacity_tokens() == expected
    # tp=2 with 8 KV heads: SGLang's (mem*tp*f - weights) / kv_bytes_per_token.
    c2 = cm(tp=2)
    assert c2.kv_capacity_tokens() == int((81_559 * MIB * 2 * 0.88 - 8.03e9 * 2) // 131072)
    assert cm(mem_fraction_static=0.5).kv_capacity_tokens() < expected
    assert cm(max_total_tokens=1234).kv_capacity_tokens() == 1234


def test_capacity_replicates_kv_heads_beyond_tp() -> None:
    # 8 KV heads over 16 GPUs: each GPU holds one head, so per-GPU KV is 1/8, not 1/16.
    c = cm("H200", "llama-3.1-70b", tp=16)
    assert c.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2


def test_model_that_does_not_fit_is_a_clear_error() -> None:
    with pytest.raises(CostModelError, match=r"llama-3\.1-70b does not fit.*raise --tp"):
        cm("H100", "llama-3.1-70b").kv_capacity_tokens()
    with pytest.raises(CostModelError, match="does not fit"):
        load_cost_model(gpu="L40S", model="qwen2.5-72b", tp=2)
    assert load_cost_model(gpu="H100", model="llama-3.1-70b", tp=4).kv_capacity_tokens() > 0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"tp": 3}, "divide"),
        ({"tp": 0}, "tp=0"),
        ({"mfu": 0.0}, "mfu"),
        ({"mbu": 1.5}, "mbu"),
        ({"mem_fraction_static": 0}, "mem_fraction_static"),
        ({"step_overhead_s": -1}, "step_overhead_s"),
        ({"max_total_tokens": 0}, "max_total_tokens"),
    ],
)
def test_bad_config_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(CostModelError, match=match):
        cm(**kw)


def test_load_cost_model_unknown_names() -> None:
    with pytest.raises(CostModelError, match="unknown GPU 'X1'; valid: H100"):
        load_cost_model(gpu="X1")
    with pytest.raises(CostModelError, match=r"unknown model 'gpt'; valid: llama-2-7b"):
        load_cost_model(model="gpt")
    c = load_cost_model(gpu="h200", model="Qwen2.5-7B", tp=2)
    assert isinstance(c, CostModel) and c.gpu.name == "H200" and c.tp == 2
    assert c.describe()["kv_capacity_tokens"] == c.kv_capacity_tokens()


# ---- step time ---------------------------------------------------------------------------


def test_batch1_decode_matches_the_documented_number() -> None:
    # Module docstring: a batch-1 Llama-3.1-8B decode step on an H100 takes 7.0 ms.
    t = cm().step_time(decode_batch([100]))
    assert t == pytest.approx(0.0070, abs=5e-5)


def test_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    base = cm()
    prefill = Batch([extend(mkreq(), 0, 8192)], [])
    dec = decode_batch([1000] * 8)
    # Changing bandwidth leaves a compute-bound step alone, and vice versa.
    assert cm(mbu=0.4).step_time(prefill) == base.step_time(prefill)
    assert cm(mfu=0.2).step_time(prefill) > base.step_time(prefill)
    assert cm(mfu=0.2).step_time(dec) == base.step_time(dec)
    assert cm(mbu=0.4).step_time(dec) > base.step_time(dec)
    flops = 2 * 8.03e9 * 8192 + 4 * 32 * 32 * 128 * (8192 * 8193 / 2)
    assert base.step_time(prefill) == pytest.approx(flops / (989.4e12 * 0.55) + 0.001)
    eff = 1 + 64 / 8192  # with half of mfu reached at 64 tokens
    slower = cm(prefill_eff_tokens=64.0).step_time(prefill)
    assert slower == pytest.approx(flops / (989.4e12 * 0.55) * eff + 0.001)


def test_monotone_in_tokens_prefix_batch_and_context() -> None:
    c = cm()
    r = mkreq()
    times = [c.step_time(Batch([extend(r, 0, n)], [])) for n in (1, 512, 2048, 8192)]
    assert times == sorted(times) and times[0] < times[-1]
    with_prefix = [c.step_time(Batch([extend(r, p, 2048)], [])) for p in (0, 4096, 32768)]
    assert with_prefix == sorted(with_prefix) and with_prefix[0] < with_prefix[-1]
    by_batch = [c.step_time(decode_batch([2000] * b)) for b in (1, 8, 64, 256)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_ctx = [c.step_time(decode_batch([n] * 32)) for n in (100, 1000, 10000)]
    assert by_ctx == sorted(by_ctx) and by_ctx[0] < by_ctx[-1]


def test_tp_halves_time_plus_the_all_reduces() -> None:
    oh = 0.001
    for batch in (Batch([extend(mkreq(), 0, 4096)], []), decode_batch([3000] * 16)):
        tokens = shape_of(batch).num_tokens
        t1 = cm(tp=1).step_time(batch) - oh
        c2 = cm(tp=2)
        t2 = c2.step_time(batch) - oh - c2.allreduce_s(tokens)
        assert t2 == pytest.approx(t1 / 2, rel=1e-12)
        # 2 all-reduces per layer: latency + 2 (tp-1)/tp of the hidden states over NVLink.
        message = tokens * 4096 * 2
        assert c2.allreduce_s(tokens) == pytest.approx(2 * 32 * (8e-6 + message / 450e9))
    assert cm(tp=1).allreduce_s(4096) == 0.0


def test_mixed_batch_adds_both_sides() -> None:
    c = cm(step_overhead_s=0.0)
    ext = [extend(mkreq("e"), 100, 512)]
    dec = [decode(mkreq(f"d{i}", 2000), 1999) for i in range(4)]
    t_mixed = c.step_time(Batch(ext, dec))
    assert t_mixed >= max(c.step_time(Batch(ext, [])), c.step_time(Batch([], dec)))
    s = shape_of(Batch(ext, dec))
    assert s.num_tokens == 512 + 4
    assert s.extend_attn_pairs == 512 * 100 + 512 * 513 // 2
    assert int(s.decode_ctx[0]) == 4 * 2000
    assert s.extend_kv_tokens == 612


def test_host_load_back_is_added() -> None:
    c = cm(prefill_eff_tokens=0.0)
    r = mkreq()
    plain = c.step_time(Batch([extend(r, 4096, 128)], []))
    loaded = c.step_time(Batch([extend(r, 4096, 128, host=4096)], []))
    assert loaded - plain == pytest.approx(4096 * 131072 / 55e9)


def test_moe_decode_reads_active_weights_at_batch1_and_all_at_large_batches() -> None:
    c = cm("H200", "mixtral-8x7b")
    m = c.model
    assert c.weight_bytes_read(1) == pytest.approx(m.active_params * 2)
    assert c.weight_bytes_read(4096) == pytest.approx(m.total_params * 2)
    assert c.weight_bytes_read(1) < c.weight_bytes_read(4) < c.weight_bytes_read(64)


def test_empty_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        cm().step_time(Batch([], []))


# ---- runner ------------------------------------------------------------------------------


def test_decode_multi_equals_repeated_forward_exactly() -> None:
    c = cm()
    runner = CostModelRunner(c)
    reqs = [mkreq(f"q{i}", 50 + 37 * i) for i in range(5)]
    lens = np.array([r.prompt_len + 3 for r in reqs], dtype=np.int64)
    multi = runner.decode_multi(reqs, lens, 7)
    assert multi.tokens.shape == (5, 7) and multi.tokens.dtype == np.int32
    for k in range(7):
        batch = Batch([], [decode(r, int(n) + k - 1) for r, n in zip(reqs, lens, strict=True)])
        res = runner.forward(batch)
        assert res.duration_s == multi.step_durations_s[k]  # exact equality
        assert [res.next_tokens[r.rid] for r in reqs] == multi.tokens[:, k].tolist()
    assert np.all(np.diff(multi.step_durations_s) >= 0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 200_000), min_size=1, max_size=40),
    st.integers(1, 64),
    st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "qwen2.5-7b"]),
)
def test_decode_multi_equality_property(lens: list[int], steps: int, model: str) -> None:
    c = cm("H200", model)
    multi = c.step_times(decode_shape(np.array(lens, dtype=np.int64), steps))
    for k in (0, steps // 2, steps - 1):
        single = c.step_time(decode_batch([n + k for n in lens]))
        assert single == multi[k]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 50_000),
    st.integers(0, 10**10),
    st.integers(0, 500_000),
    st.integers(0, 20_000),
    st.integers(0, 512),
    st.integers(0, 10**8),
    st.sampled_from(["llama-3.1-8b", "qwen2.5-72b"]),
)
def test_one_step_fast_path_equals_the_vectorised_formula(
    tokens: int, pairs: int, kv: int, host: int, num_decode: int, ctx: int, model: str
) -> None:
    """A single step is evaluated on Python floats; it must round exactly like the arrays."""
    c = cm("H200", model, tp=4)
    shape = StepShape(
        num_extend=1,
        extend_tokens=tokens,
        extend_attn_pairs=pairs,
        extend_kv_tokens=kv,
        host_load_tokens=host,
        num_decode=num_decode,
        decode_ctx=np.array([ctx], dtype=np.int64),
    )
    two = StepShape(**{**shape.__dict__, "decode_ctx": np.array([ctx, ctx], dtype=np.int64)})
    assert c.step_times(shape)[0] == c.step_times(two)[0] == c.step_times(two)[1]


def test_runner_tokens_scripted_then_stand_in() -> None:
    runner = CostModelRunner(cm())
    r = mkreq("s", 10, 8)
    r.scripted_output = np.array([7, 8, 9], dtype=np.int32)
    res = runner.forward(Batch([extend(r, 0, 10)], []))
    assert res.next_tokens == {"s": 7}
    r.output_ids = [7, 8, 9]
    res = runner.forward(Batch([], [decode(r, 11), decode(mkreq("u", 10), 9)]))
    assert res.next_tokens["s"] == 9
    # Beyond the script: the stand-in of an unscripted request with the same id.
    multi = runner.decode_multi([r], np.array([12]), 3)
    stand_in = runner.tokens_at([mkreq("s", 10, 8)], np.array([[12, 13, 14]]))
    assert multi.tokens[0, 0] == 9 and multi.tokens[0, 1:].tolist() == stand_in[0, 1:].tolist()
    assert all(0 <= t < 128_256 for t in stand_in[0])
    # Not the last chunk: no token.
    assert runner.forward(Batch([extend(r, 0, 5, last=False)], [])).next_tokens == {}
    assert runner.eos_token_ids() == ()


def test_stand_in_tokens_are_deterministic_seeded_and_avoid_stop_ids() -> None:
    a, b, other = CostModelRunner(cm()), CostModelRunner(cm()), CostModelRunner(cm(), seed=1)
    r = mkreq("x", 10)
    pos = np.arange(10, 200, dtype=np.int64)[None, :]
    ta, tb, tc = a.tokens_at([r], pos), b.tokens_at([r], pos), other.tokens_at([r], pos)
    assert np.array_equal(ta, tb) and not np.array_equal(ta, tc)
    tiny = CostModelRunner(cm(), vocab_size=3)
    stops = mkreq("y", 10, stop_token_ids=(0, 1))
    assert set(tiny.tokens_at([stops], pos)[0].tolist()) == {2}
    assert set(tiny.tokens_at([mkreq("y", 10)], pos)[0].tolist()) == {0, 1, 2}


def test_simulator_modules_never_import_torch() -> None:
    code = (
        "import sys, radixsched.sim.cost.roofline, radixsched.sim.workloads.load, "
        "radixsched.sim.cost.hardware; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- calibration -------------------------------------------------------------------------

CSV = """kind,batch_size,num_tokens,ms,note
prefill,1,1024,80,a
prefill,1,4096,300,
prefill,4,4096,320,
prefill,4,16384,1200,
decode,1,1000,8,
decode,1,100000,20,
decode,64,64000,15,
decode,64,640000,60,
"""


@pytest.fixture
def table_file(tmp_path: Path) -> Path:
    p = tmp_path / "cal.csv"
    p.write_text(CSV)
    return p


def calibrated(path: Path) -> CalibratedCostModel:
    # mfu 0.55: the generic constant these expectations are written in (H100's own is 0.68).
    c = load_cost_model(calibration=path, mfu=0.55)
    assert isinstance(c, CalibratedCostModel)
    return c


def test_calibration_interpolates_linearly_in_tokens(table_file: Path) -> None:
    c = calibrated(table_file)
    assert c.lookup("prefill", 1, np.array([1024.0]))[0] == pytest.approx(0.080)
    assert c.lookup("prefill", 1, np.array([2560.0]))[0] == pytest.approx(0.190)
    assert c.lookup("decode", 1, np.array([50500.0]))[0] == pytest.approx(0.014)
    # Pure prefill without cached prefix and pure decode come straight from the table.
    assert c.step_time(Batch([extend(mkreq(), 0, 4096)], [])) == pytest.approx(0.300)
    assert c.step_time(decode_batch([1000])) == pytest.approx(0.008)


def test_calibration_interpolates_in_batch_size(table_file: Path) -> None:
    c = calibrated(table_file)
    # batch 2 is a third of the way from batch 1 (300 ms) to batch 4 (320 ms) at 4096 tokens.
    assert c.lookup("prefill", 2, np.array([4096.0]))[0] == pytest.approx(0.300 + 20 / 3e3)


def test_calibration_outside_the_table_scales_the_roofline_continuously(table_file: Path) -> None:
    c = calibrated(table_file)
    ref = c.base.reference_times
    edge = c.lookup("prefill", 4, np.array([16384.0]))[0]
    beyond = c.lookup("prefill", 4, np.array([32768.0]))[0]
    ratio = ref("prefill", 4, np.array([32768.0]))[0] / ref("prefill", 4, np.array([16384.0]))[0]
    assert beyond == pytest.approx(edge * ratio)
    just_past = c.lookup("prefill", 4, np.array([16385.0]))[0]
    assert just_past == pytest.approx(edge, rel=1e-3)
    n = np.array([64000.0])
    big_batch = c.lookup("decode", 1024, n)[0]
    scale = ref("decode", 1024, n)[0] / ref("decode", 64, n)[0]
    assert scale > 1.0  # 1024 tokens of matmuls make the step compute-bound
    assert big_batch == pytest.approx(0.015 * scale)


def test_calibration_adds_cached_prefix_attention_and_host_load(table_file: Path) -> None:
    c = calibrated(table_file)
    r = mkreq()
    plain = c.step_time(Batch([extend(r, 0, 4096)], []))
    with_prefix = c.step_time(Batch([extend(r, 8192, 4096)], []))
    assert with_prefix - plain == pytest.approx(4 * 32 * 32 * 128 * 8192 * 4096 / (989.4e12 * 0.55))
    # Host-loaded tokens are copied over PCIe, not computed: they count as cached prefix.
    loaded = c.step_time(Batch([extend(r, 8192, 4096, host=2048)], []))
    as_prefix = c.step_time(Batch([extend(r, 8192 + 2048, 2048)], []))
    assert loaded - as_prefix == pytest.approx(2048 * 131072 / 55e9)
    assert loaded < with_prefix
    mixed = c.step_time(Batch([extend(r, 0, 4096)], [decode(mkreq("d", 5000), 4999)]))
    assert mixed > plain


def test_calibrated_decode_multi_equals_forward(table_file: Path) -> None:
    runner = CostModelRunner(calibrated(table_file))
    reqs = [mkreq(f"q{i}", 900 + i) for i in range(3)]
    lens = np.array([r.prompt_len for r in reqs], dtype=np.int64)
    multi = runner.decode_multi(reqs, lens, 5)
    for k in range(5):
        batch = Batch([], [decode(r, int(n) + k - 1) for r, n in zip(reqs, lens, strict=True)])
        assert runner.forward(batch).duration_s == multi.step_durations_s[k]


def test_calibration_missing_kind_falls_back_to_roofline(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("kind,batch_size,num_tokens,ms\ndecode,1,1000,8\n")
    c = calibrated(p)
    prefill = Batch([extend(mkreq(), 0, 2048)], [])
    assert c.step_time(prefill) == c.base.step_time(prefill)
    assert c.describe()["calibration_points"] == 1


def test_calibration_json_and_jsonl(tmp_path: Path) -> None:
    rows = [
        {"kind": "decode", "batch_size": 1, "num_tokens": 1000, "ms": 8},
        {"kind": "decode", "batch_size": 1, "num_tokens": 3000, "ms": 10},
    ]
    j = tmp_path / "t.json"
    j.write_text(json.dumps({"rows": rows}))
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for p in (j, jl):
        assert load_calibration(p).num_points == 2
        assert calibrated(p).lookup("decode", 1, np.array([2000.0]))[0] == pytest.approx(0.009)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "a.csv",
            "kind,batch_size,num_tokens,ms\nprefill,1,10,1\nbogus,1,10,1\n",
            r"a\.csv:3: field 'kind'",
        ),
        ("a.csv", "kind,batch_size,ms\nprefill,1,1\n", r"a\.csv:1: missing column\(s\) num_tokens"),
        (
            "a.csv",
            "kind,batch_size,num_tokens,ms\ndecode,0,10,1\n",
            r"a\.csv:2: field 'batch_size'",
        ),
        (
            "a.csv",
            "kind,batch_size,num_tokens,ms\ndecode,1,1.5,1\n",
            r"a\.csv:2: field 'num_tokens'",
        ),
        ("a.csv", "kind,batch_size,num_tokens,ms\ndecode,1,10,-2\n", r"a\.csv:2: field 'ms'"),
        ("a.csv", "kind,batch_size,num_tokens,ms\ndecode,1,10,\n", r"a\.csv:2: missing field 'ms'"),
        (
            "a.csv",
            "kind,batch_size,num_tokens,ms\ndecode,1,10,1\ndecode,1,10,2\n",
            r"a\.csv:3: duplicate point .* first given at .*a\.csv:2",
        ),
        ("a.csv", "kind,batch_size,num_tokens,ms\n", "no rows"),
        ("a.jsonl", '{"kind": "decode"}\n', r"a\.jsonl:1: missing field 'batch_size'"),
        ("b.jsonl", "{oops\n", r"b\.jsonl:1: invalid JSON"),
        ("a.json", "[1, 2]", "expected a list of objects"),
        ("a.txt", "", "unknown calibration format"),
    ],
)
def test_bad_calibration_files(tmp_path: Path, name: str, text: str, match: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        load_calibration(p)


def test_missing_calibration_file(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"nope\.csv: cannot read calibration file"):
        load_cost_model(calibration=tmp_path / "nope.csv")


def test_step_shape_defaults_are_a_single_empty_step() -> None:
    s = StepShape()
    assert s.num_steps == 1 and s.num_tokens == 0


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["llama-3.1-8b", "qwen2.5-72b", "mixtral-8x7b", "deepseek-v3"]),
    st.sampled_from(["H100", "B200", "L40S"]),
    st.integers(0, 3),
    st.integers(0, 20_000),
    st.integers(0, 512),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
)
def test_no_step_is_shorter_than_the_models_floor(
    model: str, gpu: str, num_extend: int, tokens: int, num_decode: int, ctxs: list[int]
) -> None:
    """``min_step_s`` bounds every step from below, one step or several evaluated at once:
    closed-loop replicas jump ahead by it (``sim.replicas.earliest_finish``)."""
    tp = 8 if model == "deepseek-v3" else 1
    c = cm(gpu, model, tp=tp, max_total_tokens=10**6, sched_per_req_s=1e-5)
    floor = c.min_step_s()
    assert floor > 0
    extend = tokens if num_extend else 0
    shape = StepShape(
        num_extend=num_extend,
        extend_tokens=extend,
        extend_attn_pairs=extend * (extend + 1) // 2,
        extend_kv_tokens=extend,
        num_decode=num_decode if num_extend or extend else max(num_decode, 1),
        decode_ctx=np.array(ctxs, dtype=np.int64),
    )
    assert (c.step_times(shape) >= floor).all()
    if not c.model.is_moe:  # and it is close: one token's step reads the weights
        assert c.step_times(StepShape(num_decode=1))[0] < floor / 0.98


def test_the_floor_follows_the_fixed_costs_and_a_gpu_without_sane_links_has_none() -> None:
    base = cm().min_step_s()
    assert cm(step_overhead_s=0.003).min_step_s() == pytest.approx(base + 0.99 * 0.002)
    assert cm(sched_step_s=0.001).min_step_s() == pytest.approx(base + 0.99 * 0.001)
    odd = dataclasses.replace(get_gpu("H100"), link_latency_s=-1e-3)
    assert CostModel(odd, get_model("llama-3.1-8b")).min_step_s() == 0.0
