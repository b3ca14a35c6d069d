"""Schedule-policy micro-benchmark: ``calc_priority`` milliseconds per call.

Workload (deterministic, numpy ``default_rng(0)``): a page-1 radix cache filled with 200 groups
x 50 requests, each a 2,000-token group prefix plus a 200-token unique suffix over a
128,000-token vocabulary. Waiting requests are drawn from the same generator: a random group's
prefix plus a fresh 200-token suffix, so each matches 2,000 tokens (and the in-batch dedup check
never fires, as in a warm cache). For each policy and queue length, one warm-up call, then
repeated calls on the same queue; the median is reported. Three regimes: cold (every request's
memoised match dropped: the whole queue is re-matched, as SGLang does every round), warm (the
same queue again: nothing changed since the last round) and churn (a scheduler round: the head
was admitted and one request arrived since, both reported through the policy's hooks).

Run: ``.venv/bin/python bench/policy_bench.py [--json PATH] [--compat sglang] [--queues 64 2048]``.
``--compat sglang`` scores with ``match_prefix`` like SGLang (the cap is lifted here to measure
matching cost). SGLang 0.5.23 reference with its 128 cap lifted, at 2,048 waiting requests: lpm
83-92 ms/call, dfs-weight 79-121 ms, hrrn 85-94 ms, shortest-prefill-first 83-98 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import NamedTuple

import numpy as np
from radixsched.policy import SchedulePolicy
from rich.console import Console
from rich.table import Table

from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.request import Req

GROUPS = 200
PER_GROUP = 50
PREFIX_LEN = 2000
SUFFIX_LEN = 200
VOCAB = 128_000
POLICIES = ("fcfs", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
QUEUES = (64, 128, 512, 2048, 8192)


class Row(NamedTuple):
    policy: str
    queue: int
    ms_per_call: float  # cold: the whole queue re-matched, comparable to SGLang's per round
    warm_ms_per_call: float  # steady state: matches memoised per unchanged cache subtree
    churn_ms_per_call: float  # steady state with one admission and one arrival per round


def build(seed: int = 0) -> tuple[RadixCache, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, VOCAB, size=(GROUPS, PREFIX_LEN), dtype=np.int32)
    suffixes = rng.integers(0, VOCAB, size=(GROUPS * PER_GROUP, SUFFIX_LEN), dtype=np.int32)
    cache = RadixCache(None, page_size=1)
    slot = 1
    for i in rng.permutation(GROUPS * PER_GROUP):
        seq = np.concatenate([prefixes[i // PER_GROUP], suffixes[i]])
        cache.insert(CacheKey(seq), np.arange(slot, slot + len(seq), dtype=np.int64))
        slot += len(seq)
    return cache, prefixes, rng


def waiting(n: int, prefixes: np.ndarray, rng: np.random.Generator) -> list[Req]:
    groups = rng.integers(0, GROUPS, size=n)
    suffixes = rng.integers(0, VOCAB, size=(n, SUFFIX_LEN), dtype=np.int32)
    return [
        Req(f"w{i}", np.concatenate([prefixes[g], suffixes[i]]), arrival_time=float(i))
        for i, g in enumerate(groups)
    ]


def time_policy(
    name: str,
    cache: RadixCache,
    queue: list[Req],
    compat: str,
    budget_s: float,
    mode: str,
    arrivals: list[Req] | None = None,
) -> float:
    """Median ms per call. ``mode`` "cold": every request's memoised match is dropped before
    each call, so each call re-matches the whole queue against the tree (what SGLang does every
    round); "warm": the steady state between rounds in which most cache subtrees did not
    change; "churn": warm, plus the queue's head leaves and one of ``arrivals`` joins before
    each call, through the hooks the scheduler calls."""
    config = SchedulerConfig(
        schedule_policy=name,
        compat=compat,  # type: ignore[arg-type]
        max_prefix_match_queue=1 << 30 if compat == "sglang" else None,
    )
    policy = SchedulePolicy(config, cache)
    q = list(queue)
    for r in q:
        policy.on_enqueue(r)
    policy.calc_priority(q, [], 0, 0.0)  # warm-up (dfs-weight's first matches split nodes)
    pending = list(arrivals or [])
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 5 or (time.perf_counter() - start < budget_s and len(samples) < 200):
        if mode == "cold":
            for r in q:
                policy.forget(r)  # drop its memoised match: re-matched this call
        elif mode == "churn" and pending:
            policy.on_dequeue(q[0])
            del q[0]
            q.append(pending.pop())
            policy.on_enqueue(q[-1])
        t0 = time.perf_counter()
        policy.calc_priority(q, [], 10_000, 1.0)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write {'rows': [...]} here")
    ap.add_argument("--compat", default="radixsched", choices=["radixsched", "sglang"])
    ap.add_argument("--queues", type=int, nargs="+", default=list(QUEUES))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--budget-s", type=float, default=1.0, help="timing budget per cell")
    args = ap.parse_args()

    console = Console()
    t0 = time.perf_counter()
    cache, prefixes, rng = build()
    console.print(
        f"cache: {cache.total_size():,} tokens, {cache.num_nodes():,} nodes, built in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    queues = {n: waiting(n, prefixes, rng) for n in args.queues}
    arrivals = waiting(200, prefixes, rng)
    rows: list[Row] = []
    gc.collect()
    gc.disable()
    try:
        for name in args.policies:
            for n, queue in queues.items():
                rows.append(
                    Row(
                        name,
                        n,
                        *(
                            time_policy(
                                name, cache, queue, args.compat, args.budget_s, mode, arrivals
                            )
                            for mode in ("cold", "warm", "churn")
                        ),
                    )
                )
    finally:
        gc.enable()

    table = Table(
        title=f"calc_priority, median ms per call, cold (re-match all) / warm (memo) / churn "
        f"(one admission, one arrival) (compat={args.compat})"
    )
    table.add_column("policy")
    for n in args.queues:
        table.add_column(f"{n:,}", justify="right")
    table.add_column("us/request @max cold", justify="right")
    for name in args.policies:
        cold = {r.queue: r.ms_per_call for r in rows if r.policy == name}
        warm = {r.queue: r.warm_ms_per_call for r in rows if r.policy == name}
        churn = {r.queue: r.churn_ms_per_call for r in rows if r.policy == name}
        big = max(args.queues)
        table.add_row(
            name,
            *(f"{cold[n]:.2f} / {warm[n]:.2f} / {churn[n]:.2f}" for n in args.queues),
            f"{cold[big] * 1e3 / big:.2f}",
        )
    console.print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [r._asdict() for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
