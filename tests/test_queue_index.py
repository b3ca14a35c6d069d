"""The incremental match/dedup index gives exactly what a full recomputation gives, round after
round, while the cache and the queue change underneath (inserts, evictions, arrivals,
admissions, re-queued requests with new output)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.config import SchedulerConfig
from radixsched.policy import SchedulePolicy
from radixsched.request import Req, SamplingParams


def _clone(r: Req) -> Req:
    c = Req(r.rid, r.prompt_ids, r.sampling, arrival_time=r.arrival_time)
    c.queue_entry_time = r.queue_entry_time
    c.output_ids = list(r.output_ids)
    return c


def _state(q: list[Req]) -> list[tuple[str, int]]:
    return [(r.rid, r.num_matched_prefix_tokens) for r in q]


@pytest.mark.parametrize("policy", ["lpm", "hrrn", "shortest-prefill-first", "fair", "dfs-weight"])
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_equals_full_recompute(policy: str, page: int, seed: int) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    alloc = TokenAllocator(20_000, page)
    cache = RadixCache(alloc, page_size=page)
    heads = [nrng.integers(0, 50, int(nrng.integers(8, 80))).astype(np.int32) for _ in range(5)]
    cfg = SchedulerConfig(schedule_policy=policy, page_size=page)
    inc = SchedulePolicy(cfg, cache)
    full = SchedulePolicy(cfg, cache)
    full._match_index = None  # the reference: every request re-matched every round
    full._dedup_index = None
    assert inc._match_index is not None and inc._dedup_index is not None
    q_inc: list[Req] = []
    q_full: list[Req] = []
    n = 0

    def prompt() -> np.ndarray:
        head = heads[rng.randrange(len(heads))]
        cut = rng.randrange(1, len(head) + 1)
        tail = nrng.integers(0, 50, rng.randrange(0, 20)).astype(np.int32)
        return np.concatenate([head[:cut], tail])

    for step in range(60):
        op = rng.random()
        if op < 0.3:
            p = prompt()
            r = Req(f"r{n}", p, SamplingParams(max_new_tokens=8), arrival_time=float(step))
            n += 1
            q_inc.append(r)
            q_full.append(_clone(r))
        elif op < 0.5:
            p = prompt()
            aligned = len(p) - len(p) % page
            slots = alloc.alloc(aligned) if aligned else None
            if slots is not None:
                res = cache.insert(CacheKey(p[:aligned]), slots)
                if res.prefix_len:
                    alloc.free(slots[: res.prefix_len])
        elif op < 0.6:
            cache.evict(rng.randrange(1, 60))
        elif op < 0.7 and q_inc:
            i = rng.randrange(len(q_inc))  # admitted: leaves the queue
            rid = q_inc.pop(i).rid
            q_full[:] = [r for r in q_full if r.rid != rid]
        elif op < 0.8 and q_inc:
            i = rng.randrange(len(q_inc))  # retracted with new output, re-queued
            extra = [int(t) for t in nrng.integers(0, 50, 3)]
            a = q_inc[i]
            b = next(r for r in q_full if r.rid == a.rid)
            for r in (a, b):
                r.output_ids.extend(extra)
            inc.forget(a)
            full.forget(b)
        res_i = inc.calc_priority(q_inc, [], processed_tokens=step * 10, now=float(step))
        res_f = full.calc_priority(q_full, [], processed_tokens=step * 10, now=float(step))
        assert _state(q_inc) == _state(q_full), f"step {step}"
        if policy == "dfs-weight":
            assert [r.last_node for r in q_inc] == [r.last_node for r in q_full]
        assert res_i.deferred == res_f.deferred, f"step {step}"
        assert res_i.deprioritized == res_f.deprioritized
