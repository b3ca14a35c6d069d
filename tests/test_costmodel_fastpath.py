"""``CostModelRunner``'s scalar fast paths give exactly what the array paths give.

The references below are the array-only implementations the fast paths replaced
(``tokens_at``, and ``CostModel.step_times``' formula with every term, the fixed per-step
terms taken from ``CostModel._fixed_s``); the fast paths must match them bit for bit: the same
floats, the same tokens, the same dtypes and shapes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.native import core
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry
from radixsched.sim.cost import runner as runner_module
from radixsched.sim.cost.hardware import get_gpu
from radixsched.sim.cost.models import get_model
from radixsched.sim.cost.roofline import CostModel, StepShape, decode_shape, shape_of
from radixsched.sim.cost.runner import (
    CostModelRunner,
    _RidHashes,
    _stand_in,
    _stand_ins,
)
from radixsched.sim.cost.splitmix import _splitmix64_inplace, _splitmix64_int, splitmix64
from radixsched.sim.cost.table import CalibratedCostModel, CalibrationTable

EMPTY = np.zeros(0, dtype=np.int64)
U64 = st.integers(0, 2**64 - 1)


# ---- references: the array-only implementation, verbatim ---------------------------------


def _ref_rid_hash(rid: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def ref_tokens_at(
    seed: int, vocab_size: int, reqs: Sequence[Req], positions: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    golden = np.uint64(0x9E3779B97F4A7C15)
    hashes = np.fromiter((_ref_rid_hash(r.rid, seed) for r in reqs), np.uint64, len(reqs))
    mixed = splitmix64(hashes[:, None] ^ (positions.astype(np.uint64) * golden))
    tokens = (mixed % np.uint64(vocab_size)).astype(np.int64)
    special = [
        i for i, r in enumerate(reqs) if r.sampling.stop_token_ids or r.scripted_output is not None
    ]
    for i in special:
        req = reqs[i]
        stops = req.sampling.stop_token_ids
        if stops:
            row = tokens[i]
            hit = np.isin(row, stops)
            while hit.any():
                row[hit] = (row[hit] + 1) % vocab_size
                hit = np.isin(row, stops)
        scripted = req.scripted_output
        if scripted is not None and len(scripted):
            out_idx = positions[i] - req.prompt_len
            has = (out_idx >= 0) & (out_idx < len(scripted))
            tokens[i, has] = scripted[out_idx[has]]
    return tokens.astype(np.int32)


def ref_step_times(c: CostModel, shape: StepShape) -> npt.NDArray[np.float64]:
    tokens = shape.num_tokens
    entries = shape.num_extend + shape.num_decode
    eff = 1.0 + c.prefill_eff_tokens / max(tokens, 1)
    fixed = c._fixed_s(tokens, entries, shape.host_load_tokens, shape.num_extend)
    if len(shape.decode_ctx) == 1 and not c.model.is_moe:
        ctx = int(shape.decode_ctx[0])
        lin = 2.0 * c.model.active_params * tokens
        flops_s = (lin + c._attn_flops_per_pair * (shape.extend_attn_pairs + ctx)) / c._flops_per_s
        flops_s = flops_s * eff
        kv = (shape.extend_kv_tokens + ctx) * float(c.kv_bytes_per_token_per_gpu * c.tp)
        bytes_s = (c.weight_bytes_read(tokens) + kv) / c._bytes_per_s
        one = max(flops_s, bytes_s) + fixed
        return np.array([one], dtype=np.float64)
    pairs = shape.extend_attn_pairs + shape.decode_ctx
    kv_tokens = shape.extend_kv_tokens + shape.decode_ctx
    linear = 2.0 * c.model.active_params * tokens
    compute = (linear + c._attn_flops_per_pair * pairs) / c._flops_per_s * eff
    weight_bytes = c.weight_bytes_read(tokens)
    kv_bytes = kv_tokens * float(c.kv_bytes_per_token_per_gpu * c.tp)
    memory = (weight_bytes + kv_bytes) / c._bytes_per_s
    result: npt.NDArray[np.float64] = np.maximum(compute, memory) + fixed
    return result


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- strategies ---------------------------------------------------------------------------

MODELS = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mixtral-8x7b"]


def cost(model: str = "llama-3.1-8b", tp: int = 1) -> CostModel:
    # Every optional term on, so that the fast paths are checked with all of them.
    return CostModel(
        get_gpu("H100"),
        get_model(model),
        tp=tp,
        sched_step_s=2e-4,
        sched_per_req_s=3e-6,
        sched_per_prefill_s=5e-5,
        prefill_eff_tokens=48.0,
    )


@st.composite
def requests(draw: st.DrawFn, rid: str | None = None) -> Req:
    rid = rid if rid is not None else draw(st.sampled_from(["a", "b", "req-7", "x/y", "é"]))
    stops = draw(st.one_of(st.just(()), st.lists(st.integers(0, 6), max_size=3).map(tuple)))
    sp = SamplingParams(max_new_tokens=64, stop_token_ids=stops)
    prompt_len = draw(st.integers(1, 20))
    r = Req(rid, np.arange(prompt_len, dtype=np.int32), sp)
    if draw(st.booleans()):
        script = draw(st.lists(st.integers(0, 2**31 - 1), max_size=6))
        r.scripted_output = np.array(script, dtype=np.int32)
    return r


plain_requests = st.builds(
    lambda rid, n: Req(rid, np.arange(n, dtype=np.int32), SamplingParams()),
    st.text(min_size=1, max_size=8),
    st.integers(1, 30),
)
# At least 7: stop ids are drawn from [0, 6], at most three, so they never cover a vocabulary.
VOCABS = st.sampled_from([7, 32_000, 128_256, 2**31 - 1, 2**31, 2**31 + 1, 2**32, 2**40, 2**63])


# ---- the mixers ---------------------------------------------------------------------------


@given(U64)
def test_splitmix64_on_python_ints_equals_the_uint64_array_path(x: int) -> None:
    assert _splitmix64_int(x) == int(splitmix64(np.array([x], dtype=np.uint64))[0])


@given(st.lists(U64, max_size=40))
def test_splitmix64_in_place_equals_splitmix64(xs: list[int]) -> None:
    a = np.array(xs, dtype=np.uint64)
    expect = splitmix64(a)
    _splitmix64_inplace(a)
    assert same_array(a, expect)


@given(U64, st.integers(-(2**63), 2**63 - 1), st.integers(2, 2**63))
def test_stand_in_on_python_ints_equals_the_array_path(h: int, pos: int, vocab: int) -> None:
    golden = np.uint64(0x9E3779B97F4A7C15)
    x = np.array([h], dtype=np.uint64)[:, None] ^ (
        np.array([[pos]], dtype=np.int64).astype(np.uint64) * golden
    )
    expect = int((splitmix64(x) % np.uint64(vocab))[0, 0])
    assert _stand_in(h, pos, vocab) == expect
    assert _stand_ins(h, [pos, pos], vocab) == [expect, expect]


# ---- tokens --------------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    st.lists(requests(), min_size=0, max_size=4),
    st.integers(1, 20),
    st.integers(-5, 2**40),
    VOCABS,
    st.integers(0, 3),
)
def test_tokens_at_equals_reference(
    reqs: list[Req], steps: int, base: int, vocab: int, seed: int
) -> None:
    runner = CostModelRunner(cost(), seed=seed, vocab_size=vocab)
    positions = base + np.arange(len(reqs) * steps, dtype=np.int64).reshape(len(reqs), steps)
    got = runner.tokens_at(reqs, positions)
    assert same_array(got, ref_tokens_at(seed, vocab, reqs, positions))
    assert got.flags.c_contiguous


@given(st.lists(plain_requests, min_size=1, max_size=3), st.integers(0, 30), VOCABS | st.just(2))
def test_tokens_at_plain_requests_both_paths(reqs: list[Req], steps: int, vocab: int) -> None:
    """Few tokens take the Python-int path, many the array path; both equal the reference."""
    runner = CostModelRunner(cost(), vocab_size=vocab)
    positions = np.arange(len(reqs) * steps, dtype=np.int64).reshape(len(reqs), steps) * 977
    assert same_array(runner.tokens_at(reqs, positions), ref_tokens_at(0, vocab, reqs, positions))


def test_tokens_at_odd_position_arrays_broadcast_as_before() -> None:
    runner = CostModelRunner(cost())
    reqs = [Req(f"r{i}", np.arange(5, dtype=np.int32)) for i in range(3)]
    odd: list[np.ndarray] = [
        np.arange(3, dtype=np.int64),  # one-dimensional: broadcasts to [3, 3]
        np.arange(4, dtype=np.int64)[None, :],  # one row for three requests
        np.arange(6, dtype=np.int32).reshape(3, 2),  # int32 positions (outside the contract)
        np.asfortranarray(np.arange(6, dtype=np.int64).reshape(3, 2)),
    ]
    for positions in odd:
        assert same_array(
            runner.tokens_at(reqs, positions), ref_tokens_at(0, 128_256, reqs, positions)
        )
    empty = np.zeros((0, 4), dtype=np.int64)
    assert same_array(runner.tokens_at([], empty), ref_tokens_at(0, 128_256, [], empty))


def test_memo_follows_seed_sampling_and_script_changes() -> None:
    runner = CostModelRunner(cost(), vocab_size=3)
    pos = np.arange(10, 20, dtype=np.int64)[None, :]
    r = Req("same", np.arange(5, dtype=np.int32))
    before = runner.tokens_at([r], pos)
    assert same_array(before, ref_tokens_at(0, 3, [r], pos))
    # The same rid on another request object with stop ids, then the sampling replaced.
    other = Req("same", np.arange(5, dtype=np.int32), SamplingParams(stop_token_ids=(0, 1)))
    assert set(runner.tokens_at([other], pos)[0].tolist()) == {2}
    r.sampling = dataclasses.replace(r.sampling, stop_token_ids=(2,))
    assert same_array(runner.tokens_at([r], pos), ref_tokens_at(0, 3, [r], pos))
    r.scripted_output = np.array([1, 1, 1, 1, 1, 1, 1], dtype=np.int32)
    assert same_array(runner.tokens_at([r], pos), ref_tokens_at(0, 3, [r], pos))
    # A new seed: as a fresh runner with that seed.
    runner.seed = 5
    r.sampling, r.scripted_output = SamplingParams(), None
    assert same_array(runner.tokens_at([r], pos), ref_tokens_at(5, 3, [r], pos))
    assert not np.array_equal(runner.tokens_at([r], pos), before)


# ---- forward -------------------------------------------------------------------------------


def plain_request(rid: str) -> Req:
    return Req(rid, np.arange(4, dtype=np.int32), SamplingParams())


@st.composite
def batches(draw: st.DrawFn, plain: bool = False) -> Batch:
    """Extend entries ``e0..`` and decode entries ``d0..``; ``plain``: requests without stop
    ids or script (``forward``'s Python-int token path), else any request."""

    def req(rid: str) -> Req:
        return plain_request(rid) if plain else draw(requests(rid=rid))

    ext = []
    for i in range(draw(st.integers(0, 4))):
        new = draw(st.integers(1, 300))
        host = draw(st.integers(0, new - 1))
        prefix = draw(st.integers(0, 5000))
        ids = np.zeros(new, dtype=np.int32)
        ext.append(ExtendEntry(req(f"e{i}"), prefix, ids, EMPTY, EMPTY, draw(st.booleans()), host))
    dec = [
        DecodeEntry(req(f"d{i}"), 0, draw(st.integers(0, 10_000)), EMPTY)
        for i in range(draw(st.integers(0 if ext else 1, 5)))
    ]
    return Batch(ext, dec)


def ref_forward(c: CostModel, seed: int, vocab: int, batch: Batch) -> tuple[dict[str, int], float]:
    duration = ref_step_times(c, shape_of(batch))[0]
    reqs = [e.req for e in batch.extend if e.produces_token]
    positions = [e.prefix_len + e.num_new for e in batch.extend if e.produces_token]
    reqs += [d.req for d in batch.decode]
    positions += [d.position + 1 for d in batch.decode]
    next_tokens: dict[str, int] = {}
    if reqs:
        tokens = ref_tokens_at(seed, vocab, reqs, np.array(positions, dtype=np.int64)[:, None])
        next_tokens = {r.rid: int(t) for r, t in zip(reqs, tokens[:, 0], strict=True)}
    return next_tokens, float(duration)


@settings(max_examples=300)
@given(
    st.booleans().flatmap(batches),
    st.sampled_from(MODELS),
    st.sampled_from([1, 2, 4]),
    VOCABS,
    st.integers(0, 2),
)
def test_forward_equals_reference(batch: Batch, model: str, tp: int, vocab: int, seed: int) -> None:
    c = cost(model, tp)
    res = CostModelRunner(c, seed=seed, vocab_size=vocab).forward(batch)
    tokens, duration = ref_forward(c, seed, vocab, batch)
    assert type(res.duration_s) is float and res.duration_s == duration
    assert res.next_tokens == tokens and list(res.next_tokens) == list(tokens)
    assert all(type(t) is int for t in res.next_tokens.values())
    # The array path over two equal steps agrees too (step_times' one-step branch is exact).
    shape = shape_of(batch)
    two = StepShape(**{**shape.__dict__, "decode_ctx": np.repeat(shape.decode_ctx, 2)})
    assert c.step_times(two)[1] == duration == c.step_times(shape)[0]


def test_forward_empty_batch_still_raises() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        CostModelRunner(cost()).forward(Batch([], []))


def test_forward_of_a_calibrated_model_takes_the_generic_path() -> None:
    c = cost()
    table = CalibrationTable({}, "none")  # no rows: every step falls back to the roofline
    runner = CostModelRunner(CalibratedCostModel(c, table))
    r = Req("c", np.arange(8, dtype=np.int32))
    batch = Batch([ExtendEntry(r, 0, np.zeros(8, dtype=np.int32), EMPTY, EMPTY, True)], [])
    assert (runner.forward(batch).next_tokens, runner.forward(batch).duration_s) == ref_forward(
        c, 0, c.model.vocab_size, batch
    )


# ---- decode --------------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    st.lists(st.integers(1, 100_000), min_size=1, max_size=200),
    st.integers(1, 40),
    st.sampled_from(MODELS),
    st.sampled_from([1, 2, 4]),
)
def test_decode_durations_and_multi_equal_reference(
    lens: list[int], steps: int, model: str, tp: int
) -> None:
    c = cost(model, tp)
    runner = CostModelRunner(c)
    seq = np.array(lens, dtype=np.int64)
    expect = ref_step_times(c, decode_shape(seq, steps)).astype(np.float64)
    assert same_array(runner.decode_durations([], seq, steps), expect)
    reqs = [Req(f"q{i}", np.arange(3, dtype=np.int32)) for i in range(len(lens))]
    multi = runner.decode_multi(reqs, seq, steps)
    assert same_array(multi.step_durations_s, expect)
    positions = seq[:, None] + np.arange(steps, dtype=np.int64)[None, :]
    assert same_array(multi.tokens, ref_tokens_at(0, runner.vocab_size, reqs, positions))


