"""Hardware and model presets for the simulator's cost model, looked up by name.

GPU numbers are the vendors' datasheet values (dense bf16 tensor-core peak without sparsity,
HBM bandwidth) except those that datasheets do not give directly:

- ``memory_bytes`` is the total the driver reports (``nvidia-smi``'s MiB figure), which is what
  SGLang's ``--mem-fraction-static`` is a fraction of: H100 81,559 MiB, H200 143,771 MiB,
  B200 183,359 MiB, A100 80GB 81,920 MiB, A100 40GB 40,960 MiB, L40S 46,068 MiB, MI300X
  196,592 MiB (192 GiB less the driver's reserve).
- ``pcie_bw`` is an achievable pinned host-to-device copy rate, not the link's nominal rate:
  about 55 GB/s for PCIe Gen5 x16 (H100, H200, B200, MI300X; nominal 64 GB/s) and 25 GB/s for
  Gen4 x16 (A100, L40S; nominal 32 GB/s).
- ``link_bw`` is the GPU-to-GPU bandwidth one direction of one GPU has for collectives:
  NVLink 4 450 GB/s (H100 SXM, H200), NVLink 5 900 GB/s (B200), NVLink 3 300 GB/s (A100),
  the NVLink bridge of H100 PCIe pairs 300 GB/s, MI300X's seven Infinity Fabric links 448 GB/s,
  and PCIe for L40S (no NVLink). ``link_latency_s`` is the fixed cost of one small all-reduce
  (the one-shot kernels SGLang and vLLM use for decode-sized messages: 8-20 us).
- ``CPU`` is not a GPU: a few x86 cores running the local engine (order-of-magnitude numbers;
  ``radixsched calibrate`` fits the efficiencies against it).

Model shapes are those of the published Hugging Face ``config.json`` files; parameter counts
are the published totals (``tests/test_costmodel.py`` checks them against the shapes). Any
other model: ``--model path/to/config.json`` (``sim.cost.hfconfig``).

Names are matched case-insensitively, ignoring ``-``, ``_`` and spaces, with the common
spellings in ``GPU_ALIASES`` / ``MODEL_ALIASES`` (``a100`` is A100-80G, ``h100-sxm`` is H100)
and Hugging Face ids (``meta-llama/Llama-3.1-8B-Instruct``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
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

    - ``nvlink``: between GPUs of one node, at the GPUs' own ``link_bw`` (the slower side's:
      450 GB/s per direction for H100/H200 SXM, 900 GB/s B200, 300 GB/s A100; this preset's
      450 GB/s when no GPU is known), 10 us;
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
    """A GPU preset: memory, peak dense FLOP/s and bandwidths."""

    name: str
    memory_bytes: int  # total device memory as the driver reports it
    peak_flops: float  # dense bf16 tensor-core FLOP/s (no sparsity)
    hbm_bw: float  # device memory bandwidth, bytes/s
    pcie_bw: float  # achievable host<->device copy bandwidth, bytes/s
    link_bw: float = 450e9  # GPU-to-GPU bandwidth per direction for collectives, bytes/s
    link_latency_s: float = 8e-6  # fixed cost of one all-reduce
    # The prefill efficiency curve's defaults (``PREFILL_CURVES``): matmuls over ``T`` tokens
    # reach ``mfu * T / (T + prefill_eff_tokens)`` of ``peak_flops``. None: the roofline's
    # generic constants (``sim.cost.roofline.DEFAULT_MFU``, no size term).
    mfu: float | None = None
    prefill_eff_tokens: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape: what its weights, KV cache and FLOPs per token follow from."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models
    vocab_size: int
    dtype_bytes: int  # weights (2 = bf16); also the KV cache unless kv_dtype_bytes is set
    total_params: float  # every weight (all experts): what weight memory holds
    active_params: float  # weights one token passes through (2 of 8 experts for Mixtral)
    max_context_len: int
    num_experts: int = 1  # 1 = dense
    experts_per_token: int = 1
    tied_embeddings: bool = False
    # Multi-head latent attention (DeepSeek): values per token and layer in the KV cache,
    # replicated on every tensor-parallel rank. 0 = ordinary K and V heads.
    mla_kv_dim: int = 0
    kv_dtype_bytes: int | None = None  # None = dtype_bytes

    @property
    def kv_bytes(self) -> int:
        """Bytes of one cached value."""
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, over all KV heads (whole model, not per GPU)."""
        if self.mla_kv_dim:
            return self.num_layers * self.mla_kv_dim * self.kv_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.dtype_bytes

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_params(self) -> float:
        """Parameters of one expert over all layers (0 for dense models, and for a model whose
        every token passes through every expert: all its weights are read every step anyway)."""
        if not self.is_moe or self.experts_per_token >= self.num_experts:
            return 0.0
        return (self.total_params - self.active_params) / (
            self.num_experts - self.experts_per_token
        )

    @property
    def shared_params(self) -> float:
        """Parameters every token uses (attention, norms, embeddings, router)."""
        return self.active_params - self.experts_per_token * self.expert_params


