"""A Llama-family decoder (Llama 2/3, Qwen2, Mistral) in plain PyTorch over a slot-indexed KV pool.

Parameter names mirror Hugging Face's (``model.layers.N.self_attn.q_proj.weight`` ...), so a
safetensors checkpoint loads with ``load_state_dict`` and a ``transformers`` model can load ours.

One ``forward`` runs every token of a scheduler step (variable-length extends and decodes,
flattened into one sequence of ``T`` tokens): projections and MLPs are batched over all ``T``
tokens; attention reads keys/values from the pool by slot, per extend segment and once for all
decode tokens together. Every layer first writes the step's new K/V into their slots and then
gathers each sequence's whole context from the pool, so a prefix computed in an earlier step and a
prefix computed in this one are read the same way (the basis of the exact-reuse tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixsched.engine.config import ModelConfig, RopeScaling, RopeScalingKind


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Per-pair rotation frequencies ``[head_dim // 2]`` (float32), scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind is RopeScalingKind.LINEAR:
        return inv_freq / scaling.factor
    # LLAMA3: wavelengths longer than original_ctx / low_freq_factor are stretched by ``factor``,
    # shorter than original_ctx / high_freq_factor are kept, and the band between is blended
    # linearly in original_ctx / wavelength.
    orig = float(scaling.original_max_position_embeddings)
    wavelen = 2.0 * math.pi / inv_freq
    ratio = orig / wavelen
    blend = (ratio - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1.0 - blend) * inv_freq / scaling.factor + blend * inv_freq
    out = torch.where(wavelen > orig / scaling.low_freq_factor, inv_freq / scaling.factor, blended)
    return torch.where(wavelen < orig / scaling.high_freq_factor, inv_freq, out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x``: ``[T, heads, head_dim]``; ``cos``/``sin``: ``[T, head_dim]`` (HF half-split layout)."""
    cos = cos[:, None, :].to(x.dtype)
    sin = sin[:, None, :].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


@dataclass
class ExtendSegment:
    """One extend entry's share of a step: queries ``[q_start, q_start + q_len)`` of the flat
    token sequence attend to the keys at ``kv_slots`` (cached prefix, then the new tokens)."""

    q_start: int
    q_len: int
    kv_slots: torch.Tensor  # [kv_len] int64, kv_len = prefix_len + q_len
    # [q_len, kv_len] bool (True = attend), or None: no prefix and no window, plain causal.
    mask: torch.Tensor | None


@dataclass
class DecodeGroup:
    """All decode tokens of a step: flat tokens ``[q_start, q_start + batch)``, one per request."""

    q_start: int
    kv_slots: torch.Tensor  # [batch, max_len] int64, rows padded with slot 0
    mask: torch.Tensor | None  # [batch, 1, 1, max_len] bool, None when no row is padded/windowed


@dataclass
class AttentionPlan:
    """Where a step's K/V go and what each query attends to; shared by every layer."""

    write_slots: torch.Tensor  # [T] int64: slot of each flat token's K/V (distinct, never 0)
    extends: list[ExtendSegment]
    decode: DecodeGroup | None


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=config.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_layer: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        k_pool, v_pool = kv_layer[0], kv_layer[1]
        # Written before any read: a sequence's context is always gathered from the pool.
        k_pool.index_copy_(0, plan.write_slots, k)
        v_pool.index_copy_(0, plan.write_slots, v)

        out = torch.empty_like(q)
        for seg in plan.extends:
            qs = q[seg.q_start : seg.q_start + seg.q_len].transpose(0, 1)[None]
            ks = k_pool.index_select(0, seg.kv_slots).transpose(0, 1)[None]
            vs = v_pool.index_select(0, seg.kv_slots).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=seg.mask, is_causal=seg.mask is None, enable_gqa=True
            )
            out[seg.q_start : seg.q_start + seg.q_len] = o[0].transpose(0, 1)
        dec = plan.decode
        if dec is not None:
            b = dec.kv_slots.shape[0]
            qd = q[dec.q_start : dec.q_start + b][:, :, None, :]  # [B, H, 1, D]
            # index_select on the flattened rows: 2-D advanced indexing is far slower on CPU.
            flat = dec.kv_slots.reshape(-1)
            shape = (b, dec.kv_slots.shape[1], self.num_kv_heads, self.head_dim)
            kd = k_pool.index_select(0, flat).view(shape).transpose(1, 2)  # [B, KVH, L, D]
            vd = v_pool.index_select(0, flat).view(shape).transpose(1, 2)
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=dec.mask, enable_gqa=True)
            out[dec.q_start : dec.q_start + b] = o[:, :, 0, :]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_layer: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_layer, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder plus LM head. ``lm_head`` is absent when the embeddings are tied."""

    inv_freq: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head: nn.Linear | None = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        # Not a checkpoint tensor; a GGUF may override it with stored per-pair factors.
        self.register_buffer(
            "inv_freq",
            rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling),
            persistent=False,
        )

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def new_kv_pool(self, num_slots: int) -> torch.Tensor:
        """Zeroed pool ``[layers, 2, num_slots, kv_heads, head_dim]`` in the model's dtype."""
        c = self.config
        return torch.zeros(
            (c.num_layers, 2, num_slots, c.num_kv_heads, c.head_dim),
            dtype=self.dtype,
            device=self.device,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_pool: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        """Final-normed hidden states ``[T, hidden]`` of the step's flat tokens; writes their
        K/V into ``kv_pool`` at ``plan.write_slots``."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, kv_pool[i], plan)
        out: torch.Tensor = self.model.norm(x)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` for selected hidden rows."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
