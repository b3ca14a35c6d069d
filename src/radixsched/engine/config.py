"""Model configurations for the Llama family (Llama 2/3, Qwen2, Mistral) and named shape presets.

Torch-free on purpose: the CLI lists preset names from here without importing torch.

``ModelConfig.from_hf`` reads a Hugging Face ``config.json`` (both the classic
``rope_theta``/``rope_scaling`` fields and the newer ``rope_parameters`` block);
``ModelConfig.to_hf`` writes one back, so a converted GGUF becomes an ordinary model directory.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Architecture(enum.Enum):
    LLAMA = "llama"
    QWEN2 = "qwen2"
    MISTRAL = "mistral"

    @property
    def hf_class(self) -> str:
        return {
            Architecture.LLAMA: "LlamaForCausalLM",
            Architecture.QWEN2: "Qwen2ForCausalLM",
            Architecture.MISTRAL: "MistralForCausalLM",
        }[self]


class RopeScalingKind(enum.Enum):
    LINEAR = "linear"  # positions divided by ``factor``
    LLAMA3 = "llama3"  # low frequencies divided by ``factor``, smooth band in between


@dataclass(frozen=True)
class RopeScaling:
    kind: RopeScalingKind
    factor: float
    # LLAMA3 only: wavelength band (in units of the original context) that is interpolated.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, d: Mapping[str, Any] | None) -> RopeScaling | None:
        """None for no scaling; ValueError for a scaling type this engine does not implement."""
        if not d:
            return None
        kind_name = d.get("rope_type", d.get("type", "default"))
        if kind_name == "default":
            return None
        try:
            kind = RopeScalingKind(kind_name)
        except ValueError:
            supported = ", ".join(k.value for k in RopeScalingKind)
            raise ValueError(
                f"rope scaling type {kind_name!r} is not supported (supported: default, {supported})"
            ) from None
        return cls(
            kind=kind,
            factor=float(d["factor"]),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
        )

    def to_hf(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rope_type": self.kind.value, "factor": self.factor}
        if self.kind is RopeScalingKind.LLAMA3:
            d.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return d


@dataclass(frozen=True)
class ModelConfig:
    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    o_bias: bool = False  # Llama ``attention_bias``: output projection too
    mlp_bias: bool = False
    # Mistral v0.1: a query at position p attends to keys at positions > p - sliding_window.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def num_params(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.num_kv_heads * self.head_dim
        q = self.num_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        if self.qkv_bias:
            per_layer += q + 2 * kv
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> ModelConfig:
        model_type = d.get("model_type", "llama")
        try:
            arch = Architecture(model_type)
        except ValueError:
            supported = ", ".join(a.value for a in Architecture)
            raise ValueError(
                f"model_type {model_type!r} is not supported (supported: {supported})"
            ) from None
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        rope_params: Mapping[str, Any] = d.get("rope_parameters") or {}
        rope_theta = float(d.get("rope_theta", rope_params.get("rope_theta", 10000.0)))
        rope_scaling = RopeScaling.from_hf(d.get("rope_scaling") or rope_params)
        sliding: int | None = None
        if arch is Architecture.MISTRAL:
            sliding = d.get("sliding_window")
        elif arch is Architecture.QWEN2 and d.get("use_sliding_window", False):
            raise ValueError("Qwen2 use_sliding_window=true is not supported")
        eos = d.get("eos_token_id")
        eos_ids = (
            tuple(int(e) for e in eos)
            if isinstance(eos, list)
            else (() if eos is None else (int(eos),))
        )
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=arch is Architecture.QWEN2 or attention_bias,
            o_bias=arch is not Architecture.QWEN2 and attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            sliding_window=None if sliding is None else int(sliding),
            bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
            eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` dict that ``from_hf`` and ``transformers`` both read back."""
        if self.architecture is Architecture.QWEN2 and (self.o_bias or not self.qkv_bias):
            raise ValueError("a Qwen2 config always has q/k/v bias and no output bias")
        if self.architecture is not Architecture.QWEN2 and self.qkv_bias != self.o_bias:
            raise ValueError("Llama/Mistral configs bias all attention projections or none")
        d: dict[str, Any] = {
            "architectures": [self.architecture.hf_class],
            "model_type": self.architecture.value,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "mlp_bias": self.mlp_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids),
        }
        if self.architecture is not Architecture.QWEN2:
            d["attention_bias"] = self.o_bias
        if self.architecture is Architecture.MISTRAL:
            d["sliding_window"] = self.sliding_window
        return d


