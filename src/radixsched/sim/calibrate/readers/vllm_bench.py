"""vLLM's bench client: ``vllm bench serve --save-result --save-detailed`` and the older
``benchmarks/benchmark_serving.py --save-result``: one JSON object: ``model_id``,
``request_rate`` (a number or ``"inf"``), ``max_concurrency``, the detail lists
(``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; ``start_times`` since
``vllm bench serve``). The dataset and its prefix options (``--random-prefix-len``,
``prefix_repetition``) are not recorded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers.cost_note import unknown_structure
from radixsched.sim.calibrate.readers.lists import lists_run
from radixsched.sim.calibrate.runs import MeasuredRun

NOTE = unknown_structure(
    "vLLM's bench result records neither its dataset nor a prefix length (--random-prefix-len)"
)


def is_vllm(doc: Mapping[str, Any]) -> bool:
    return "ttfts" in doc or "input_lens" in doc or "model_id" in doc


def vllm_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    return [lists_run(doc, str(p), "vllm", note=NOTE, tool_version=None)]
