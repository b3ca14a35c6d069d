"""The prompts a replay sends for a measured run whose tool does not record them: the user's
trace matched to the measured requests (``calibrate --workload``), else prompts of the
measured lengths sharing prefixes as the benchmark's recorded structure says (GuideLLM's
synthetic ``prefix_buckets``), else request-unique ones."""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Sequence

import numpy as np

from radixsched.request import Req, SamplingParams
from radixsched.sim.calibrate.runs import MeasuredRun, PrefixBucket

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
    if run.prompts is not None:
        return [_req(run, i, np.asarray(ids, dtype=np.int32)) for i, ids in enumerate(run.prompts)]
    buckets = run.prefixes or ()
    draws = _draws(buckets, len(run.requests), index) if buckets else []
    out = []
    for i, m in enumerate(run.requests):
        head = np.zeros(0, dtype=np.int32)
        if draws:
            b, k = draws[i]
            head = _prefix_ids(b, k, buckets[b].tokens)[: max(0, m.prompt_len - 1)]
        tail = rng.integers(0, VOCAB, size=m.prompt_len - len(head), dtype=np.int32)
        out.append(_req(run, i, np.concatenate([head, tail])))
    return out


def _req(run: MeasuredRun, i: int, prompt: np.ndarray) -> Req:
    return Req(
        rid=f"{run.name}-{i}",
        prompt_ids=prompt,
        sampling=SamplingParams(max_new_tokens=run.requests[i].output_len, ignore_eos=True),
    )


def match_trace(run: MeasuredRun, trace: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """Each measured request's prompt from the user's trace, in the order both were sent: the
    next unused trace prompt of the measured length, else the next unused one cut (or
    extended with request-unique tokens) to that length. Returns the prompts and how many
    matched by length. The trace starts over once every prompt is used."""
    rng = np.random.default_rng([len(trace), 0x7EA5])
    by_len = _by_length(trace)
    used: set[int] = set()
    nxt = 0
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int32)] * len(run.requests)
    exact = 0
    sends = [(m.sent_at if m.sent_at is not None else i, i) for i, m in enumerate(run.requests)]
    for _, i in sorted(sends):
        m = run.requests[i]
        if len(used) == len(trace):
            used, by_len, nxt = set(), _by_length(trace), 0
        same = by_len[m.prompt_len]
        while same and same[0] in used:
            same.popleft()
        if same:
            j, exact = same.popleft(), exact + 1
        else:
            while nxt in used:
                nxt += 1
            j, nxt = nxt, nxt + 1
        used.add(j)
        ids = np.asarray(trace[j], dtype=np.int32)[: m.prompt_len]
        pad = rng.integers(0, VOCAB, size=m.prompt_len - len(ids), dtype=np.int32)
        out[i] = np.concatenate([ids, pad])
    return out, exact


def with_trace(run: MeasuredRun, trace: Sequence[np.ndarray]) -> tuple[MeasuredRun, int]:
    """``run`` replaying the user's trace (``match_trace``), and how many matched by length."""
    prompts, exact = match_trace(run, trace)
    return dataclasses.replace(run, prompts=tuple(prompts), structure_note=None), exact


def _by_length(trace: Sequence[np.ndarray]) -> defaultdict[int, deque[int]]:
    """The trace's prompt indices by prompt length, each in trace order."""
    groups: defaultdict[int, deque[int]] = defaultdict(deque)
    for j, ids in enumerate(trace):
        groups[len(ids)].append(j)
    return groups
