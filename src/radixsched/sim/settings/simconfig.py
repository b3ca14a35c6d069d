"""Simulator-side settings (the scheduler's own live in ``config.SchedulerConfig``).

Every field is a ``simulate`` flag (``--field-name``) and is recorded in ``--json`` output.
Cost-model constants default to None: the calibration file's value when one is given, else
the documented default (``sim.cost.roofline``); the constants the run used are recorded under
``config.cost_model``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

logger = logging.getLogger(__name__)


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3


def _opt(default: Any, help_: str, **meta: Any) -> Any:
    """A field with its flag's help (and argparse extras such as ``choices``)."""
    return field(default=default, metadata={"help": help_, **meta})


@dataclass(frozen=True)
class SimConfig:
    """Simulator-side settings (the scheduler's own settings live in SchedulerConfig)."""

    CLI_TITLE: ClassVar[str] = "simulated system (cost model, cluster)"

    model: str = _opt(
        "llama-3.1-8b", "model preset, or a Hugging Face config.json (file or model directory)"
    )
    gpu: str = _opt("h200", "GPU preset (case-insensitive; a100 = A100-80G, ...)")
    tp: int = _opt(1, "tensor-parallel degree")
    context_length: int | None = _opt(None, "context limit in tokens (default: the model's)")
    mem_fraction_static: float = _opt(
        0.88, "fraction of GPU memory for weights + KV (SGLang's flag)"
    )
    max_total_tokens: int | None = _opt(None, "KV capacity in tokens (overrides the memory model)")
    calibration: str | None = _opt(
        None,
        "calibration file: fitted constants from 'radixsched calibrate' (they "
        "replace the defaults of the constants below; a flag still wins), or a CSV/JSON "
        "table of measured step times replacing the roofline",
    )
    mfu: float | None = _opt(None, "fraction of peak FLOP/s large matmuls reach (default: 0.55)")
    mbu: float | None = _opt(None, "fraction of memory bandwidth decode reaches (default: 0.80)")
    step_overhead_ms: float | None = _opt(
        None, "exposed per-step GPU overhead in ms (default: 1.0)"
    )
    prefill_eff_tokens: float | None = _opt(
        None, "tokens per step at which matmuls reach half of --mfu (default: 0, off)"
    )
    sched_step_ms: float | None = _opt(
        None, "scheduler CPU time per step in ms, not overlapped (default: 0)"
    )
    sched_per_req_ms: float | None = _opt(
        None, "scheduler CPU time per batch entry per step in ms (default: 0)"
    )
    sched_per_prefill_ms: float | None = _opt(
        None, "scheduler CPU time per prefill entry per step in ms (default: 0)"
    )
    request_latency_ms: float | None = _opt(
        None,
        "per-request fixed latency outside the GPU in ms (HTTP, tokenization, "
        "detokenization), part of TTFT and E2E (default: 0)",
    )
    request_serial_ms: float | None = _opt(
        None,
        "front-end time per request in ms, one request at a time (HTTP parsing, tokenization): "
        "requests sent together reach the scheduler this far apart (default: 0)",
    )
    engine_mode: str = _opt(
        "sglang",
        "engine whose defaults are modelled (chunk alignment, admission)",
        choices=["sglang", "vllm"],
    )
    chunk_alignment: str | None = _opt(
        None,
        "'page': chunks rounded down to whole pages (SGLang); 'none': cut "
        "anywhere (vLLM; needs --page-size 1) (default: by --engine-mode)",
        choices=["page", "none"],
    )
    max_concurrency: int | None = _opt(
        None,
        "closed loop: N clients, each sends its next request when the last one "
        "finishes (default: open loop)",
    )
    dp: int = _opt(1, "data-parallel replicas")
    router: str | None = _opt(None, "router for --dp > 1 (default: cache-aware)")
    enable_dp_attention: bool = _opt(False, "replicas step in lockstep; prefills are negotiated")
    enable_prefill_delayer: bool = _opt(
        True, "with --enable-dp-attention: negotiate prefill rounds"
    )
    prefill_delayer_max_delay_passes: int = _opt(30, "delayer: max consecutive delayed passes")
    prefill_delayer_max_delay_ms: float | None = _opt(
        None, "delayer: wall-clock cap on a delay (ms)"
    )
    prefill_delayer_token_usage_low_watermark: float | None = _opt(
        None, "delayer: always allow below this KV usage"
    )
    prefill_delayer_queue_min_ratio: float | None = _opt(
        None, "delayer: queue trigger ratio (opt-in)"
    )
    # ---- prefill/decode disaggregation (sim.deploy.disagg) -------------------------------------
    disaggregation: bool = _opt(
        False,
        "split prefill and decode onto their own instances (SGLang's PD disaggregation): requests "
        "are prefilled on a prefill instance and their KV shipped to a decode instance",
    )
    prefill_instances: int = _opt(1, "with --disaggregation: prefill instances")
    decode_instances: int = _opt(1, "with --disaggregation: decode instances")
    prefill_gpu: str | None = _opt(None, "GPU preset of prefill instances (default: --gpu)")
    prefill_tp: int | None = _opt(
        None, "tensor-parallel degree of prefill instances (default: --tp)"
    )
    decode_gpu: str | None = _opt(None, "GPU preset of decode instances (default: --gpu)")
    decode_tp: int | None = _opt(None, "tensor-parallel degree of decode instances (default: --tp)")
    prefill_max_total_tokens: int | None = _opt(
        None, "KV capacity of a prefill instance (default: --max-total-tokens)"
    )
    decode_max_total_tokens: int | None = _opt(
        None, "KV capacity of a decode instance (default: --max-total-tokens)"
    )
    decode_router: str | None = _opt(
        None,
        "router choosing the decode instance (default: least-load: the least KV "
        "committed plus decode tokens to come); --router picks the prefill instance",
    )
    disaggregation_link: str = _opt(
        "infiniband", "link the KV is shipped over: nvlink, infiniband, roce, pcie"
    )
    disaggregation_link_bandwidth_gb_s: float | None = _opt(
        None, "link bandwidth per GPU in GB/s, inf allowed (default: the link's)"
    )
    disaggregation_link_latency_ms: float | None = _opt(
        None, "fixed cost of one KV transfer in ms (default: the link's)"
    )
    disaggregation_bootstrap_ms: float | None = _opt(
        None,
        "decode-to-prefill handshake once the KV is preallocated, in ms (default: "
        "the link latency)",
    )
    enable_hierarchical_cache: bool = _opt(False, "keep evicted KV in a host-memory tier")
    hicache_size: float = _opt(64.0, "host KV tier size in GB")
    hicache_page_size: int = _opt(
        64,
        "host KV tier page in tokens (rounded up to a multiple of --page-size); "
        "host hits are whole host pages",
    )