def test_decode_durations_without_finite_rates_use_the_arrays() -> None:
    """A zero bandwidth divides by zero: arrays give inf where Python floats would raise."""
    gpu = dataclasses.replace(get_gpu("H100"), hbm_bw=0.0)
    c = CostModel(gpu, get_model("llama-3.1-8b"))
    seq = np.array([10, 20], dtype=np.int64)
    with np.errstate(divide="ignore"):
        got = CostModelRunner(c).decode_durations([], seq, 3)
        assert same_array(got, ref_step_times(c, decode_shape(seq, 3)))
    assert np.isinf(got).all()


@pytest.mark.parametrize("decode", [False, True])
def test_a_forward_never_returns_a_requests_stop_id(decode: bool) -> None:
    """The one-request-at-a-time token path of ``forward`` hands requests with stop ids to the
    array path, which steps past them: a stop id equal to the stand-in the hash gives at that
    position is never generated (a 4-token vocabulary makes the collision certain)."""
    runner = CostModelRunner(CostModel(get_gpu("h100"), get_model("llama-3.1-8b")), vocab_size=4)
    prompt = np.arange(10, dtype=np.int32)
    plain = Req("s", prompt, SamplingParams(max_new_tokens=5))
    pos = 11 if decode else 10
    would = int(runner.tokens_at([plain], np.array([[pos]], dtype=np.int64))[0, 0])
    r = Req("s", prompt, SamplingParams(max_new_tokens=5, stop_token_ids=(would,)))
    slots = np.arange(1, 12, dtype=np.int64)
    if decode:
        batch = Batch([], [DecodeEntry(r, 3, 10, slots)])
    else:
        batch = Batch([ExtendEntry(r, 0, prompt, slots[:0], slots[:10], True)], [])
    assert runner.forward(batch).next_tokens["s"] != would


