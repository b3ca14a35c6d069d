"""Simulator-side settings (the scheduler's own live in ``config.SchedulerConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True)
class SimConfig:
    """Simulator-side settings (the scheduler's own settings live in SchedulerConfig)."""

    CLI_TITLE: ClassVar[str] = "simulated system (cost model, cluster)"

    model: str = field(default="llama-3.1-8b", metadata={"help": "model preset"})
    gpu: str = field(default="h200", metadata={"help": "GPU preset"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree"})
    mem_fraction_static: float = field(
        default=0.88, metadata={"help": "fraction of GPU memory for weights + KV (SGLang's flag)"}
    )
    max_total_tokens: int | None = field(
        default=None, metadata={"help": "KV capacity in tokens (overrides the memory model)"}
    )
    calibration: str | None = field(
        default=None, metadata={"help": "CSV/JSON of measured step times replacing the roofline"}
    )
    dp: int = field(default=1, metadata={"help": "data-parallel replicas"})
    router: str | None = field(
        default=None, metadata={"help": "router for --dp > 1 (default: cache-aware)"}
    )
    enable_dp_attention: bool = field(
        default=False, metadata={"help": "replicas step in lockstep; prefills are negotiated"}
    )
    enable_prefill_delayer: bool = field(
        default=True, metadata={"help": "with --enable-dp-attention: negotiate prefill rounds"}
    )
    prefill_delayer_max_delay_passes: int = field(
        default=30, metadata={"help": "delayer: max consecutive delayed passes"}
    )
    prefill_delayer_max_delay_ms: float | None = field(
        default=None, metadata={"help": "delayer: wall-clock cap on a delay (ms)"}
    )
    prefill_delayer_token_usage_low_watermark: float | None = field(
        default=None, metadata={"help": "delayer: always allow below this KV usage"}
    )
    prefill_delayer_queue_min_ratio: float | None = field(
        default=None, metadata={"help": "delayer: queue trigger ratio (opt-in)"}
    )
    # ---- prefill/decode disaggregation (sim.disagg) -------------------------------------
    disaggregation: bool = field(
        default=False,
        metadata={
            "help": "split prefill and decode onto their own instances (SGLang's PD "
            "disaggregation): requests are prefilled on a prefill instance and their KV "
            "shipped to a decode instance"
        },
    )
    prefill_instances: int = field(
        default=1, metadata={"help": "with --disaggregation: prefill instances"}
    )
    decode_instances: int = field(
        default=1, metadata={"help": "with --disaggregation: decode instances"}
    )
    prefill_gpu: str | None = field(
        default=None, metadata={"help": "GPU preset of prefill instances (default: --gpu)"}
    )
    prefill_tp: int | None = field(
        default=None,
        metadata={"help": "tensor-parallel degree of prefill instances (default: --tp)"},
    )
    decode_gpu: str | None = field(
        default=None, metadata={"help": "GPU preset of decode instances (default: --gpu)"}
    )
    decode_tp: int | None = field(
        default=None,
        metadata={"help": "tensor-parallel degree of decode instances (default: --tp)"},
    )
    prefill_max_total_tokens: int | None = field(
        default=None,
        metadata={"help": "KV capacity of a prefill instance (default: --max-total-tokens)"},
    )
    decode_max_total_tokens: int | None = field(
        default=None,
        metadata={"help": "KV capacity of a decode instance (default: --max-total-tokens)"},
    )
    decode_router: str | None = field(
        default=None,
        metadata={
            "help": "router choosing the decode instance (default: least-load: the least KV "
            "committed plus decode tokens to come); --router picks the prefill instance"
        },
    )
    disaggregation_link: str = field(
        default="infiniband",
        metadata={"help": "link the KV is shipped over: nvlink, infiniband, roce, pcie"},
    )
    disaggregation_link_bandwidth_gb_s: float | None = field(
        default=None,
        metadata={"help": "link bandwidth per GPU in GB/s, inf allowed (default: the link's)"},
    )
    disaggregation_link_latency_ms: float | None = field(
        default=None, metadata={"help": "fixed cost of one KV transfer in ms (default: the link's)"}
    )
    disaggregation_bootstrap_ms: float | None = field(
        default=None,
        metadata={
            "help": "decode-to-prefill handshake once the KV is preallocated, in ms (default: "
            "the link latency)"
        },
    )
    enable_hierarchical_cache: bool = field(
        default=False, metadata={"help": "keep evicted KV in a host-memory tier"}
    )
    hicache_size: float = field(default=64.0, metadata={"help": "host KV tier size in GB"})
    hicache_page_size: int = field(
        default=64,
        metadata={
            "help": "host KV tier page in tokens (rounded up to a multiple of --page-size); "
            "host hits are whole host pages"
        },
    )
