"""vLLM's bench clients, ``--save-result``: one JSON object a run: ``model_id``,
``request_rate`` (a number or ``"inf"``), aggregates (``completed``, ``mean_ttft_ms``, ...) and
the per-request lists (``input_lens``, ``output_lens``, ``ttfts``, ``itls`` in s, ``errors``).
Three layouts, told apart by their fields and named in every message:

- ``benchmark_serving.py`` of 2024 (``best_of``, ``use_beam_search``; no ``max_concurrency``):
  always writes the lists; its ``output_lens`` are the client's re-tokenization of the streamed
  text, not the server's count.
- ``benchmark_serving.py`` of 2025, also the first ``vllm bench serve`` (``burstiness``,
  ``max_concurrency``): the lists only with ``--save-detailed`` (some versions kept them
  anyway).
- ``vllm bench serve`` since it records ``endpoint_type`` (0.33): adds ``start_times`` (the send
  times) and ``latencies``.

None records the dataset or its prefix options (``--random-prefix-len``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixsched.sim.calibrate.readers.cost_note import unknown_structure
from radixsched.sim.calibrate.readers.lists import LISTS, lists_run
from radixsched.sim.calibrate.runs import MeasuredRun, ResultFileError

# Fields shown when a file is refused (the rest elided).
_SHOWN_FIELDS = 12


@dataclass(frozen=True)
class Layout:
    name: str  # as messages name it
    markers: frozenset[str]  # a file with any of these fields has this layout
    lists_flag: str | None  # the flag that saves the per-request lists (None: always saved)


# In order of detection: the newest first (a newer file may keep an older one's fields).
LAYOUTS = (
    Layout("vllm bench serve result", frozenset({"endpoint_type"}), "--save-detailed"),
    Layout(
        "vLLM benchmark_serving.py result (2025 layout)",
        frozenset({"burstiness"}),
        "--save-detailed",
    ),
    Layout(
        "vLLM benchmark_serving.py result (2024 layout)",
        frozenset({"best_of", "use_beam_search"}),
        None,
    ),
)
_SUPPORTED = (
    "benchmark_serving.py 2024 (best_of), 2025 (burstiness), vllm bench serve (endpoint_type)"
)


def is_vllm(doc: Mapping[str, Any]) -> bool:
    return "ttfts" in doc or "input_lens" in doc or "model_id" in doc


def layout_of(doc: Mapping[str, Any]) -> Layout | None:
    return next((lay for lay in LAYOUTS if lay.markers & doc.keys()), None)


def vllm_runs(doc: Mapping[str, Any], p: Path) -> list[MeasuredRun]:
    lay = layout_of(doc)
    if lay is None:
        fields = sorted(doc)
        shown = ", ".join(fields[:_SHOWN_FIELDS]) + (", ..." if len(fields) > _SHOWN_FIELDS else "")
        raise ResultFileError(
            f"{p}: vLLM bench result of unknown layout (fields {shown}); supported: "
            f"{_SUPPORTED}, written with --save-result --save-detailed"
        )
    _check_lists(doc, p, lay)
    note = unknown_structure(
        f"{lay.name} records neither its dataset nor a prefix length (--random-prefix-len)"
    )
    return [lists_run(doc, str(p), "vllm", note=note, tool_version=None, label=lay.name)]


def _check_lists(doc: Mapping[str, Any], p: Path, lay: Layout) -> None:
    """The per-request lists are there: calibrate replays each request, a run's aggregates
    alone cannot be replayed."""
    missing = [k for k in LISTS if k not in doc]
    if not missing:
        return
    has = [k for k in ("completed", "mean_ttft_ms", "mean_itl_ms") if k in doc]
    what = f"only aggregates ({', '.join(has)}), " if has else ""
    if lay.lists_flag is None:
        fix = "which this client always writes: the file was cut or edited"
    else:
        fix = f"rerun with --save-result {lay.lists_flag}"
    raise ResultFileError(f"{p}: {lay.name}: {what}no per-request {', '.join(missing)}: {fix}")
