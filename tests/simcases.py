"""Small simulation cases shared by the simulator tests (the Mooncake sample lives in data/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radixsched.request import Req, SamplingParams
from radixsched.sim.workloads.load import Workload

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "mooncake_sample.jsonl"

# (spec, request rate, first N requests, KV capacity in tokens). The Mooncake sample's long
# prompts in a 60k-token pool force retractions, so jumps must stop exactly before them.
JUMP_WORKLOADS: dict[str, tuple[str, float | None, int | None, int | None]] = {
    "shared-prefix": (
        "shared-prefix:groups=4,prompts=4,system_len=512,question_len=64,output_len=64",
        20.0,
        None,
        None,
    ),
    "multi-turn": (
        "multi-turn:conversations=4,turns=3,first_len=256,turn_len=64,output_len=32",
        4.0,
        None,
        None,
    ),
    "mooncake": (f"mooncake:{SAMPLE}", None, 60, 60_000),
}


def random_lengths(seed: int, n: int) -> Workload:
    """``n`` random prompts of 1-900 tokens over a 3-token vocabulary (so they share short
    prefixes by accident), 1-80 output tokens each, Poisson arrivals at 40/s."""
    rng = np.random.default_rng(seed)
    reqs, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(1 / 40))
        prompt = rng.integers(0, 3, int(rng.integers(1, 900))).astype(np.int32)
        r = Req(f"r{i}", prompt, SamplingParams(max_new_tokens=int(rng.integers(1, 80))))
        r.arrival_time = r.times.arrival = t
        reqs.append(r)
    return Workload("random-lengths", {}, reqs, has_timestamps=True, arrivals="poisson 40/s")
