"""``--engine-mode sglang|vllm``: the defaults of the engine being modelled.

The scheduler is SGLang's; in ``vllm`` mode the settings where vLLM's V1 scheduler behaves
differently and an equivalent exists take vLLM's values. Settings given explicitly (a flag,
a ``--config`` or sweep key) always win; ``sim.runconfig.RunSettings.scheduler_config`` applies
the mode and ``sim.runconfig.check`` validates it.

=====================  ===============================  ===================================
behaviour              sglang (default)                 vllm
=====================  ===============================  ===================================
chunk alignment        a chunk is rounded down to       chunks end anywhere (modelled with
                       whole pages (``page``)           token-granular KV: ``--page-size 1``)
prefill budget         ``--chunked-prefill-size`` 8192  ``max_num_batched_tokens`` 8192 for
                       for the prefill batch; decode    the whole step, decodes included
                       runs in its own step             (``--enable-mixed-chunk``)
admission              reserves ``new_token_ratio`` of  needs only the prompt's KV
                       each request's remaining output  (``--schedule-conservativeness 0``)
running requests       from KV capacity                 ``max_num_seqs`` 256
preemption victim      longest decode first (retract,   not modelled: vLLM preempts the most
                       KV kept in the cache)            recent request and recomputes it
=====================  ===============================  ===================================

Not modelled in either mode: vLLM's prefix cache matches whole 16-token blocks only (the
simulated cache in ``vllm`` mode matches tokens), CUDA-graph batch-size padding."""

from __future__ import annotations

from typing import Any

ENGINE_MODES: dict[str, dict[str, Any]] = {
    "sglang": {},
    "vllm": {
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 8192,
        "enable_mixed_chunk": True,
        "schedule_conservativeness": 0.0,
        "max_running_requests": 256,
    },
}
CHUNK_ALIGNMENT = {"sglang": "page", "vllm": "none"}


class EngineModeError(ValueError):
    pass


def scheduler_defaults(mode: str, given: set[str]) -> dict[str, Any]:
    """Scheduler settings ``mode`` changes, less those the user gave (``given``)."""
    try:
        defaults = ENGINE_MODES[mode]
    except KeyError:
        raise EngineModeError(
            f"unknown engine mode {mode!r}; valid: {', '.join(ENGINE_MODES)}"
        ) from None
    return {k: v for k, v in defaults.items() if k not in given}


def chunk_alignment(mode: str, alignment: str | None) -> str:
    return alignment if alignment is not None else CHUNK_ALIGNMENT[mode]


def check_alignment(alignment: str, page_size: int) -> None:
    """Unaligned chunks are modelled with token-granular KV only."""
    if alignment == "none" and page_size != 1:
        raise EngineModeError(
            f"--chunk-alignment none (vLLM's chunks) needs --page-size 1 in the simulator, "
            f"got --page-size {page_size}"
        )
