"""``--engine-mode sglang|vllm``: the defaults of the engine being modelled.

The scheduler is SGLang's; in ``vllm`` mode the settings where vLLM's V1 scheduler behaves
differently and an equivalent exists take vLLM's values. Settings given explicitly (a flag,
a ``--config`` or sweep key) always win; ``sim.settings.runconfig.RunSettings.scheduler_config`` applies
the mode and ``sim.preflight.check`` validates it.

=====================  ===============================  ===================================
behaviour              sglang (default)                 vllm
=====================  ===============================  ===================================
chunk alignment        a chunk is rounded down to       chunks end anywhere (modelled with
                       whole pages (``page``)           token-granular KV: ``--page-size 1``)
prefill budget         ``--chunked-prefill-size`` 8192  ``max_num_batched_tokens`` for the
                       for the prefill batch; decode    whole step, decodes included
                       runs in its own step             (``--enable-mixed-chunk``): 8192 on
                                                        GPUs of 70 GiB or more but A100s,
                                                        2048 on the others (``VLLM_BATCH``)
admission              reserves ``new_token_ratio`` of  needs only the prompt's KV
                       each request's remaining output  (``--schedule-conservativeness 0``)
running requests       from KV capacity                 ``max_num_seqs``: 1024 on GPUs of
                                                        70 GiB or more but A100s, 256 on
                                                        the others
preemption victim      fewest output tokens first       the request that joined the running
                       (retract, KV kept in the cache)  batch last (vLLM's recompute
                                                        preemption; ``--retraction-policy
                                                        newest``), its KV freed to the cache
front-end latency      8.5 ms per request               10 ms (``FRONTEND_LATENCY_S``)
prefix-cache hits      whole pages (``--page-size``,    whole 16-token blocks
                       1 by default)                    (``--cache-block-size 16``: vLLM's
                                                        ``--block-size``), capped so that
                                                        the last prompt token is computed
=====================  ===============================  ===================================

In ``vllm`` mode KV is held token by token (``--page-size 1``) while hits count whole blocks:
vLLM allocates whole blocks, so its pool holds up to 15 tokens per running request fewer than
the simulated one. Not modelled in either mode: CUDA-graph batch-size padding."""

from __future__ import annotations

from typing import Any

ENGINE_MODES: dict[str, dict[str, Any]] = {
    "sglang": {},
    "vllm": {
        "enable_mixed_chunk": True,
        "schedule_conservativeness": 0.0,
        "retraction_policy": "newest",
        "cache_block_size": 16,
    },
}
CHUNK_ALIGNMENT = {"sglang": "page", "vllm": "none"}

# ``vllm serve``'s step budget and running-request cap by GPU (vLLM V1's
# ``EngineArgs.get_batch_defaults``, OpenAI server): large ones on GPUs of 70 GiB or more whose
# name is not an A100 (larger budgets lowered throughput on A100s, vLLM PR #17885), small ones
# on every other GPU.
_VLLM_LARGE_GPU_BYTES = 70 * 2**30
_A100_PRESETS = frozenset({"A100-40G", "A100-80G"})  # (sim.cost.hardware.GPUS names)
VLLM_BATCH = {
    "large": {
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 8192,
        "max_running_requests": 1024,
    },
    "other": {
        "chunked_prefill_size": 2048,
        "max_prefill_tokens": 2048,
        "max_running_requests": 256,
    },
}


def vllm_batch(gpu: str | None) -> dict[str, Any]:
    """``VLLM_BATCH``'s row for GPU preset ``gpu`` (an unknown or no GPU: the other GPUs')."""
    from radixsched.sim.cost.hardware import PresetError, get_gpu

    try:
        spec = get_gpu(gpu) if gpu else None
    except PresetError:  # (preflight names it)
        spec = None
    if spec is None or spec.memory_bytes < _VLLM_LARGE_GPU_BYTES or spec.name in _A100_PRESETS:
        return VLLM_BATCH["other"]
    return VLLM_BATCH["large"]


# Per-request front-end time (``request_latency_s``) by engine mode: the HTTP request, chat
# template and tokenisation, hand-off to the scheduler process, detokenisation and the first
# streamed chunk, i.e. a request's TTFT at zero load less its prefill step. From published
# runs at concurrency 1 whose step time is known, for a prompt of ~1,000 tokens:
#
# - vLLM: Qwen3-0.6B on an A100, concurrency 1 (tenstorrent/tt-inference-server issue #340,
#   "Qwen3 Family: GPU Benchmarks"): 12.4 ms TTFT for 128 input tokens with a 4.2 ms step
#   (its TPOT): 8.2 ms of front end. 21.0 ms at 1,024 tokens: 8.6 ms more, of which ~7 ms is
#   the longer prefill (1.1 TFLOP at ~half of 312 TFLOP/s), ~1.6 ms tokenising 900 more
#   tokens. 8.2 + 1.6 = ~10 ms. (vLLM's own profile of Llama-3-8B on an H100 put the HTTP
#   API server at 33% of the execution time: vLLM blog, "vLLM v0.6.0: 2.7x Throughput
#   Improvement and 5x Latency Reduction", 2024-09-05.)
# - SGLang: 9.5 ms median TTFT for 128-token prompts with a mock forward busy-waiting
#   2.6 ms per step (tenstorrent/tt-inference-server issue #3560, "Measure SGLang plugin
#   overhead", vllm bench serve --max-concurrency 1): 6.9 ms of front end; with the same
#   1.6 ms of tokenising, ~8.5 ms.
#
# An explicit ``--request-latency-ms`` or a calibration file's value wins over these.
FRONTEND_LATENCY_S = {"sglang": 0.0085, "vllm": 0.010}


class EngineModeError(ValueError):
    pass


def scheduler_defaults(mode: str, given: set[str], gpu: str | None = None) -> dict[str, Any]:
    """Scheduler settings ``mode`` changes on GPU preset ``gpu``, less those the user gave
    (``given``)."""
    try:
        defaults = dict(ENGINE_MODES[mode])
    except KeyError:
        raise EngineModeError(
            f"unknown engine mode {mode!r}; valid: {', '.join(ENGINE_MODES)}"
        ) from None
    if mode == "vllm":
        defaults.update(vllm_batch(gpu))
    return {k: v for k, v in defaults.items() if k not in given}


def chunk_alignment(mode: str, alignment: str | None) -> str:
    return alignment if alignment is not None else CHUNK_ALIGNMENT[mode]


def check_alignment(alignment: str, page_size: int) -> None:
    """Unaligned chunks are modelled with token-granular KV only."""
    if alignment == "none" and page_size != 1:
        raise EngineModeError(
            f"--chunk-alignment none (vLLM's chunks) needs --page-size 1 in the simulator, "
            f"got --page-size {page_size} (vLLM's --block-size is --cache-block-size here: "
            "16 by default in --engine-mode vllm)"
        )
