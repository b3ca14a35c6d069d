"""Model shapes from a Hugging Face ``config.json`` (read offline), for ``--model PATH``.

``resolve_model(name)`` takes a preset name (``sim.cost.hardware``), a ``config.json`` file, or a
model directory holding one. Fields read (missing ones take the Llama defaults in brackets):

- ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``
  [= heads], ``head_dim`` [hidden / heads], ``intermediate_size``, ``vocab_size``,
  ``tie_word_embeddings`` [false], ``max_position_embeddings`` [4096];
- MoE: ``num_local_experts`` (Mixtral) or ``num_experts`` (Qwen-MoE) or ``n_routed_experts``
  (DeepSeek), ``num_experts_per_tok``, ``moe_intermediate_size`` [intermediate_size],
  shared experts (``n_shared_experts`` x ``moe_intermediate_size``, or
  ``shared_expert_intermediate_size``), ``first_k_dense_replace`` dense leading layers;
- multi-head latent attention (DeepSeek): ``kv_lora_rank``, ``q_lora_rank``,
  ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``;
- dtype: ``torch_dtype`` (or ``dtype``) [bfloat16]; ``quantization_config`` with an FP8
  method makes weights 1 byte, with ``bits`` 4 half a byte (the KV cache stays 2 bytes);
- a multimodal config's ``text_config`` is read in place of the top level.

Parameter counts are computed from the shapes (biases and vision towers not counted), active
parameters as shared weights plus ``num_experts_per_tok`` experts per MoE layer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixsched.sim.cost.hardware import ModelSpec, PresetError

if TYPE_CHECKING:
    from radixsched.engine.config import ModelConfig

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8": 1,
    "fp8": 1,
}


class ModelConfigError(PresetError):
    """A config.json that cannot be read as a model shape; the message names the file."""


def _int(
    d: Mapping[str, Any], where: str, *names: str, default: int | None = None, minimum: int = 0
) -> int:
    """The first of ``names`` that ``d`` gives, a whole number >= ``minimum`` (JSON's ``4.0``
    too, never ``4.5``, NaN or a boolean); ``default`` when none is given."""
    for n in names:
        v = d.get(n)
        if v is not None:
            whole = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
            if isinstance(v, bool) or not whole:
                raise ModelConfigError(f"{where}: field {n!r}: expected a count, got {v!r}")
            if v < minimum:
                raise ModelConfigError(f"{where}: field {n!r}: must be >= {minimum}, got {v!r}")
            return int(v)
    if default is None:
        raise ModelConfigError(f"{where}: missing field {names[0]!r}")
    return default


def _weight_bytes(d: Mapping[str, Any], where: str) -> tuple[float, int]:
    """(bytes per weight, bytes per KV value)."""
    key = "torch_dtype" if d.get("torch_dtype") is not None else "dtype"
    value = d.get(key) or "bfloat16"
    name = str(value).lower().removeprefix("torch.")
    if not isinstance(value, str) or name not in _DTYPE_BYTES:
        raise ModelConfigError(
            f"{where}: field {key!r}: unknown dtype {value!r}; known: {', '.join(_DTYPE_BYTES)}"
        )
    dense = _DTYPE_BYTES[name]
    kv = dense if dense >= 2 else 2
    quant = d.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits") or quant.get("w_bit")
        if "fp8" in method or quant.get("fmt") in ("e4m3", "e5m2"):
            return 1.0, kv
        if isinstance(bits, int | float) and not isinstance(bits, bool) and 0 < bits < 16:
            return float(bits) / 8.0, kv
    return float(dense), kv


def spec_from_hf(d: Mapping[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """The ``ModelSpec`` of a parsed ``config.json``."""
    text = d.get("text_config")
    if isinstance(text, Mapping):
        d = {**{k: v for k, v in d.items() if k != "text_config"}, **text}
    layers = _int(d, where, "num_hidden_layers", "n_layer", "num_layers", minimum=1)
    h = _int(d, where, "hidden_size", "n_embd", "d_model", minimum=1)
    heads = _int(d, where, "num_attention_heads", "n_head", minimum=1)
    kv_heads = _int(d, where, "num_key_value_heads", default=heads, minimum=1)
    inter = _int(d, where, "intermediate_size", "n_inner", "ffn_dim", minimum=1)
    vocab = _int(d, where, "vocab_size", minimum=2)
    ctx = _int(
        d, where, "max_position_embeddings", "n_positions", "seq_length", default=4096, minimum=2
    )
    tied = d.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelConfigError(
            f"{where}: field 'tie_word_embeddings': expected true or false, got {tied!r}"
        )
    wbytes, kv_bytes = _weight_bytes(d, where)

    kv_lora = _int(d, where, "kv_lora_rank", default=0)
    if kv_lora:
        rope = _int(d, where, "qk_rope_head_dim", default=64)
        nope = _int(d, where, "qk_nope_head_dim", default=128)
        v_dim = _int(d, where, "v_head_dim", default=nope)
        q_lora = _int(d, where, "q_lora_rank", default=0)
        qk = nope + rope
        q = h * q_lora + q_lora * heads * qk if q_lora else h * heads * qk
        attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * h
        head_dim, mla_dim, kv_heads = qk, kv_lora + rope, heads
    else:
        if d.get("head_dim") is None and h % heads:
            raise ModelConfigError(
                f"{where}: hidden_size {h} is not divisible by num_attention_heads {heads} "
                "(give head_dim)"
            )
        head_dim = _int(d, where, "head_dim", default=h // heads, minimum=1)
        if heads % kv_heads:
            raise ModelConfigError(
                f"{where}: num_key_value_heads {kv_heads} must divide num_attention_heads {heads}"
            )
        attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
        mla_dim = 0
    if head_dim < 1:
        raise ModelConfigError(f"{where}: qk_nope_head_dim + qk_rope_head_dim must be >= 1")

    experts = _int(d, where, "num_local_experts", "num_experts", "n_routed_experts", default=1)
    experts = max(experts, 1)  # 0 experts: a dense model
    top_k = _int(d, where, "num_experts_per_tok", default=1) if experts > 1 else 1
    if experts > 1 and not 1 <= top_k <= experts:
        raise ModelConfigError(f"{where}: num_experts_per_tok must be in [1, {experts}]")
    expert_inter = (
        _int(d, where, "moe_intermediate_size", default=inter, minimum=1) if experts > 1 else inter
    )
    shared_inter = _int(d, where, "shared_expert_intermediate_size", default=0)
    shared_inter += _int(d, where, "n_shared_experts", default=0) * expert_inter
    dense_layers = _int(d, where, "first_k_dense_replace", default=0) if experts > 1 else layers
    if dense_layers > layers:
        raise ModelConfigError(
            f"{where}: first_k_dense_replace {dense_layers} exceeds num_hidden_layers {layers}"
        )
    moe_layers = layers - dense_layers

    norms = 2 * h
    dense_layer = attn + 3 * h * inter + norms
    expert = 3 * h * expert_inter
    moe_shared = attn + 3 * h * shared_inter + h * experts + norms
    embeddings = (1 if tied else 2) * vocab * h + h
    total = dense_layers * dense_layer + moe_layers * (moe_shared + experts * expert) + embeddings
    active = dense_layers * dense_layer + moe_layers * (moe_shared + top_k * expert) + embeddings
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=expert_inter,
        vocab_size=vocab,
        dtype_bytes=wbytes,  # type: ignore[arg-type]
        total_params=float(total),
        active_params=float(active),
        max_context_len=ctx,
        num_experts=experts,
        experts_per_token=top_k,
        tied_embeddings=tied,
        mla_kv_dim=mla_dim,
        kv_dtype_bytes=kv_bytes if kv_bytes != wbytes else None,
    )


def spec_from_engine_config(name: str, cfg: ModelConfig, *, dtype_bytes: int) -> ModelSpec:
    """The ``ModelSpec`` of one of the local engine's model configs at ``dtype_bytes``."""
    return ModelSpec(
        name=name,
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        dtype_bytes=dtype_bytes,
        total_params=float(cfg.num_params),
        active_params=float(cfg.num_params),
        max_context_len=cfg.max_position_embeddings,
        tied_embeddings=cfg.tie_word_embeddings,
    )


def config_path(name: str) -> Path | None:
    """The ``config.json`` that ``name`` points at (a file, or a directory holding one)."""
    p = Path(name).expanduser()
    if p.is_dir():
        p = p / "config.json"
        return p if p.is_file() else None
    if p.is_file():
        return p
    return None


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read ``path`` (a config.json or a directory with one) as a ``ModelSpec``."""
    given = Path(path).expanduser()
    p = config_path(str(given))
    if p is None:
        raise ModelConfigError(f"{given}: no config.json there")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelConfigError(f"{p}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{p}: not UTF-8 text (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(f"{p}: expected a JSON object")
    name = str(doc.get("_name_or_path") or "").rsplit("/", 1)[-1]
    if not name:
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return spec_from_hf(doc, name, str(p))
