"""Profile the real engine: forward-pass times over a grid of batch shapes
(``radixsched calibrate --profile``), as the step-time table ``simulate --calibration`` reads.

Rows (``sim.cost.table``'s format): ``prefill`` batches of ``batch_size`` requests with
``num_tokens`` new tokens in all and no cached prefix; ``decode`` batches of ``batch_size``
requests reading ``num_tokens`` context tokens in all. Each shape is run once to warm up, then
``repeats`` times; the median is kept. KV slots are the pool's first ones (their contents do
not change the time).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixsched.engine.loader import load_model
from radixsched.engine.runner import TorchRunner
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry


@dataclass(frozen=True)
class ProfileGrid:
    batch_sizes: list[int]
    prefill_tokens: list[int]  # new tokens per request
    decode_context: list[int]  # context tokens per request
    repeats: int = 5


def _dummy_request(i: int, n: int) -> Req:
    return Req(f"p{i}", np.zeros(n, dtype=np.int32) + 65, SamplingParams(max_new_tokens=1))


def _median_forward_s(runner: TorchRunner, batch: Batch, repeats: int) -> float:
    runner.forward(batch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner.forward(batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_engine(
    model: str, grid: ProfileGrid, *, device: str = "cpu", dtype: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time ``model`` over ``grid``; returns the table rows and what they were measured on."""
    loaded = load_model(model, device=device, dtype=dtype)
    ctx = loaded.config.max_position_embeddings
    longest = max(max(grid.prefill_tokens), max(grid.decode_context))
    if longest + 1 > ctx:
        raise ValueError(f"{model}: shapes of {longest} tokens exceed its context of {ctx}")
    need = max(grid.batch_sizes) * (longest + 1) + 1
    runner = TorchRunner(loaded, need, device=device)
    rows: list[dict[str, Any]] = []
    for b in grid.batch_sizes:
        for n in grid.prefill_tokens:
            entries = []
            for i in range(b):
                slots = np.arange(1 + i * n, 1 + (i + 1) * n, dtype=np.int64)
                ids = np.full(n, 65, dtype=np.int32)
                entries.append(
                    ExtendEntry(_dummy_request(i, n), 0, ids, np.zeros(0, np.int64), slots, True)
                )
            ms = _median_forward_s(runner, Batch(entries, []), grid.repeats) * 1e3
            rows.append({"kind": "prefill", "batch_size": b, "num_tokens": b * n, "ms": ms})
        for c in grid.decode_context:
            dec = []
            for i in range(b):
                slots = np.arange(1 + i * c, 1 + (i + 1) * c, dtype=np.int64)
                dec.append(DecodeEntry(_dummy_request(i, c), 65, c - 1, slots))
            ms = _median_forward_s(runner, Batch([], dec), grid.repeats) * 1e3
            rows.append({"kind": "decode", "batch_size": b, "num_tokens": b * c, "ms": ms})
    info = {
        "model": model,
        "gpu": "CPU" if runner.device.type == "cpu" else str(runner.device),
        "device": str(runner.device),
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "engine": "radixsched engine (profile)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "repeats": grid.repeats,
    }
    return rows, info