# Byte tokenizer ids used by random models (see tokenizer.ByteTokenizer).
BYTE_BOS_ID = 256
BYTE_EOS_ID = 257
BYTE_PAD_ID = 258
BYTE_VOCAB_MIN = 259

_LLAMA3_EOS = (128001, 128008, 128009)

# Shapes of public checkpoints (their HF config.json values), for random-weight speed checks.
# Positional: architecture, vocabulary, hidden, intermediate, layers, heads, KV heads, head dim.
_LLAMA, _QWEN2, _MISTRAL = Architecture.LLAMA, Architecture.QWEN2, Architecture.MISTRAL
SHAPE_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        _LLAMA, 512, 64, 128, 2, 4, 2, 16, max_position_embeddings=4096,
        bos_token_id=BYTE_BOS_ID, eos_token_ids=(BYTE_EOS_ID,)),
    "smollm2-135m": ModelConfig(
        _LLAMA, 49152, 576, 1536, 30, 9, 3, 64, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,)),
    "llama-3.2-1b": ModelConfig(
        _LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, rope_theta=500000.0,
        rope_scaling=RopeScaling(RopeScalingKind.LLAMA3, 32.0, 1.0, 4.0, 8192),
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_ids=_LLAMA3_EOS),
    "llama-3.1-8b": ModelConfig(
        _LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, rope_theta=500000.0,
        rope_scaling=RopeScaling(RopeScalingKind.LLAMA3, 8.0, 1.0, 4.0, 8192),
        max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=_LLAMA3_EOS),
    "qwen2.5-0.5b": ModelConfig(
        _QWEN2, 151936, 896, 4864, 24, 14, 2, 64, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, tie_word_embeddings=True, qkv_bias=True,
        bos_token_id=151643, eos_token_ids=(151645, 151643)),
    "qwen2.5-7b": ModelConfig(
        _QWEN2, 152064, 3584, 18944, 28, 28, 4, 128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, qkv_bias=True, bos_token_id=151643,
        eos_token_ids=(151645, 151643)),
    "mistral-7b": ModelConfig(
        _MISTRAL, 32768, 4096, 14336, 32, 32, 8, 128, rope_theta=1000000.0,
        max_position_embeddings=32768, bos_token_id=1, eos_token_ids=(2,)),
}  # fmt: skip

RANDOM_SUFFIX = "-random"


def random_preset_config(name: str) -> ModelConfig | None:
    """The config of a random-weight preset (``tiny-random``, ``<shape>-random``), else None.

    Random models always get an untied head and the byte tokenizer's bos/eos ids: greedy decoding
    of a random *tied* head tends to echo its input, which would make equality tests vacuous.
    """
    if not name.endswith(RANDOM_SUFFIX):
        return None
    shape = SHAPE_PRESETS.get(name[: -len(RANDOM_SUFFIX)])
    if shape is None:
        return None
    if shape.vocab_size < BYTE_VOCAB_MIN:
        raise ValueError(f"preset {name}: vocab {shape.vocab_size} < {BYTE_VOCAB_MIN} byte ids")
    return dataclasses.replace(
        shape, tie_word_embeddings=False, bos_token_id=BYTE_BOS_ID, eos_token_ids=(BYTE_EOS_ID,)
    )


def random_preset_names() -> list[str]:
    return [name + RANDOM_SUFFIX for name in SHAPE_PRESETS]