# Prefill efficiency by GPU: (mfu, prefill_eff_tokens), from public kernel measurements.
#
# ``mfu`` is the fraction of dense bf16 peak a whole-model prefill of thousands of tokens
# reaches: the best a large bf16 GEMM reaches on that GPU, times 0.85 for the kernels that are
# no GEMM (RMSNorm, rotary embedding, SiLU-and-mul, residual adds, sampling; a rounded
# assumption of 15% of a prefill's time, not a measurement):
#
# - H100 SXM: large bf16 GEMMs reach ~795 TFLOP/s, 80% of 989 (S. Bekman, "Maximum
#   Achievable Matmul FLOPS" table, github.com/stas00/ml-engineering, compute/accelerator);
#   FlashAttention-3 reaches 740 TFLOP/s (75%) in bf16 (Shah et al. 2024, arXiv:2407.08608).
#   0.80 * 0.85 = 0.68. H200 is the same chip with faster memory: the same.
# - A100 SXM: ~87% of 312 TFLOP/s in the same table; FlashAttention-2 reaches up to 73%
#   forward (Dao 2023, arXiv:2307.08691). 0.87 * 0.85 = 0.74.
#
# ``prefill_eff_tokens`` (``T0``, the tokens at which a step's matmuls reach half of
# ``mfu``) comes of tile and wave quantisation: cuBLAS/CUTLASS Hopper and Ampere kernels
# typically tile ``M`` (the step's tokens) by 128 rows and ``N`` by 128-256 columns, and a
# GEMM of ``M`` tokens by ``N`` outputs fills the 132 SMs (108 on A100) only once its
# ``M * N / (128 * 256)`` tiles reach a wave:
# ``M`` >= ~1,000 for ``N`` = 4,096 (NVIDIA, "Matrix Multiplication Background User's Guide",
# tile and wave quantisation). 128 tokens on A100: a step of 128 tokens reaches half of
# ``mfu``, 4,096 tokens 97% of it (below ~300 tokens a step is memory-bound anyway).
# H100: 64, measured. ``bench/gpu_step_bench.py --compile`` ran whole-model steps (bf16, CUDA
# graphs, torch.compile'd as vLLM V1 runs them) of Llama-3.1-8B, Llama-2-13B, CodeLlama-34B
# (one TP2 shard) and Llama-3.1-70B (one TP4 shard) on an H100 80GB HBM3 (2026-12-05, data in
# bench/data/h100-2026-12-05/): over the 44 prefills of 128 to 16,384 tokens, (0.68, 64)
# predicts within 5.5% on average (bias -1%, worst 13%); (0.68, 128) was 9.8% pessimistic.
# GPUs without a published measurement keep the generic constants.
_HOPPER_CURVE = (0.68, 64.0)
_AMPERE_CURVE = (0.74, 128.0)
PREFILL_CURVES: dict[str, tuple[float, float]] = {
    "H100": _HOPPER_CURVE,
    "H200": _HOPPER_CURVE,
    "A100-40G": _AMPERE_CURVE,
    "A100-80G": _AMPERE_CURVE,
}


def _with_curve(g: GPUSpec) -> GPUSpec:
    curve = PREFILL_CURVES.get(g.name)
    if curve is None:
        return g
    return replace(g, mfu=curve[0], prefill_eff_tokens=curve[1])


