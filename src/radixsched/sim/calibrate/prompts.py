"""The prompts a replay sends for a measured run whose tool does not record them: of the
measured lengths, sharing prefixes as the benchmark's recorded structure says (GuideLLM's
synthetic ``prefix_buckets``), else request-unique."""

from __future__ import annotations

import numpy as np

from radixsched.request import Req, SamplingParams
from radixsched.sim.calibrate.measured import MeasuredRun, PrefixBucket

# Token ids drawn for replayed prompts (any id below every preset's vocabulary).
VOCAB = 32000


def _prefix_ids(bucket: int, k: int, tokens: int) -> np.ndarray:
    """Shared prefix ``k`` of bucket ``bucket``: the same ids for every request drawing it."""
    return np.random.default_rng([bucket, k, 0x5EED]).integers(0, VOCAB, tokens, dtype=np.int32)


def _draws(buckets: tuple[PrefixBucket, ...], n: int, index: int) -> list[tuple[int, int]]:
    """(bucket, prefix) for each of ``n`` requests, drawn by the buckets' weights."""
    rng = np.random.default_rng([index, 0xB0C7])
    weights = np.array([b.weight for b in buckets], dtype=float)
    picks = rng.choice(len(buckets), size=n, p=weights / weights.sum())
    return [(int(b), int(rng.integers(buckets[int(b)].count))) for b in picks]


def replay_prompts(run: MeasuredRun, index: int) -> list[Req]:
    """One request per measured one: its prompt length (the shared prefix first, when the
    run's structure has one: never the whole prompt, the last token stays the request's own)
    and its output length."""
    rng = np.random.default_rng([index, 0xCA11])
    buckets = run.prefixes or ()
    draws = _draws(buckets, len(run.requests), index) if buckets else []
    out = []
    for i, m in enumerate(run.requests):
        head = np.zeros(0, dtype=np.int32)
        if draws:
            b, k = draws[i]
            head = _prefix_ids(b, k, buckets[b].tokens)[: max(0, m.prompt_len - 1)]
        tail = rng.integers(0, VOCAB, size=m.prompt_len - len(head), dtype=np.int32)
        out.append(
            Req(
                rid=f"{run.name}-{i}",
                prompt_ids=np.concatenate([head, tail]),
                sampling=SamplingParams(max_new_tokens=m.output_len, ignore_eos=True),
            )
        )
    return out
