"""The optimal hit rate: what an infinite prefix cache could serve of a workload.

In arrival order, each request hits the longest common prefix of its prompt with any earlier
request's cached sequence in the same namespace (prompt plus scripted output but its last
token, which is never fed back), capped at ``prompt_len - 1`` (one token is always computed)
and rounded down to whole pages; the rate is the hits over all prompt tokens. It is exact: the
sequences go into a radix tree of their own, whose insert reports the prefix already present
(one pass over each sequence's bytes, no hashing of every token). With the native core the
same walk runs in C++ over a trie of spans of the sequences themselves (``_native/optimal.cpp``:
nothing copied), where every sequence is int32 (token arrays are); the reference tree otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from radixsched.cache import CacheKey, RadixCache
from radixsched.cache.base import Namespace
from radixsched.request import Req, TokenArray


def optimal_hits(reqs: Sequence[Req], page_size: int = 1) -> list[int]:
    """Each request's optimal cache hit in tokens (``reqs`` in any order)."""
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)
    seqs = [_cached_sequence(reqs[i]) for i in order]
    shared = _native_prefixes(seqs, [reqs[i].namespace for i in order])
    if shared is None:
        shared = _tree_prefixes(seqs, [reqs[i].namespace for i in order])
    hits = [0] * len(reqs)
    for i, n in zip(order, shared, strict=True):
        hits[i] = min(n, reqs[i].prompt_len - 1) // page_size * page_size
    return hits


def _cached_sequence(r: Req) -> TokenArray:
    """What ``r`` leaves cached: its prompt, then the scripted output fed back (all but the
    last token the request generates)."""
    scripted = r.scripted_output
    fed = 0 if scripted is None else min(len(scripted), r.sampling.max_new_tokens - 1)
    if scripted is None or fed <= 0:
        return r.prompt_ids
    return np.concatenate([r.prompt_ids, scripted[:fed]])


def _tree_prefixes(seqs: list[TokenArray], namespaces: list[Namespace]) -> list[int]:
    """The reference: each sequence's prefix already in a radix tree of the earlier ones."""
    tree = RadixCache(None, page_size=1, split_copies=False)  # views of the prompts only
    # The tree only ever compares tokens: its slots are views of one shared, read-only array.
    dummy = np.zeros(max(map(len, seqs), default=0), dtype=np.int64)
    dummy.flags.writeable = False
    return [
        tree.insert(CacheKey(seq, ns), dummy[: len(seq)], adopt=True).prefix_len
        for seq, ns in zip(seqs, namespaces, strict=True)
    ]


def _native_prefixes(seqs: list[TokenArray], namespaces: list[Namespace]) -> list[int] | None:
    """``_tree_prefixes`` by the native core's trie; None without the core, or where a
    sequence is not int32 (its tokens are then compared as they are, by the tree)."""
    from radixsched.native import core

    mod = core()
    if mod is None or any(s.dtype != np.int32 for s in seqs):
        return None
    ids: dict[Namespace, int] = {}
    ns_ids = [ids.setdefault(ns, len(ids)) for ns in namespaces]
    seqs = [np.ascontiguousarray(s) for s in seqs]
    return cast(list[int], mod.optimal_prefixes(seqs, ns_ids))


def optimal_hit_rate(reqs: Sequence[Req], page_size: int = 1) -> float:
    """Share of prompt tokens an infinite prefix cache could serve (see the module)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    total = sum(r.prompt_len for r in reqs)
    return sum(optimal_hits(reqs, page_size)) / total if total else 0.0