GPUS: dict[str, GPUSpec] = {
    g.name: _with_curve(g)
    for g in (
        # name, memory, bf16 dense peak, HBM bandwidth, host copy, NVLink/fabric, collective
        GPUSpec("H100", 81_559 * MIB, 989.4e12, 3.35e12, 55e9, 450e9, 8e-6),
        GPUSpec("H100-PCIe", 81_559 * MIB, 756.5e12, 2.0e12, 55e9, 300e9, 10e-6),
        GPUSpec("H200", 143_771 * MIB, 989.4e12, 4.8e12, 55e9, 450e9, 8e-6),
        GPUSpec("B200", 183_359 * MIB, 2250e12, 8.0e12, 55e9, 900e9, 8e-6),
        GPUSpec("A100-40G", 40_960 * MIB, 312e12, 1.555e12, 25e9, 300e9, 10e-6),
        GPUSpec("A100-80G", 81_920 * MIB, 312e12, 2.039e12, 25e9, 300e9, 10e-6),
        GPUSpec("L40S", 46_068 * MIB, 362.05e12, 0.864e12, 25e9, 25e9, 20e-6),
        GPUSpec("MI300X", 196_592 * MIB, 1307.4e12, 5.3e12, 55e9, 448e9, 10e-6),
        # Not a GPU: a few x86 cores running the local engine in float32 (calibrate these).
        GPUSpec("CPU", 24_576 * MIB, 0.2e12, 20e9, 20e9, 20e9, 5e-6),
    )
}

# List prices, US dollars per GPU-hour on demand, for ``radixsched plan``'s cost columns
# (``--gpu-price h100=2.5`` overrides any of them; a GPU without one needs it). Public price
# pages as of 2025, per GPU in their 8-GPU on-demand instances where those exist; they change
# often and were not re-read when this table was written, so a plan's ranking is only as
# current as the prices it was given:
# - Lambda Cloud, lambda.ai/service/gpu-cloud (pricing): H100 SXM $2.99, H100 PCIe $2.49,
#   B200 $4.99, A100 SXM 80 GB $1.79, A100 SXM 40 GB $1.29;
# - RunPod, runpod.io/pricing (secure cloud): H200 $3.99, L40S $0.86, MI300X $2.49.
# ``CPU`` has none: a plan over it needs ``--gpu-price cpu=X``.
GPU_PRICES_PER_HOUR: dict[str, float] = {
    "H100": 2.99,
    "H100-PCIe": 2.49,
    "H200": 3.99,
    "B200": 4.99,
    "A100-40G": 1.29,
    "A100-80G": 1.79,
    "L40S": 0.86,
    "MI300X": 2.49,
}

# Other spellings users type (compared after ``_normalize``), by preset name.
GPU_ALIASES: dict[str, tuple[str, ...]] = {
    "H100": ("h100-sxm", "h100-sxm5", "h100-80g", "h100-80gb", "h100-sxm-80gb"),
    "H100-PCIe": ("h100pcie-80g", "h100-pcie-80gb"),
    "H200": ("h200-sxm", "h200-141g", "h200-141gb"),
    "B200": ("b200-sxm", "b200-180g", "b200-180gb"),
    "A100-40G": ("a100-40gb", "a100-sxm4-40gb", "a100-40"),
    "A100-80G": ("a100", "a100-80gb", "a100-sxm4-80gb", "a100-sxm", "a100-80"),
    "L40S": ("l40-s", "l40s-48g", "l40s-48gb"),
    "MI300X": ("mi300", "mi300x-192g", "mi300x-192gb", "instinct-mi300x"),
    "CPU": ("host",),
}


