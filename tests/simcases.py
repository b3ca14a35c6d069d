"""Small simulation cases shared by the simulator tests (the Mooncake sample lives in data/)."""

from __future__ import annotations

from pathlib import Path

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
