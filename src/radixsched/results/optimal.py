"""The optimal hit rate: what an infinite prefix cache could serve of a workload.

In arrival order, each request hits the longest common prefix of its prompt with any earlier
request's cached sequence in the same namespace (prompt plus scripted output but its last
token, which is never fed back), capped at ``prompt_len - 1`` (one token is always computed)
and rounded down to whole pages; the rate is the hits over all prompt tokens. It is exact: the
sequences go into a radix tree of their own, whose insert reports the prefix already present
(one pass over each sequence's bytes, no hashing of every token)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixsched.cache import CacheKey, RadixCache
from radixsched.request import Req


def optimal_hits(reqs: Sequence[Req], page_size: int = 1) -> list[int]:
    """Each request's optimal cache hit in tokens (``reqs`` in any order)."""
    tree = RadixCache(None, page_size=1, split_copies=False)  # views of the prompts only
    hits = [0] * len(reqs)
    # The tree only ever compares tokens: its slots are views of one shared, read-only array.
    lengths = [0 if r.scripted_output is None else len(r.scripted_output) for r in reqs]
    longest = max((r.fill_len + n for r, n in zip(reqs, lengths, strict=True)), default=0)
    dummy = np.zeros(longest, dtype=np.int64)
    dummy.flags.writeable = False
    for i in sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time):
        r = reqs[i]
        seq = r.prompt_ids
        scripted = r.scripted_output
        fed = 0 if scripted is None else min(len(scripted), r.sampling.max_new_tokens - 1)
        if scripted is not None and fed > 0:
            seq = np.concatenate([seq, scripted[:fed]])
        shared = tree.insert(CacheKey(seq, r.namespace), dummy[: len(seq)], adopt=True).prefix_len
        hits[i] = min(shared, r.prompt_len - 1) // page_size * page_size
    return hits


def optimal_hit_rate(reqs: Sequence[Req], page_size: int = 1) -> float:
    """Share of prompt tokens an infinite prefix cache could serve (see the module)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    total = sum(r.prompt_len for r in reqs)
    return sum(optimal_hits(reqs, page_size)) / total if total else 0.0
