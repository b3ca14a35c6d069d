"""The engine's model side: exact KV reuse through the slot pool, batching, sampling, loaders.

Everything runs on ``tiny-random`` (fp32, CPU) in seconds; the transformers parity test for the
architecture variants is marked slow (it imports transformers).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.engine.config import (
    BYTE_BOS_ID,
    BYTE_EOS_ID,
    SHAPE_PRESETS,
    Architecture,
    ModelConfig,
    RopeScaling,
    RopeScalingKind,
    random_preset_config,
)
from radixsched.engine.loader import LoadedModel, load_model, model_names
from radixsched.engine.model import rope_inv_freq
from radixsched.engine.runner import TorchRunner
from radixsched.engine.sampling import filter_logits, mix_seed, sample_tokens
from radixsched.engine.tokenizer import ByteTokenizer, ChatTemplate, HFTokenizer
from radixsched.engine.weights import (
    build_empty_model,
    convert_gguf_to_dir,
    init_random_,
    unpermute_rope_rows,
    write_model_dir,
)
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ATOL = 1e-5
EMPTY = np.zeros(0, dtype=np.int64)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny-random", seed=0)


class Slots:
    """Bump allocator over slots 1.. (slot 0 is the padding slot)."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def take(self, n: int) -> np.ndarray:
        return np.array([next(self._next) for _ in range(n)], dtype=np.int64)


_rids = itertools.count()


def new_req(ids: Sequence[int], sampling: SamplingParams | None = None) -> Req:
    return Req(f"t{next(_rids)}", np.asarray(ids), sampling or SamplingParams())


def extend(
    req: Req,
    prefix_len: int,
    new_ids: Sequence[int] | np.ndarray,
    prefix_slots: np.ndarray,
    new_slots: np.ndarray,
    produces: bool = True,
) -> ExtendEntry:
    return ExtendEntry(
        req=req,
        prefix_len=prefix_len,
        new_token_ids=np.asarray(new_ids, dtype=np.int32),
        prefix_slots=prefix_slots,
        new_slots=new_slots,
        produces_token=produces,
    )


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, size=n).tolist()


