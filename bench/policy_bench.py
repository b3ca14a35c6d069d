"""Waiting-queue round micro-benchmark: milliseconds per prefill round's policy work.

A page-1 radix cache holds 200 groups x 50 sequences (a 2,000-token group prefix plus a
200-token suffix, vocabulary 128,000, numpy ``default_rng(0)``); waiting requests are a random
group's prefix plus a fresh 200-token suffix, so each matches 2,000 tokens. ``--shared`` puts
one 512-token block (a system prompt) in front of every cached and waiting sequence: every
request then lives in one cache subtree, the shape that made release 0.1.0 re-match the whole
queue every round.

For each policy and queue length, the median over repeated calls of:

- **reference**: ``WaitingQueue.begin_round`` (the reference core: every request matched and
  the queue ordered every round, as SGLang does);
- **cold**: the accelerated queue (``NativeWaitingQueue``) after every memo was dropped (as a
  cache reset does): every request re-matched and the queue ordered from scratch;
- **warm**: the accelerated queue's next round with nothing changed;
- **churn**: one admission (the head leaves) and one arrival since the last round, the
  simulator's typical round (arrivals come after everything waiting, in arrival order);
- **burst**: a new accelerated queue's first round after all of them arrived at once (each
  matched as it arrives, then the dedup and the order built), arrivals included.

The table's foot gives a floor for any exact first match of 2,048 requests on this machine:
one numpy pass comparing the tokens such a match must read (each request's matched tokens
against the cache's copy, two 20 MB arrays), with no per-request work at all.

SGLang 0.5.23 with its 128-request cap lifted took 70 ms per lpm round at 2,048 waiting
requests on this machine kind (issue "One readable scheduling core"). The cold lpm round at
2,048 waiting (``--queues 2048 --policies lpm``) read 2.55-2.73 ms shared (26-27x SGLang) and
2.06-2.54 ms without ``--shared`` (28-34x) at load 3-4 on 2026-12-06, 4.35-4.53 and 3.89-4.10 ms
before the matcher's batched walks in the same minutes (docs/benchmarks).

Run: ``.venv/bin/python bench/policy_bench.py [--shared] [--queues 512 2048] [--policies ...]
[--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from rich.console import Console
from rich.table import Table

from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.queue import WaitingQueue
from radixsched.request import Req

GROUPS, PER_GROUP, PREFIX_LEN, SUFFIX_LEN, SHARED_LEN = 200, 50, 2000, 200, 512
VOCAB = 128_000
POLICIES = ("fcfs", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first", "fair")
QUEUES = (512, 2048, 8192)
SGLANG_LPM_2048_MS = 70.0


class Row(NamedTuple):
    policy: str
    queue: int
    reference_ms: float
    cold_ms: float
    warm_ms: float
    churn_ms: float
    burst_ms: float


class Setup(NamedTuple):
    cache: RadixCache  # the reference queue's
    native: NativeRadixCache  # the fast queue's: the same tree in C++
    prefixes: np.ndarray
    head: np.ndarray  # the shared block (empty without --shared)
    rng: np.random.Generator


def build(shared: bool, seed: int = 0) -> Setup:
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, VOCAB, size=(GROUPS, PREFIX_LEN), dtype=np.int32)
    suffixes = rng.integers(0, VOCAB, size=(GROUPS * PER_GROUP, SUFFIX_LEN), dtype=np.int32)
    head = rng.integers(0, VOCAB, size=SHARED_LEN if shared else 0, dtype=np.int32)
    cache, native = RadixCache(None, page_size=1), NativeRadixCache(None, page_size=1)
    slot = 1
    for i in rng.permutation(GROUPS * PER_GROUP):
        seq = np.concatenate([head, prefixes[i // PER_GROUP], suffixes[i]])
        for tree in (cache, native):
            tree.insert(CacheKey(seq), np.arange(slot, slot + len(seq), dtype=np.int64))
        slot += len(seq)
    return Setup(cache, native, prefixes, head, rng)


def waiting(n: int, s: Setup, tag: str, first_arrival: float = 0.0) -> list[Req]:
    groups = s.rng.integers(0, GROUPS, size=n)
    suffixes = s.rng.integers(0, VOCAB, size=(n, SUFFIX_LEN), dtype=np.int32)
    return [
        Req(
            f"{tag}{i}",
            np.concatenate([s.head, s.prefixes[g], suffixes[i]]),
            arrival_time=first_arrival + i,
        )
        for i, g in enumerate(groups)
    ]


def _fresh(reqs: list[Req]) -> list[Req]:
    return [Req(r.rid, r.prompt_ids, arrival_time=r.arrival_time) for r in reqs]


def _median_ms(fn: Callable[[], object], budget_s: float) -> float:
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 5 or (time.perf_counter() - start < budget_s and len(samples) < 200):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def time_policy(name: str, s: Setup, queue: list[Req], arrivals: list[Req], budget_s: float) -> Row:
    cfg = SchedulerConfig(schedule_policy=name)
    ref = WaitingQueue(cfg, s.cache)
    for r in _fresh(queue):
        ref.add(r)
    ref.begin_round([], 0, 0.0)  # the first round settles the list's order
    reference = _median_ms(lambda: ref.begin_round([], 10_000, 1.0), budget_s)

    fast = NativeWaitingQueue(cfg, s.native)
    for r in _fresh(queue):
        fast.add(r)
    fast.begin_round([], 0, 0.0)

    def cold() -> None:
        if fast.matcher is not None:
            fast.matcher.on_reset()  # every memo dropped: every request re-matched
        fast.synced = fast.matched = False  # the dedup and the order rebuilt
        fast.begin_round([], 10_000, 1.0)

    cold_ms = _median_ms(cold, budget_s)
    fast.begin_round([], 0, 0.0)
    warm_ms = _median_ms(lambda: fast.begin_round([], 10_000, 1.0), budget_s)
    pending = _fresh(arrivals)[::-1]  # popped from the end: in arrival order

    def churn() -> None:
        if pending:
            fast.take([0])
            fast.add(pending.pop())
        fast.begin_round([], 10_000, 1.0)

    churn_ms = _median_ms(churn, budget_s)
    s.native.listener = None  # the last fast queue stops listening
    return Row(name, len(queue), reference, cold_ms, warm_ms, churn_ms, _burst_ms(cfg, s, queue))


def _burst_ms(cfg: SchedulerConfig, s: Setup, queue: list[Req], samples: int = 7) -> float:
    """Median ms of a new fast queue's arrivals plus its first round (fresh requests each)."""
    times = []
    for _ in range(samples):
        reqs = _fresh(queue)
        t0 = time.perf_counter()
        fast = NativeWaitingQueue(cfg, s.native)
        for r in reqs:
            fast.add(r)
        fast.begin_round([], 10_000, 1.0)
        times.append(time.perf_counter() - t0)
        s.native.listener = None
    return statistics.median(times) * 1e3