# ---- per-request and per-step memos --------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, -3])
def test_rid_hashes_equal_the_whole_strings_digest(seed: int) -> None:
    hashes = _RidHashes(seed)
    for rid in ["", "r0", "req-12345", "é/ü ✓", "0/x"]:
        assert hashes[rid] == _ref_rid_hash(rid, seed)
    assert hashes["r0"] == _ref_rid_hash("r0", seed)  # a hit: the stored value
    assert hashes[12] == _ref_rid_hash(12, seed)  # type: ignore[index,arg-type]  # not a str


def test_rid_hashes_empty_at_their_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "_RID_MEMO_SIZE", 2)
    hashes = _RidHashes(1)
    hashes["a"], hashes["b"] = hashes["a"], hashes["b"]
    assert len(hashes) == 2
    assert hashes["c"] == _ref_rid_hash("c", 1) and list(hashes) == ["c"]


def test_native_tokens_follow_a_reassigned_seed() -> None:
    runner = CostModelRunner(cost(), vocab_size=11)
    got = runner.native_tokens()
    assert got is not None and got[1] == 11 and got[0]["x"] == _ref_rid_hash("x", 0)
    runner.seed = 4
    got = runner.native_tokens()
    assert got is not None and got[0]["x"] == _ref_rid_hash("x", 4)
    runner.vocab_size = 2**31 + 1  # past int32: the array path
    assert runner.native_tokens() is None


@pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")
def test_native_timers_follow_a_reassigned_cost_model() -> None:
    runner = CostModelRunner(cost())
    first = runner.native_prefill_cost(), runner.native_decode_cost()
    assert first == (runner.native_prefill_cost(), runner.native_decode_cost())  # kept
    runner.cost = cost(tp=2)
    second = runner.native_prefill_cost(), runner.native_decode_cost()
    assert second[0] is not first[0] and second[1] is not first[1]


@pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")
def test_native_step_follows_a_reassigned_cost_vocabulary_or_seed() -> None:
    runner = CostModelRunner(cost(), vocab_size=11)
    got = runner.native_step()
    assert got is not None and got[0] is runner.native_prefill_cost() and got[2] == 11
    assert runner.native_step() is got  # kept
    runner.seed = 4  # new hashes
    got = runner.native_step()
    assert got is not None and got[1]["x"] == _ref_rid_hash("x", 4)
    runner.cost = cost(tp=2)  # a new timer
    again = runner.native_step()
    assert again is not None and again[0] is not got[0] and again[0] is runner.native_prefill_cost()
    runner.vocab_size = 2**31 + 1  # past int32: no native tokens
    assert runner.native_step() is None
