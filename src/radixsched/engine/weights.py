"""Weight sources: a Hugging Face directory (config.json + *.safetensors), a GGUF file, or seeded
random values; plus writing a model directory (how a GGUF is converted once and cached).

Tensors are keyed by our (= Hugging Face's) parameter names. One extra, optional key,
``ROPE_FACTORS_KEY``, carries llama.cpp's per-pair RoPE frequency divisors (``rope_freqs``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixsched.engine.config import Architecture, ModelConfig, RopeScaling, RopeScalingKind
from radixsched.engine.model import CausalLM, rope_inv_freq
from radixsched.engine.tokenizer import HFTokenizer, read_json

ROPE_FACTORS_KEY = "rope_freq_factors"


def build_empty_model(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Model with uninitialised parameters on ``device`` (no wasted default init)."""
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    _set_inv_freq(model, None)
    return model.eval()


def _set_inv_freq(model: CausalLM, factors: torch.Tensor | None) -> None:
    c = model.config
    inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
    if factors is not None:
        if factors.shape != inv_freq.shape:
            raise ValueError(
                f"rope factors shape {tuple(factors.shape)} != {tuple(inv_freq.shape)}"
            )
        inv_freq = inv_freq / factors.float().cpu()
    # Kept float32 whatever the model dtype: positions up to 1e5+ need the precision.
    model.inv_freq = inv_freq.to(model.device)


# ---- random ----------------------------------------------------------------------------------


@torch.no_grad()
def init_random_(model: CausalLM, seed: int) -> None:
    """Seeded values with O(1) activations and logits: embeddings ~ N(0, 1), linear weights
    ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2). Deterministic for a given
    seed and device (the generator lives on the model's device)."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * noise)
        elif name.endswith(".bias"):
            p.copy_(0.1 * noise)
        elif "embed_tokens" in name:
            p.copy_(noise)
        else:
            p.copy_(noise / math.sqrt(p.shape[1]))


# ---- loading named tensors -------------------------------------------------------------------


@torch.no_grad()
def load_weights_(model: CausalLM, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy ``tensors`` into ``model`` (dtype/device converted). Every parameter must be
    provided; unknown names raise (a silently ignored tensor is a wrong model)."""
    params = dict(model.named_parameters())
    factors = tensors.get(ROPE_FACTORS_KEY)
    ignored = {ROPE_FACTORS_KEY}
    if model.config.tie_word_embeddings:
        ignored.add("lm_head.weight")  # some tied checkpoints store the shared matrix twice
    unknown = sorted(k for k in tensors if k not in params and k not in ignored)
    unknown = [k for k in unknown if not k.endswith("rotary_emb.inv_freq")]
    missing = sorted(k for k in params if k not in tensors)
    if unknown or missing:
        raise ValueError(f"checkpoint mismatch: missing {missing[:8]}, unexpected {unknown[:8]}")
    for name, p in params.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(t.shape)} != model {tuple(p.shape)}")
        p.copy_(t.to(device=p.device, dtype=p.dtype))
    _set_inv_freq(model, factors)


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def read_hf_config(path: Path) -> ModelConfig:
    """``config.json``, with EOS ids from ``generation_config.json`` merged in."""
    cfg = read_json(path / "config.json")
    if not cfg:
        raise FileNotFoundError(f"no config.json in {path}")
    config = ModelConfig.from_hf(cfg)
    gen_eos = read_json(path / "generation_config.json").get("eos_token_id")
    extra = gen_eos if isinstance(gen_eos, list) else ([] if gen_eos is None else [gen_eos])
    eos = tuple(dict.fromkeys([*config.eos_token_ids, *(int(e) for e in extra)]))
    if eos == config.eos_token_ids:
        return config
    import dataclasses

    return dataclasses.replace(config, eos_token_ids=eos)


# ---- GGUF ------------------------------------------------------------------------------------


@dataclass
class GGUFModel:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # our names; includes ROPE_FACTORS_KEY when the file has it
    metadata: dict[str, Any]  # every scalar/array field, decoded (tokenizer.ggml.* among them)
    chat_template: str | None