def full_prefill(runner: TorchRunner, slots: Slots, ids: Sequence[int]) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` of a prefill from scratch (into fresh slots)."""
    req = new_req(ids)
    batch = Batch([extend(req, 0, ids, EMPTY, slots.take(len(ids)))], [])
    return runner.forward_logits(batch, all_tokens=True)[req.rid]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ---- exact KV reuse -----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 7, 19])
def test_prefix_from_pool_equals_full_prefill(tiny: LoadedModel, k: int) -> None:
    runner, slots = TorchRunner(tiny, 256), Slots()
    ids = prompt(20)
    ref = full_prefill(runner, slots, ids)
    # The prefix is computed by another request, in an earlier step, into other slots.
    owner = new_req(ids[:k])
    prefix_slots = slots.take(k)
    runner.forward_logits(Batch([extend(owner, 0, ids[:k], EMPTY, prefix_slots)], []))
    req = new_req(ids)
    batch = Batch([extend(req, k, ids[k:], prefix_slots, slots.take(20 - k))], [])
    got = runner.forward_logits(batch, all_tokens=True)[req.rid]
    assert got.shape == (20 - k, tiny.config.vocab_size)
    assert max_diff(got, ref[k:]) <= ATOL


def test_wrong_cached_kv_fails_the_same_check(tiny: LoadedModel) -> None:
    """Control: the check above must be able to fail. Prefix slots holding another prefix's KV
    (same length, other tokens) give different logits."""
    runner, slots = TorchRunner(tiny, 256), Slots()
    ids, k = prompt(20), 12
    ref = full_prefill(runner, slots, ids)
    other_slots = slots.take(k)
    other = new_req(prompt(k, seed=1))
    runner.forward_logits(Batch([extend(other, 0, other.prompt_ids, EMPTY, other_slots)], []))
    req = new_req(ids)
    batch = Batch([extend(req, k, ids[k:], other_slots, slots.take(20 - k))], [])
    got = runner.forward_logits(batch, all_tokens=True)[req.rid]
    assert max_diff(got, ref[k:]) > 1e-2


def test_chunked_extend_equals_full_prefill(tiny: LoadedModel) -> None:
    runner, slots = TorchRunner(tiny, 256), Slots()
    ids = prompt(23, seed=2)
    ref = full_prefill(runner, slots, ids)
    req = new_req(ids)
    row: np.ndarray = EMPTY
    start = 0
    for size in (5, 1, 9, 8):
        new = slots.take(size)
        last = start + size == len(ids)
        batch = Batch([extend(req, start, ids[start : start + size], row, new, produces=last)], [])
        got = runner.forward_logits(batch, all_tokens=True)[req.rid]
        assert max_diff(got, ref[start : start + size]) <= ATOL
        row = np.concatenate([row, new])
        start += size


def test_decode_logits_equal_full_prefill_of_longer_sequence(tiny: LoadedModel) -> None:
    runner, slots = TorchRunner(tiny, 256), Slots()
    ids = prompt(15, seed=3)
    req = new_req(ids[:10])
    row = slots.take(10)
    runner.forward_logits(Batch([extend(req, 0, ids[:10], EMPTY, row)], []))
    for pos in range(10, 15):
        row = np.concatenate([row, slots.take(1)])
        got = runner.forward_logits(Batch([], [DecodeEntry(req, ids[pos], pos, row)]))[req.rid]
        ref = full_prefill(runner, slots, ids[: pos + 1])[-1:]
        assert max_diff(got, ref) <= ATOL


def test_mixed_batch_equals_separate_runs(tiny: LoadedModel) -> None:
    """Extend with a cached prefix + extend from scratch + decodes of different lengths in one
    forward == each run alone (padding slot 0 and the decode mask are invisible)."""
    ids_a, ids_b, ids_c, ids_d = prompt(18, 4), prompt(9, 5), prompt(6, 6), prompt(13, 7)

    def setup(runner: TorchRunner, slots: Slots) -> dict[str, object]:
        # Shared prefix of A (8 tokens) and the decode requests' contexts.
        pa = slots.take(8)
        runner.forward_logits(Batch([extend(new_req(ids_a[:8]), 0, ids_a[:8], EMPTY, pa)], []))
        rc, rd = slots.take(5), slots.take(12)
        runner.forward_logits(Batch([extend(new_req(ids_c[:5]), 0, ids_c[:5], EMPTY, rc)], []))
        runner.forward_logits(Batch([extend(new_req(ids_d[:12]), 0, ids_d[:12], EMPTY, rd)], []))
        return {
            "pa": pa,
            "rc": np.concatenate([rc, slots.take(1)]),
            "rd": np.concatenate([rd, slots.take(1)]),
        }

    req_a, req_b, req_c, req_d = (new_req(x) for x in (ids_a, ids_b, ids_c[:5], ids_d[:12]))

    def entries(slots: Slots, s: dict[str, object]) -> tuple[list[ExtendEntry], list[DecodeEntry]]:
        pa, rc, rd = s["pa"], s["rc"], s["rd"]
        assert (
            isinstance(pa, np.ndarray) and isinstance(rc, np.ndarray) and isinstance(rd, np.ndarray)
        )
        ext = [
            extend(req_a, 8, ids_a[8:], pa, slots.take(10)),
            extend(req_b, 0, ids_b, EMPTY, slots.take(9)),
        ]
        dec = [DecodeEntry(req_c, ids_c[5], 5, rc), DecodeEntry(req_d, ids_d[12], 12, rd)]
        return ext, dec

    runner, slots = TorchRunner(tiny, 256), Slots()
    ext, dec = entries(slots, setup(runner, slots))
    together = runner.forward_logits(Batch(ext, dec), all_tokens=True)

    runner, slots = TorchRunner(tiny, 256), Slots()
    ext, dec = entries(slots, setup(runner, slots))
    alone: dict[str, torch.Tensor] = {}
    for e in ext:
        alone.update(runner.forward_logits(Batch([e], []), all_tokens=True))
    for d in dec:
        alone.update(runner.forward_logits(Batch([], [d])))
    assert set(together) == set(alone) == {req_a.rid, req_b.rid, req_c.rid, req_d.rid}
    for rid in together:
        assert max_diff(together[rid], alone[rid]) <= ATOL, rid


def test_forward_returns_tokens_of_producing_entries_only(tiny: LoadedModel) -> None:
    runner, slots = TorchRunner(tiny, 256), Slots()
    a, b = new_req(prompt(6)), new_req(prompt(6, 1))
    batch = Batch(
        [
            extend(a, 0, a.prompt_ids, EMPTY, slots.take(6), produces=True),
            extend(b, 0, b.prompt_ids, EMPTY, slots.take(6), produces=False),
        ],
        [],
    )
    res = runner.forward(batch)
    assert set(res.next_tokens) == {a.rid}
    assert 0 <= res.next_tokens[a.rid] < tiny.config.vocab_size
    assert res.duration_s > 0
    assert runner.forward(Batch([], [])).next_tokens == {}


def test_greedy_tokens_match_logits_argmax(tiny: LoadedModel) -> None:
    runner, slots = TorchRunner(tiny, 256), Slots()
    ids = prompt(12, 8)
    ref = full_prefill(runner, slots, ids)
    req = new_req(ids)
    res = runner.forward(Batch([extend(req, 0, ids, EMPTY, slots.take(12))], []))
    assert res.next_tokens[req.rid] == int(ref[-1].argmax())


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda e: dataclasses.replace(e, new_slots=e.new_slots[:-1]), "new slots"),
        (lambda e: dataclasses.replace(e, new_slots=np.zeros_like(e.new_slots)), r"\[1, "),
        (lambda e: dataclasses.replace(e, new_slots=e.new_slots + 10_000), r"\[1, "),
        (lambda e: dataclasses.replace(e, prefix_len=1), "prefix"),
    ],
)
def test_bad_extend_entries_raise(tiny: LoadedModel, mutate: object, match: str) -> None:
    runner, slots = TorchRunner(tiny, 64), Slots()
    req = new_req(prompt(4))
    entry = extend(req, 0, req.prompt_ids, EMPTY, slots.take(4))
    assert callable(mutate)
    with pytest.raises(ValueError, match=match):
        runner.forward(Batch([mutate(entry)], []))


def test_double_write_and_context_limit_raise(tiny: LoadedModel) -> None:
    runner, slots = TorchRunner(tiny, 64, max_context_len=8), Slots()
    a, b = new_req(prompt(4)), new_req(prompt(4, 1))
    s = slots.take(4)
    with pytest.raises(ValueError, match="twice"):
        runner.forward(
            Batch([extend(a, 0, a.prompt_ids, EMPTY, s), extend(b, 0, b.prompt_ids, EMPTY, s)], [])
        )
    long = new_req(prompt(9))
    with pytest.raises(ValueError, match="max_context_len"):
        runner.forward(Batch([extend(long, 0, long.prompt_ids, EMPTY, slots.take(9))], []))
    with pytest.raises(ValueError, match="position"):
        runner.forward(Batch([], [DecodeEntry(a, 1, 3, slots.take(3))]))


def test_pool_geometry_and_eos(tiny: LoadedModel) -> None:
    runner = TorchRunner(tiny, 100)
    c = tiny.config
    assert runner.kv_pool_size == 101
    assert runner.kv_pool.shape == (c.num_layers, 2, 101, c.num_kv_heads, c.head_dim)
    assert runner.max_context_len == c.max_position_embeddings
    assert runner.eos_token_ids() == (BYTE_EOS_ID,)
    per_token = c.kv_bytes_per_token(4)
    assert TorchRunner.kv_slots_for_bytes(tiny, 11 * per_token) == 10
    with pytest.raises(ValueError):
        TorchRunner(tiny, 0)


def test_sliding_window_prefix_reuse_is_exact() -> None:
    """Mistral-style window: a prefix from the pool still equals full prefill, and the window
    really limits attention (tokens beyond it do not change the logits)."""
    cfg = dataclasses.replace(
        random_preset_config("tiny-random") or SHAPE_PRESETS["tiny"],
        architecture=Architecture.MISTRAL,
        sliding_window=4,
        num_layers=1,
    )
    model = build_empty_model(cfg, torch.device("cpu"), torch.float32)
    init_random_(model, 3)
    loaded = LoadedModel(model, ByteTokenizer(), cfg, ChatTemplate(None), "window")
    runner, slots = TorchRunner(loaded, 128), Slots()
    ids = prompt(12, 9)
    ref = full_prefill(runner, slots, ids)
    prefix = slots.take(7)
    runner.forward_logits(Batch([extend(new_req(ids[:7]), 0, ids[:7], EMPTY, prefix)], []))
    req = new_req(ids)
    got = runner.forward_logits(
        Batch([extend(req, 7, ids[7:], prefix, slots.take(5))], []), all_tokens=True
    )[req.rid]
    assert max_diff(got, ref[7:]) <= ATOL
    # One layer, window 4: the last token sees positions 8..11 only, so changing token 0 is invisible.
    changed = full_prefill(runner, slots, [(ids[0] + 1) % 256, *ids[1:]])
    assert max_diff(changed[-1], ref[-1]) <= ATOL
    assert max_diff(changed[0], ref[0]) > 1e-3
    # Decode rows of different lengths with the window (mask built per row).
    row = np.concatenate([prefix, slots.take(1)])
    dec = runner.forward_logits(Batch([], [DecodeEntry(new_req(ids[:7]), ids[7], 7, row)]))
    assert max_diff(next(iter(dec.values())), ref[7:8]) <= ATOL


# ---- sampling ------------------------------------------------------------------------------------


def test_sampling_is_deterministic_per_seed_and_position(tiny: LoadedModel) -> None:
    logits = torch.randn(1, 512, generator=torch.Generator().manual_seed(0)) * 0.5
    p = SamplingParams(temperature=1.0, seed=42)
    draws = [sample_tokens(logits, [p], [42], [pos])[0] for pos in range(40)]
    again = [sample_tokens(logits, [p], [42], [pos])[0] for pos in range(40)]
    other = [sample_tokens(logits, [p], [43], [pos])[0] for pos in range(40)]
    assert draws == again
    assert draws != other
    assert len(set(draws)) > 5  # really sampling


def test_runner_sampling_is_seeded_per_request(tiny: LoadedModel) -> None:
    def run(seed: int | None, batch_with_other: bool) -> int:
        runner, slots = TorchRunner(tiny, 128), Slots()
        req = Req("fixed-rid", np.asarray(prompt(8)), SamplingParams(temperature=1.5, seed=seed))
        entries = [extend(req, 0, req.prompt_ids, EMPTY, slots.take(8))]
        if batch_with_other:
            o = new_req(prompt(5, 1), SamplingParams(temperature=1.0))
            entries.append(extend(o, 0, o.prompt_ids, EMPTY, slots.take(5)))
        return runner.forward(Batch(entries, [])).next_tokens["fixed-rid"]

    assert run(7, False) == run(7, True)
    assert run(None, False) == run(None, True)  # derived from the runner seed and rid
    assert len({run(s, False) for s in range(12)}) > 1


def test_top_k_one_is_greedy() -> None:
    logits = torch.randn(6, 512, generator=torch.Generator().manual_seed(1))
    greedy = sample_tokens(logits, [SamplingParams()] * 6, [0] * 6, list(range(6)))
    topk1 = sample_tokens(
        logits, [SamplingParams(temperature=2.0, top_k=1)] * 6, list(range(6)), [9] * 6
    )
    assert greedy == topk1 == logits.argmax(-1).tolist()


def test_top_k_and_top_p_supports() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filter_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs.nonzero().flatten().tolist() == [0, 1]
    probs = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert probs.nonzero().flatten().tolist() == [0, 1]  # 0.5 + 0.3 reaches 0.8
    probs = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert probs.nonzero().flatten().tolist() == [0, 1, 2]
    probs = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.1))
    assert probs.nonzero().flatten().tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-5, 5), min_size=2, max_size=40),
    top_k=st.integers(0, 50),
    top_p=st.floats(0.01, 1.0),
    temperature=st.floats(0.1, 3.0),
)
def test_filter_logits_properties(
    values: list[float], top_k: int, top_p: float, temperature: float
) -> None:
    logits = torch.tensor(values)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = filter_logits(logits, params)
    support = probs > 0
    assert abs(float(probs.sum()) - 1.0) < 1e-5
    assert bool(support[int(logits.argmax())])  # the most likely token always survives
    if 0 < top_k < len(values):
        # At most k tokens, plus those tied with the k-th largest (temperature-scaled) logit.
        scaled = logits.float() / temperature
        kth = torch.topk(scaled, top_k).values[-1]
        assert int(support.sum()) <= int((scaled >= kth).sum())
    # Every kept token is at least as likely as every dropped one.
    if bool((~support).any()):
        assert float(logits[support].min()) >= float(logits[~support].max())


def test_mix_seed_spreads() -> None:
    seeds = {mix_seed(s, p) for s in range(20) for p in range(20)}
    assert len(seeds) == 400
    assert all(0 <= s < 2**63 for s in seeds)


# ---- configs, RoPE ---------------------------------------------------------------------------------


def test_random_presets_are_untied_with_byte_specials() -> None:
    for name in model_names():
        cfg = random_preset_config(name)
        if cfg is None:
            continue
        assert not cfg.tie_word_embeddings
        assert cfg.vocab_size >= 259
        assert cfg.eos_token_ids == (BYTE_EOS_ID,) and cfg.bos_token_id == BYTE_BOS_ID
    assert random_preset_config("smollm2-135m") is None
    assert random_preset_config("nope-random") is None
    tiny = random_preset_config("tiny-random")
    assert tiny is not None and tiny.num_layers == 2 and tiny.vocab_size == 512


def test_loaded_random_model_has_its_own_head(tiny: LoadedModel) -> None:
    head = tiny.model.lm_head
    assert head is not None
    assert not torch.equal(head.weight, tiny.model.model.embed_tokens.weight)


@pytest.mark.parametrize("name", sorted(SHAPE_PRESETS))
def test_hf_config_round_trip(name: str) -> None:
    cfg = SHAPE_PRESETS[name]
    assert ModelConfig.from_hf(json.loads(json.dumps(cfg.to_hf()))) == cfg


def test_hf_config_variants() -> None:
    base = {
        "model_type": "llama",
        "vocab_size": 100,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
    }
    cfg = ModelConfig.from_hf(base)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_scaling, cfg.eos_token_ids) == (4, 8, None, ())
    cfg = ModelConfig.from_hf(
        {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    )
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling is None
    cfg = ModelConfig.from_hf(
        {**base, "rope_scaling": {"type": "linear", "factor": 2.0}, "eos_token_id": [3, 4]}
    )
    assert cfg.rope_scaling == RopeScaling(RopeScalingKind.LINEAR, 2.0)
    assert cfg.eos_token_ids == (3, 4)
    cfg = ModelConfig.from_hf({**base, "model_type": "qwen2"})
    assert cfg.qkv_bias and not cfg.o_bias
    cfg = ModelConfig.from_hf({**base, "attention_bias": True})
    assert cfg.qkv_bias and cfg.o_bias
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="gpt2"):
        ModelConfig.from_hf({**base, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.from_hf({**base, "num_key_value_heads": 3})


def test_llama3_rope_scaling_bands() -> None:
    scaling = RopeScaling(RopeScalingKind.LLAMA3, 8.0, 1.0, 4.0, 8192)
    plain = rope_inv_freq(128, 500000.0, None)
    scaled = rope_inv_freq(128, 500000.0, scaling)
    wavelen = 2 * torch.pi / plain
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    assert torch.equal(scaled[high], plain[high])
    assert torch.allclose(scaled[low], plain[low] / 8.0)
    mid = ~high & ~low
    assert bool(mid.any())
    assert bool(((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8.0)).all())
    linear = rope_inv_freq(64, 10000.0, RopeScaling(RopeScalingKind.LINEAR, 4.0))
    assert torch.allclose(linear, rope_inv_freq(64, 10000.0, None) / 4.0)


# ---- tokenizers, chat templates ----------------------------------------------------------------------


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids == list("héllo".encode())
    assert tok.decode([*ids, BYTE_EOS_ID, 400]) == "héllo"
    assert ByteTokenizer(add_bos=True).encode("a") == [BYTE_BOS_ID, 97]
    assert ByteTokenizer(add_bos=True).encode("a", add_special_tokens=False) == [97]
    assert tok.token_text(BYTE_EOS_ID) == "<eos>" and tok.token_text(1000) is None


def test_chat_template_chatml_fallback_matches_jinja() -> None:
    source = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are terse.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    t = ChatTemplate(source)
    user = [{"role": "user", "content": "Hi"}]
    system = [{"role": "system", "content": "Be kind."}, *user]
    for msgs in (user, system):
        for gen in (True, False):
            assert t.render_jinja(msgs, add_generation_prompt=gen) == t.render_chatml(
                msgs, add_generation_prompt=gen
            )
    assert t.render(user).startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert (
        ChatTemplate(None).render(user) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError):
        ChatTemplate("{{ messages }}").render_chatml(user)


# ---- weight sources: GGUF and model directories ----------------------------------------------------


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _toy_vocab(size: int) -> tuple[list[str], list[str], list[int]]:
    """Byte-level BPE vocab whose ids 0..255 are the bytes (like ByteTokenizer)."""
    tokens = [*_bytes_to_unicode(), "<|bos|>", "<|eos|>", "<|pad|>", "Ġt", "he", "Ġthe"]
    types = [1] * 256 + [3, 3, 3, 1, 1, 1]
    tokens += [f"<unused{i}>" for i in range(size - len(tokens))]
    types += [5] * (size - len(types))
    return tokens, ["Ġ t", "h e", "Ġt he"], types


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_toy_gguf(path: Path, loaded: LoadedModel) -> None:
    """The tiny model as llama.cpp would write it (Q/K rows permuted, GGUF tensor names)."""
    import gguf

    c = loaded.config
    tokens, merges, types = _toy_vocab(c.vocab_size)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_heads)
    w.add_head_count_kv(c.num_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(BYTE_BOS_ID)
    w.add_eos_token_id(BYTE_EOS_ID)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, p in loaded.model.state_dict().items():
        arr = p.detach().float().numpy().copy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            part, suffix = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{names[part]}.{suffix}"
            if part == "self_attn.q_proj":
                arr = _llama_cpp_permute(arr, c.num_heads)
            elif part == "self_attn.k_proj":
                arr = _llama_cpp_permute(arr, c.num_kv_heads)
        w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    back = unpermute_rope_rows(torch.from_numpy(_llama_cpp_permute(w, 6)), 6)
    assert torch.equal(back, torch.from_numpy(w))
    assert not np.array_equal(_llama_cpp_permute(w, 6), w)


def test_gguf_and_directory_loads_reproduce_the_model(tiny: LoadedModel, tmp_path: Path) -> None:
    gguf_path = tmp_path / "toy.gguf"
    write_toy_gguf(gguf_path, tiny)
    ids = prompt(14, 11)
    ref = full_prefill(TorchRunner(tiny, 64), Slots(), ids)

    from_gguf = load_model(str(gguf_path))
    assert from_gguf.config == tiny.config
    assert max_diff(full_prefill(TorchRunner(from_gguf, 64), Slots(), ids), ref) <= ATOL

    out = tmp_path / "converted"
    convert_gguf_to_dir(gguf_path, out)
    from_dir = load_model(str(out))
    assert from_dir.config == tiny.config
    assert max_diff(full_prefill(TorchRunner(from_dir, 64), Slots(), ids), ref) <= ATOL

    for loaded in (from_gguf, from_dir):
        tok = loaded.tokenizer
        assert isinstance(tok, HFTokenizer)
        assert tok.encode("the the") == [ord("t"), 260, 261]
        assert tok.encode("x<|eos|>") == [ord("x"), BYTE_EOS_ID]
        assert tok.decode(tok.encode("the the")) == "the the"
        assert tok.eos_token_ids == (BYTE_EOS_ID,) and tok.bos_token_id == BYTE_BOS_ID
        rendered = loaded.chat_template.render([{"role": "user", "content": "hi"}])
        assert rendered == "<|im_start|>user\nhi<|im_end|>\n"


def test_directory_with_tied_head_and_bad_checkpoint(tiny: LoadedModel, tmp_path: Path) -> None:
    cfg = dataclasses.replace(tiny.config, tie_word_embeddings=True)
    model = build_empty_model(cfg, torch.device("cpu"), torch.float32)
    init_random_(model, 5)
    tokens, merges, types = _toy_vocab(cfg.vocab_size)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": BYTE_BOS_ID,
        "tokenizer.ggml.eos_token_id": BYTE_EOS_ID,
        "tokenizer.ggml.add_bos_token": True,
    }
    tok = HFTokenizer.from_gguf_metadata(meta)
    tensors = dict(model.state_dict())
    write_model_dir(
        tmp_path / "tied",
        cfg,
        tensors,
        tok,
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": True},
    )
    loaded = load_model(str(tmp_path / "tied"))
    assert loaded.model.lm_head is None
    assert loaded.tokenizer.encode("a") == [BYTE_BOS_ID, 97]
    assert loaded.tokenizer.encode("a", add_special_tokens=False) == [97]
    x = torch.tensor([[0.5] * cfg.hidden_size])
    with torch.no_grad():
        assert max_diff(loaded.model.logits(x), model.logits(x)) <= ATOL

    tensors.pop("model.norm.weight")
    write_model_dir(tmp_path / "bad", cfg, tensors, tok, {})
    with pytest.raises(ValueError, match="missing"):
        load_model(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "nothing-here"))


# ---- parity with transformers for every architecture variant (slow: imports transformers) -------


def _variants() -> dict[str, ModelConfig]:
    base = dataclasses.replace(SHAPE_PRESETS["tiny"], num_layers=2, max_position_embeddings=256)
    return {
        "llama": base,
        "llama3-scaling": dataclasses.replace(
            base,
            rope_theta=500000.0,
            rope_scaling=RopeScaling(RopeScalingKind.LLAMA3, 8.0, 1.0, 4.0, 8),
        ),
        "linear-scaling": dataclasses.replace(
            base, rope_scaling=RopeScaling(RopeScalingKind.LINEAR, 2.0)
        ),
        "llama-bias-tied": dataclasses.replace(
            base, qkv_bias=True, o_bias=True, tie_word_embeddings=True
        ),
        "qwen2": dataclasses.replace(
            base, architecture=Architecture.QWEN2, qkv_bias=True, rms_norm_eps=1e-6
        ),
        "mistral-window": dataclasses.replace(
            base, architecture=Architecture.MISTRAL, sliding_window=5
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(_variants()))
def test_logits_match_transformers(variant: str) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = _variants()[variant]
    model = build_empty_model(cfg, torch.device("cpu"), torch.float32)
    init_random_(model, 1)
    hf_config = transformers.AutoConfig.for_model(**cfg.to_hf())
    hf_config._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    hf.load_state_dict(model.state_dict(), strict=not cfg.tie_word_embeddings)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    ids = prompt(24, 12)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    loaded = LoadedModel(model, ByteTokenizer(), cfg, ChatTemplate(None), variant)
    runner, slots = TorchRunner(loaded, 128), Slots()
    # Through the pool: a 10-token prefix in one step, the rest in another.
    first = slots.take(10)
    req = new_req(ids)
    head = runner.forward_logits(
        Batch([extend(req, 0, ids[:10], EMPTY, first)], []), all_tokens=True
    )
    tail = runner.forward_logits(
        Batch([extend(req, 10, ids[10:], first, slots.take(14))], []), all_tokens=True
    )
    got = torch.cat([head[req.rid], tail[req.rid]])
    assert max_diff(got, ref) <= 1e-4


def _toy_hf_tokenizer(add_bos: bool) -> HFTokenizer:
    tokens, merges, types = _toy_vocab(512)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": BYTE_BOS_ID,
        "tokenizer.ggml.eos_token_id": BYTE_EOS_ID,
        "tokenizer.ggml.add_bos_token": add_bos,
    }
    return HFTokenizer.from_gguf_metadata(meta)


@pytest.mark.parametrize("post_adds_bos", [True, False])
def test_tokenizer_dir_detects_a_bos_post_processor(tmp_path: Path, post_adds_bos: bool) -> None:
    """Llama 3 / Mistral tokenizer.json prepend BOS in a post-processor, Qwen2's does not; with
    no add_bos_token in tokenizer_config.json the loader follows the post-processor, and BOS is
    never doubled."""
    from tokenizers import processors

    raw = _toy_hf_tokenizer(False).backend
    if post_adds_bos:
        raw.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", special_tokens=[("<|bos|>", BYTE_BOS_ID)]
        )
    raw.save(str(tmp_path / "tokenizer.json"))
    tok = HFTokenizer.from_dir(tmp_path, eos_token_ids=(7,))
    assert tok.add_bos is post_adds_bos
    assert tok.encode("a") == ([BYTE_BOS_ID, 97] if post_adds_bos else [97])
    assert tok.encode("a", add_special_tokens=False) == [97]
    assert tok.eos_token_ids == (7,)
    with pytest.raises(ValueError, match="not supported"):
        HFTokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})


def test_bfloat16_runs_and_tracks_float32(tiny: LoadedModel) -> None:
    """The accelerator dtype path (bf16 pool and weights) on CPU: same seed, logits close to
    fp32, and prefix reuse still consistent."""
    bf16 = load_model("tiny-random", dtype="bf16", seed=0)
    assert bf16.model.dtype == torch.bfloat16 and bf16.model.inv_freq.dtype == torch.float32
    ids = prompt(16, 13)
    ref = full_prefill(TorchRunner(tiny, 64), Slots(), ids)
    runner, slots = TorchRunner(bf16, 64), Slots()
    assert runner.kv_pool.dtype == torch.bfloat16
    got = full_prefill(runner, slots, ids)
    assert max_diff(got, ref) < 0.05 * float(ref.abs().max())
    prefix = slots.take(9)
    runner.forward_logits(Batch([extend(new_req(ids[:9]), 0, ids[:9], EMPTY, prefix)], []))
    req = new_req(ids)
    tail = runner.forward_logits(
        Batch([extend(req, 9, ids[9:], prefix, slots.take(7))], []), all_tokens=True
    )[req.rid]
    assert max_diff(tail, got[9:]) < 0.05 * float(ref.abs().max())
