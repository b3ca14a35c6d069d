"""``python -m sglang.bench_serving --output-file F.jsonl --output-details``: one JSON object a
line, one run each: ``request_rate``, ``max_concurrency``, ``dataset_name``, the detail lists
(``input_lens``, ``output_lens``, ``ttfts``, ``itls`` in s, ``errors``), ``server_info``. No
send times, and none of the generated-shared-prefix arguments (``--gsp-*``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers.cost_note import unknown_structure
from radixsched.sim.calibrate.readers.lists import lists_run
from radixsched.sim.calibrate.runs import MeasuredRun

# Datasets whose prompts share no prefixes by construction (random text, random ids, one
# conversation turn each).
NO_SHARED_PREFIX = frozenset({"random", "random-ids", "sharegpt"})


def _note(dataset: Any) -> str | None:
    if dataset in NO_SHARED_PREFIX:
        return None
    if dataset == "generated-shared-prefix":
        return unknown_structure(
            "sglang.bench_serving records dataset generated-shared-prefix but none of its "
            "--gsp-* arguments (groups, system prompt length)"
        )
    return unknown_structure(f"sglang.bench_serving dataset {dataset!r}: prompts not recorded")


def is_sglang(doc: Mapping[str, Any]) -> bool:
    """sglang's line names its dataset; vLLM's results name their model instead."""
    return "dataset_name" in doc and "model_id" not in doc


def sglang_runs(lines: list[tuple[int, dict[str, Any]]], p: Path) -> list[MeasuredRun]:
    return [
        lists_run(obj, f"{p}:{i}", "sglang", note=_note(obj.get("dataset_name")), tool_version=None)
        for i, obj in lines
    ]