def floor_ms(s: Setup, n: int, repeat: int = 7) -> float:
    """Median ms of one numpy pass over the tokens an exact first match of ``n`` waiting
    requests reads: each one's matched prefix and the cache's copy of it."""
    matched = len(s.head) + PREFIX_LEN
    a = np.concatenate([s.head[None, :].repeat(GROUPS, 0), s.prefixes], axis=1)
    mine = a[s.rng.integers(0, GROUPS, size=n)]  # the requests' prefixes, n x matched
    cached = mine.copy()
    assert mine.shape == (n, matched)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.array_equal(mine, cached)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", action="store_true", help="one shared first block for all")
    ap.add_argument("--queues", type=int, nargs="+", default=list(QUEUES))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--budget-s", type=float, default=1.0, help="timing budget per cell")
    ap.add_argument("--json", help="write {'rows': [...]} here")
    args = ap.parse_args()
    console = Console()
    t0 = time.perf_counter()
    s = build(args.shared)
    console.print(f"cache: {s.cache.total_size():,} tokens, {s.cache.num_nodes():,} nodes "
                  f"(shared first block: {args.shared}), built in "
                  f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    queues = {n: waiting(n, s, "w") for n in args.queues}
    # Arrivals come after everything waiting, as a server's do (earlier ones would put fcfs's
    # list out of arrival order every round and re-sort it).
    arrivals = waiting(200, s, "a", first_arrival=float(max(args.queues)))
    rows: list[Row] = []
    gc.collect()
    gc.disable()
    try:
        for name in args.policies:
            for queue in queues.values():
                rows.append(time_policy(name, s, queue, arrivals, args.budget_s))
    finally:
        gc.enable()
    title = "policy round, median ms: reference / fast cold / warm / churn / burst"
    table = Table(title=title + (" (shared first block)" if args.shared else ""))
    table.add_column("policy")
    for n in args.queues:
        table.add_column(f"{n:,} waiting", justify="right")
    for name in args.policies:
        cells = {r.queue: r for r in rows if r.policy == name}
        table.add_row(name, *(
            f"{c.reference_ms:.2f} / {c.cold_ms:.2f} / {c.warm_ms:.3f} / {c.churn_ms:.3f} / "
            f"{c.burst_ms:.2f}"
            for c in (cells[n] for n in args.queues)
        ))  # fmt: skip
    console.print(table)
    lpm = [r for r in rows if r.policy == "lpm" and r.queue == 2048]
    if lpm:
        r = lpm[0]
        console.print(f"lpm at 2,048 waiting vs SGLang 0.5.23 ({SGLANG_LPM_2048_MS:.0f} ms): "
                      f"reference {SGLANG_LPM_2048_MS / r.reference_ms:.1f}x, fast cold "
                      f"{SGLANG_LPM_2048_MS / r.cold_ms:.1f}x, burst "
                      f"{SGLANG_LPM_2048_MS / r.burst_ms:.1f}x, churn "
                      f"{SGLANG_LPM_2048_MS / r.churn_ms:,.0f}x faster")  # fmt: skip
        floor = floor_ms(s, 2048)
        console.print(f"floor for an exact first match of 2,048 (one numpy pass over the "
                      f"tokens it reads): {floor:.2f} ms = {SGLANG_LPM_2048_MS / floor:.0f}x "
                      "SGLang")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shared": args.shared, "rows": [r._asdict() for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
