"""Two example policies, registered when radixsched loads its ``radixsched.policies`` entry
points (see this package's pyproject.toml).

- ``shortest-output-first``: the fewest ``max_new_tokens`` first, a key over the request's own
  fields (declares no reads);
- ``cache-then-short``: the longest cached prefix first, then the fewest output tokens; it
  declares ``Reads.MATCH``, so the queue matches every waiting request against the cache for
  it, and the accelerated queue keeps its order incrementally, with no code of its own.
"""

from __future__ import annotations

from radixsched.policies import Key, Reads, RequestView, Round, policy


@policy("shortest-output-first", "fewest max_new_tokens first (example plugin)")
def shortest_output_first(r: RequestView, rnd: Round) -> Key:
    return (r.max_new_tokens, r.queue_entry_time, r.arrival_time)


@policy(
    "cache-then-short",
    "longest cached prefix first, then fewest max_new_tokens (example plugin)",
    reads=Reads.MATCH,
    cache_aware=True,
)
def cache_then_short(r: RequestView, rnd: Round) -> Key:
    return (-r.num_matched_prefix_tokens, r.max_new_tokens, r.queue_entry_time, r.arrival_time)