_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def gguf_tensor_name(name: str) -> str | None:
    """Our name for a GGUF tensor name (None for ``rope_freqs`` and unknown tensors)."""
    stem, _, suffix = name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        mapped = _GGUF_LAYER_NAMES.get(part)
        return None if mapped is None else f"model.layers.{layer}.{mapped}.{suffix}"
    mapped = _GGUF_TOP_NAMES.get(stem)
    return None if mapped is None else f"{mapped}.{suffix}"


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: per head it stores the rotary pairs interleaved
    (row 2j, 2j+1 = pair j), while HF checkpoints store all first halves, then all second halves."""
    rows = w.shape[0]
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def _gguf_metadata(reader: Any) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _f32(value: Any) -> float:
    """A GGUF float32 as the shortest decimal that rounds to it (1e-05, not 9.9999997e-06)."""
    import numpy as np

    return float(str(np.float32(value)))


def gguf_config(meta: Mapping[str, Any], tensor_names: set[str]) -> ModelConfig:
    arch_name = str(meta["general.architecture"])
    if arch_name not in ("llama", "qwen2"):
        raise ValueError(f"GGUF architecture {arch_name!r} is not supported (llama, qwen2)")
    arch = Architecture(arch_name)

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch_name}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    vocab = get("vocab_size")
    if vocab is None:
        vocab = len(meta["tokenizer.ggml.tokens"])
    scaling: RopeScaling | None = None
    scaling_type = get("rope.scaling.type")
    if scaling_type == "linear":
        scaling = RopeScaling(RopeScalingKind.LINEAR, _f32(get("rope.scaling.factor")))
    elif scaling_type not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling_type!r} is not supported")
    qkv_bias = "blk.0.attn_q.bias" in tensor_names
    o_bias = "blk.0.attn_output.bias" in tensor_names
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_f32(get("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in (eos, eot) if e is not None)),
    )


def read_gguf_header(path: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """A GGUF file's config and metadata, without reading its tensors' data."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = _gguf_metadata(reader)
    return gguf_config(meta, {t.name for t in reader.tensors}), meta


def read_gguf(path: Path, *, dtype: torch.dtype = torch.float32) -> GGUFModel:
    """Dequantize every tensor of a GGUF file (converted to ``dtype`` one at a time)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    meta = _gguf_metadata(reader)
    config = gguf_config(meta, {t.name for t in reader.tensors})
    unpermute = config.architecture is Architecture.LLAMA
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        values = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        if t.name == "rope_freqs.weight":
            tensors[ROPE_FACTORS_KEY] = values.float()
            continue
        name = gguf_tensor_name(t.name)
        if name is None:
            raise ValueError(f"{path}: unknown GGUF tensor {t.name!r}")
        if unpermute and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = unpermute_rope_rows(values, config.num_heads)
        elif unpermute and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = unpermute_rope_rows(values, config.num_kv_heads)
        tensors[name] = values.to(dtype)
    template = meta.get("tokenizer.chat_template")
    return GGUFModel(
        config=config,
        tensors=tensors,
        metadata=meta,
        chat_template=None if template is None else str(template),
    )


# ---- writing a model directory -----------------------------------------------------------------


def write_model_dir(
    out_dir: Path,
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    tokenizer: HFTokenizer | None,
    tokenizer_config: Mapping[str, Any],
) -> None:
    """An ordinary HF-style model directory that ``loader.load_model`` reads back."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_hf(), indent=2), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(dict(tokenizer_config), indent=2), encoding="utf-8"
    )
    if tokenizer is not None:
        tokenizer.save(out_dir / "tokenizer.json")
    # A contiguous copy of each: safetensors refuses tensors that share storage.
    own = {name: t.detach().contiguous().clone() for name, t in tensors.items()}
    save_file(own, str(out_dir / "model.safetensors"))


def convert_gguf_to_dir(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF (float32) into ``out_dir`` as config.json + model.safetensors +
    tokenizer.json + tokenizer_config.json (with the chat template)."""
    g = read_gguf(gguf_path)
    tokenizer = HFTokenizer.from_gguf_metadata(g.metadata)
    tok_config = tokenizer.config_json(chat_template=g.chat_template)
    write_model_dir(out_dir, g.config, g.tensors, tokenizer, tok_config)