def _dense(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    vocab: int,
    params: float,
    ctx: int,
    *,
    tied: bool = False,
) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, inter, vocab, 2, params,
                     params, ctx, tied_embeddings=tied)  # fmt: skip


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _dense("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32_000, 6.74e9, 4096),
        _dense("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32_000, 13.0e9, 4096),
        _dense("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32_000, 69.0e9, 4096),
        _dense("codellama-34b", 48, 8192, 64, 8, 128, 22016, 32_000, 33.7e9, 16_384),
        _dense("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128_256, 8.03e9, 131_072),
        _dense("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128_256, 70.6e9, 131_072),
        _dense("llama-3.3-70b", 80, 8192, 64, 8, 128, 28672, 128_256, 70.6e9, 131_072),
        _dense("qwen2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151_936, 1.54e9, 32_768, tied=True),
        _dense("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152_064, 7.62e9, 32_768),
        _dense("qwen2.5-14b", 48, 5120, 40, 8, 128, 13824, 152_064, 14.7e9, 32_768),
        _dense("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152_064, 32.8e9, 32_768),
        _dense("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152_064, 72.7e9, 32_768),
        _dense("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151_936, 8.19e9, 40_960),
        _dense("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151_936, 14.8e9, 40_960),
        _dense("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151_936, 32.8e9, 40_960),
        # MoE: name, layers, hidden, heads, KV heads, head dim, intermediate size per expert,
        # vocabulary, weight bytes, total and active parameters, context, experts.
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32_000, 2, 46.7e9, 12.9e9,
                  32_768, num_experts=8, experts_per_token=2),
        ModelSpec("mixtral-8x22b", 56, 6144, 48, 8, 128, 16384, 32_768, 2, 140.6e9, 39.2e9,
                  65_536, num_experts=8, experts_per_token=2),
        # DeepSeek MoE with multi-head latent attention: the KV cache holds one compressed
        # latent (kv_lora_rank + rope dims = 576 values) per token and layer, the same on every
        # tensor-parallel rank. Attention FLOPs use head_dim = qk dims (128 nope + 64 rope).
        ModelSpec("deepseek-v2-lite", 27, 2048, 16, 16, 192, 1408, 102_400, 2, 15.7e9, 2.66e9,
                  163_840, num_experts=64, experts_per_token=6, mla_kv_dim=576),
        # Served in FP8 (1-byte weights); the KV cache stays bf16.
        ModelSpec("deepseek-v3", 61, 7168, 128, 128, 192, 2048, 129_280, 1, 671e9, 37.6e9,
                  163_840, num_experts=256, experts_per_token=8, mla_kv_dim=576,
                  kv_dtype_bytes=2),
    )
}  # fmt: skip

MODEL_ALIASES: dict[str, tuple[str, ...]] = {
    "llama-2-7b": ("llama2-7b", "llama-2-7b-hf", "llama-2-7b-chat-hf", "meta-llama/llama-2-7b-hf"),
    "llama-2-13b": ("llama2-13b", "llama-2-13b-hf", "llama-2-13b-chat-hf"),
    "llama-2-70b": ("llama2-70b", "llama-2-70b-hf", "llama-2-70b-chat-hf"),
    "codellama-34b": ("code-llama-34b", "codellama-34b-instruct-hf", "codellama-34b-hf"),
    "llama-3.1-8b": ("llama3.1-8b", "meta-llama-3.1-8b", "llama-3.1-8b-instruct"),
    "llama-3.1-70b": ("llama3.1-70b", "meta-llama-3.1-70b", "llama-3.1-70b-instruct"),
    "llama-3.3-70b": ("llama3.3-70b", "llama-3.3-70b-instruct"),
    "qwen2.5-7b": ("qwen2.5-7b-instruct", "qwen-2.5-7b"),
    "qwen2.5-72b": ("qwen2.5-72b-instruct", "qwen-2.5-72b"),
    "qwen3-8b": ("qwen-3-8b",),
    "mixtral-8x7b": ("mixtral-8x7b-v0.1", "mixtral-8x7b-instruct-v0.1", "mixtral"),
    "mixtral-8x22b": ("mixtral-8x22b-v0.1", "mixtral-8x22b-instruct-v0.1"),
    "deepseek-v3": ("deepseek-v3-0324", "deepseek-r1"),
}


def _normalize(name: str) -> str:
    """Lower case without separators: ``A100_80GB`` and ``a100-80gb`` compare equal."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


def _lookup(table: dict[str, _T], aliases: dict[str, tuple[str, ...]], name: str, what: str) -> _T:
    key = _normalize(name.rsplit("/", 1)[-1] if "/" in name else name)
    for canonical, value in table.items():
        spellings = (canonical, *aliases.get(canonical, ()))
        if any(_normalize(s.rsplit("/", 1)[-1]) == key for s in spellings):
            return value
    raise PresetError(f"unknown {what} {name!r}; valid: {', '.join(table)}")


def get_gpu(name: str) -> GPUSpec:
    """Case-insensitive lookup that also takes common spellings (``a100`` is A100-80G);
    raises ``PresetError`` listing valid names."""
    return _lookup(GPUS, GPU_ALIASES, name, "GPU")


def gpu_name(text: str) -> str:
    """A GPU preset's name for any case or common spelling (h200 = H200, a100 = A100-80G)."""
    try:
        return get_gpu(text).name
    except PresetError:
        return text  # the caller's checks report it (argparse's choices, the preflight)


LINKS: dict[str, LinkSpec] = {
    link.name: link
    for link in (
        LinkSpec("nvlink", 450e9, 10e-6),
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
