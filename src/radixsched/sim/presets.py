"""Hardware and model presets for the simulator's cost model, looked up by name.

GPU numbers are the vendors' datasheet values (dense bf16 tensor-core peak without sparsity,
HBM bandwidth) except two that datasheets do not give directly:

- ``memory_bytes`` is the total the driver reports (``nvidia-smi``'s MiB figure), which is what
  SGLang's ``--mem-fraction-static`` is a fraction of: H100 SXM 81,559 MiB, H200 143,771 MiB,
  A100 80GB 81,920 MiB, L40S 46,068 MiB.
- ``pcie_bw`` is an achievable pinned host-to-device copy rate, not the link's nominal rate:
  about 55 GB/s for PCIe Gen5 x16 (H100, H200; nominal 64 GB/s) and 25 GB/s for Gen4 x16
  (A100, L40S; nominal 32 GB/s).

Model shapes are those of the published Hugging Face ``config.json`` files; parameter counts
are the published totals (``tests/test_costmodel.py`` checks them against the shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

MIB = 1 << 20
_T = TypeVar("_T")


class PresetError(ValueError):
    """An unknown preset name; the message lists the valid ones."""


@dataclass(frozen=True)
class LinkSpec:
    """A link prefill/decode disaggregation ships KV over, one per GPU (as in DGX-class
    nodes, one NIC per GPU): ``bandwidth`` is what one KV transfer stream achieves, bytes/s
    per direction; ``latency_s`` the fixed cost of one transfer (RDMA setup, completion
    notification, the receiver's poll). Presets (``LINKS``), achievable rather than nominal:

    - ``nvlink``: NVLink 4 between GPUs of one node (H100/H200 SXM, 450 GB/s per direction),
      400 GB/s, 10 us;
    - ``infiniband``: NDR 400 Gb/s HCA per GPU (50 GB/s nominal), 45 GB/s, 25 us;
    - ``roce``: 400 GbE RoCE v2 NIC per GPU (50 GB/s nominal, congestion control costs
      more), 40 GB/s, 40 us;
    - ``pcie``: GPU to GPU through a PCIe Gen5 x16 switch (no NVLink), 50 GB/s, 10 us.
    """

    name: str
    bandwidth: float
    latency_s: float


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int  # total device memory as the driver reports it
    peak_flops: float  # dense bf16 tensor-core FLOP/s (no sparsity)
    hbm_bw: float  # device memory bandwidth, bytes/s
    pcie_bw: float  # achievable host<->device copy bandwidth, bytes/s


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models
    vocab_size: int
    dtype_bytes: int  # weights and KV cache (2 = bf16)
    total_params: float  # every weight (all experts): what weight memory holds
    active_params: float  # weights one token passes through (2 of 8 experts for Mixtral)
    max_context_len: int
    num_experts: int = 1  # 1 = dense
    experts_per_token: int = 1

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, over all KV heads (whole model, not per GPU)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.dtype_bytes

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_params(self) -> float:
        """Parameters of one expert over all layers (0 for dense models)."""
        if not self.is_moe:
            return 0.0
        return (self.total_params - self.active_params) / (
            self.num_experts - self.experts_per_token
        )

    @property
    def shared_params(self) -> float:
        """Parameters every token uses (attention, norms, embeddings, router)."""
        return self.active_params - self.experts_per_token * self.expert_params

    def architecture_params(self) -> int:
        """Parameter count implied by the shapes (no biases), for cross-checking presets."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        mlp = 3 * h * self.intermediate_size * self.num_experts
        router = h * self.num_experts if self.is_moe else 0
        norms = 2 * h
        embeddings = 2 * self.vocab_size * h + h  # untied input/output embeddings, final norm
        return self.num_layers * (attn + mlp + router + norms) + embeddings


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("H100", 81_559 * MIB, 989.4e12, 3.35e12, 55e9),
        GPUSpec("H200", 143_771 * MIB, 989.4e12, 4.8e12, 55e9),
        GPUSpec("A100-80G", 81_920 * MIB, 312e12, 2.039e12, 25e9),
        GPUSpec("L40S", 46_068 * MIB, 362.05e12, 0.864e12, 25e9),
    )
}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128_256, 2, 8.03e9, 8.03e9, 131_072),
        ModelSpec(
            "llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128_256, 2, 70.6e9, 70.6e9, 131_072
        ),
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152_064, 2, 7.62e9, 7.62e9, 32_768),
        ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152_064, 2, 72.7e9, 72.7e9, 32_768),
        ModelSpec(
            "mixtral-8x7b",
            32,
            4096,
            32,
            8,
            128,
            14336,
            32_000,
            2,
            46.7e9,
            12.9e9,
            32_768,
            num_experts=8,
            experts_per_token=2,
        ),
    )
}


def _lookup(table: dict[str, _T], name: str, what: str) -> _T:
    for key, value in table.items():
        if key.lower() == name.lower():
            return value
    raise PresetError(f"unknown {what} {name!r}; valid: {', '.join(table)}")


def get_gpu(name: str) -> GPUSpec:
    """Case-insensitive lookup; raises ``PresetError`` listing valid names."""
    return _lookup(GPUS, name, "GPU")


def get_model(name: str) -> ModelSpec:
    """Case-insensitive lookup; raises ``PresetError`` listing valid names."""
    return _lookup(MODELS, name, "model")


LINKS: dict[str, LinkSpec] = {
    link.name: link
    for link in (
        LinkSpec("nvlink", 400e9, 10e-6),
        LinkSpec("infiniband", 45e9, 25e-6),
        LinkSpec("roce", 40e9, 40e-6),
        LinkSpec("pcie", 50e9, 10e-6),
    )
}

LINK_ALIASES = {"ib": "infiniband", "nvl": "nvlink", "rocev2": "roce"}


def get_link(name: str) -> LinkSpec:
    """Case-insensitive lookup of a KV-transfer link; raises ``PresetError`` listing valid
    names."""
    key = name.lower().replace("-", "").replace("_", "").replace(" ", "")
    key = LINK_ALIASES.get(key, key)
    if key in LINKS:
        return LINKS[key]
    raise PresetError(f"unknown link {name!r}; valid: {', '.join(LINKS)}")
