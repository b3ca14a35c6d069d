"""Per-call cost of the KV allocator and of radix-cache walks and eviction (the simulator's hot
path).

Allocator: a pool of 889,619 tokens (the Mooncake simulation's), its free list shuffled
(everything allocated, then freed back in seeded random page order, 4,096 pages per call), then
``free`` of the oldest of 32 outstanding blocks followed by ``alloc`` of a new one, so the
gathers and scatters touch memory all over the pool. Sizes are token counts (whole pages); leaf
lengths below are rounded up to whole pages.

Eviction: a full pool (nothing free) whose cache holds many unlocked leaves under shared
prefixes, then repeated ``evict(n)`` (each followed by ``alloc(n)`` of the freed room, as the
scheduler's ``_alloc`` does, outside the timer):

- ``evict(8192), 1024-token leaves``: several whole leaves (a group's leaves, then its
  4,096-token prefix once that became a leaf), freed in one call.
- ``evict(8192), 3000-token leaves``: whole leaves and usually a partial cut of the last one.
- ``evict(128), 8192-token leaves``: the decode pattern, a partial cut of one large leaf.

Tree walks on a cache of 64 unrelated 16,384-token prompts, each cached as two 8,192-token
nodes (a chunked prefill's checkpoints), with 16,384-token queries (int32, contiguous):

- ``match_len``/``touch_prefix``/``match_prefix``, miss: the first page is not cached.
- the same, partial: the query shares the first 1,024 tokens of a cached prompt (the first
  ``touch_prefix`` splits that node, so later calls walk a 1,024-token node, then miss).
- the same, full: the query is a cached prompt.
- ``checkpoint insert``: the scheduler's ``_checkpoint`` pattern, ``insert`` of a 16,384-token
  key whose first 8,192 tokens are cached (one new 8,192-token leaf; nothing duplicated, so the
  scheduler needs no re-match); slot bookkeeping and the eviction of the new leaf happen
  outside the timer.

Each row reports the best of ``--repeat`` runs (default 5) of the mean microseconds per call.

Run: ``.venv/bin/python bench/cache_micro_bench.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import numpy as np

from radixsched.cache import CacheKey, RadixCache, TokenAllocator

POOL = 889_619
OUTSTANDING = 32


def shuffled_allocator(page_size: int, seed: int = 0) -> TokenAllocator:
    a = TokenAllocator(POOL, page_size=page_size)
    everything = a.alloc(a.total_size)
    assert everything is not None
    pages = everything.reshape(-1, page_size)
    order = np.random.default_rng(seed).permutation(len(pages))
    for i in range(0, len(order), 4096):
        a.free(pages[order[i : i + 4096]].reshape(-1))
    return a


def time_calls(fn: Callable[[], None], calls: int) -> float:
    """Mean microseconds per ``fn()`` over ``calls`` calls, GC off."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e6
    finally:
        gc.enable()


def bench_alloc_free(page_size: int, size: int, calls: int) -> tuple[float, float]:
    """(free us, alloc us) per call."""
    a = shuffled_allocator(page_size)
    blocks: list[np.ndarray] = []
    for _ in range(OUTSTANDING):
        x = a.alloc(size)
        assert x is not None
        blocks.append(x)
    free_t = 0.0
    alloc_t = 0.0
    gc.collect()
    gc.disable()
    try:
        perf = time.perf_counter
        for i in range(calls):
            j = i % OUTSTANDING
            t0 = perf()
            a.free(blocks[j])
            t1 = perf()
            x = a.alloc(size)
            t2 = perf()
            assert x is not None
            blocks[j] = x
            free_t += t1 - t0
            alloc_t += t2 - t1
    finally:
        gc.enable()
    return free_t / calls * 1e6, alloc_t / calls * 1e6


def full_cache(page_size: int, leaf_len: int, prefix_len: int, fanout: int) -> RadixCache:
    """A full pool whose cache holds ``prefix + leaf`` sequences: groups of ``fanout`` leaves
    under a shared prefix (the prefix nodes become leaves once their children are gone)."""
    p = page_size
    leaf_len = -(-leaf_len // p) * p
    a = TokenAllocator(POOL, page_size=p)
    cache = RadixCache(a, page_size=p)
    rng = np.random.default_rng(1)
    per_group = prefix_len + fanout * leaf_len
    # The last insert of a group briefly holds a duplicate prefix: keep room for it.
    for _ in range((a.total_size - prefix_len) // per_group):
        prefix = rng.integers(0, 128_000, size=prefix_len, dtype=np.int32)
        for _ in range(fanout):
            tokens = np.concatenate([prefix, rng.integers(0, 128_000, leaf_len, dtype=np.int32)])
            slots = a.alloc(prefix_len + leaf_len)
            assert slots is not None
            res = cache.insert(CacheKey(tokens), slots)
            a.free(slots[: res.prefix_len])
            a.free(slots[prefix_len + leaf_len :])
    rest = a.alloc(a.available_size())
    assert rest is not None and a.available_size() == 0
    return cache


def _time_evictions(page_size: int, n: int, leaf_len: int, calls: int, mode: str) -> float:
    """us per call on a full pool of ``mode``: "evict" (``evict(n)`` alone, the refilling
    ``alloc`` untimed), "evict+alloc" (both timed) or "reclaim+recycle" (``evict_reclaim`` then
    ``recycle_into`` a row buffer: the scheduler's ``_alloc_into`` when the free list is empty,
    the evicted slots skipping the round trip through the free list and written straight into
    the request's row)."""
    cache = full_cache(page_size, leaf_len, prefix_len=4096, fanout=4)
    a = cache.allocator
    assert isinstance(a, TokenAllocator)
    need = -(-n // page_size) * page_size
    total = 0.0
    gc.collect()
    gc.disable()
    try:
        perf = time.perf_counter
        for _ in range(calls):
            t0 = perf()
            if mode == "reclaim+recycle":
                row = np.empty(need, dtype=np.int64)
                got = row if a.recycle_into(cache.evict_reclaim(need), row) else None
            else:
                cache.evict(need)
                if mode == "evict":
                    total += perf() - t0
                got = a.alloc(need)
            if mode != "evict":
                total += perf() - t0
            assert got is not None
    finally:
        gc.enable()
    cache.check_integrity()
    return total / calls * 1e6


def bench_evict(page_size: int, n: int, leaf_len: int, calls: int) -> float:
    return _time_evictions(page_size, n, leaf_len, calls, "evict")


def walk_cache(page_size: int) -> tuple[RadixCache, list[np.ndarray]]:
    """64 cached 16,384-token prompts, each as two 8,192-token nodes."""
    a = TokenAllocator(64 * 16_384 + 8 * 16_384, page_size=page_size)
    cache = RadixCache(a, page_size=page_size)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 128_000, 16_384, dtype=np.int32) for _ in range(64)]
    for t in prompts:
        for end in (8192, 16_384):
            slots = a.alloc(end)
            assert slots is not None
            res = cache.insert(CacheKey(t[:end]), slots)
            a.free(slots[: res.prefix_len])
    return cache, prompts


def bench_walks(page_size: int, calls: int) -> dict[str, float]:
    cache, prompts = walk_cache(page_size)
    rng = np.random.default_rng(3)
    miss = CacheKey(rng.integers(0, 128_000, 16_384, dtype=np.int32))
    partial = CacheKey(np.concatenate([prompts[0][:1024], miss.tokens[1024:]]))
    full = CacheKey(prompts[1].copy())
    out: dict[str, float] = {}
    for label, key in (("miss", miss), ("partial", partial), ("full", full)):
        out[f"match_len, {label}"] = time_calls(lambda k=key: cache.match_len(k), calls)
        out[f"touch_prefix, {label}"] = time_calls(lambda k=key: cache.touch_prefix(k), calls)
        out[f"match_prefix, {label}"] = time_calls(lambda k=key: cache.match_prefix(k), calls)
    out["checkpoint insert"] = bench_checkpoint(cache, prompts, calls)
    return out


def bench_evict_alloc(page_size: int, n: int, leaf_len: int, calls: int) -> tuple[float, float]:
    """(evict then alloc, evict_reclaim then recycle_into) us per ``n``-slot allocation."""
    return (
        _time_evictions(page_size, n, leaf_len, calls, "evict+alloc"),
        _time_evictions(page_size, n, leaf_len, calls, "reclaim+recycle"),
    )


def bench_checkpoint(cache: RadixCache, prompts: list[np.ndarray], calls: int) -> float:
    """Insert ``cached 8,192-token prefix + fresh 8,192 tokens``. Every cached
    prompt is locked, so the untimed ``evict(8192)`` after each call removes exactly the new
    leaf and every call does the same work."""
    a = cache.allocator
    assert isinstance(a, TokenAllocator)
    rng = np.random.default_rng(4)
    tails = [rng.integers(0, 128_000, 8192, dtype=np.int32) for _ in range(16)]
    locked = [cache.match_prefix(CacheKey(t)).last_node for t in prompts]
    for node in locked:
        cache.inc_lock_ref(node)
    total = 0.0
    gc.collect()
    gc.disable()
    try:
        perf = time.perf_counter
        for i in range(calls):
            prefix = prompts[i % len(prompts)][:8192]
            key = CacheKey(np.concatenate([prefix, tails[i % len(tails)]]))
            row = np.empty(16_384, dtype=np.int64)
            row[:8192] = cache.match_prefix(CacheKey(prefix)).indices  # the cache's slots
            got = a.alloc(8192)
            assert got is not None
            row[8192:] = got
            t0 = perf()
            last = cache.insert(key, row).last_node
            total += perf() - t0
            assert last.parent is not None and not last.children
            assert cache.evict(8192) == 8192 and last.parent is None
    finally:
        gc.enable()
    for node in locked:
        cache.dec_lock_ref(node)
    cache.check_integrity()
    return total / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per row; best mean is reported")
    args = ap.parse_args(argv)
    reps = max(args.repeat, 1)

    print(f"{'allocator':<34}{'free us':>10}{'alloc us':>10}")
    for p, sizes in ((1, (1, 16, 8192)), (16, (16, 256, 8192))):
        for size in sizes:
            calls = 4000 if size < 8192 else 1000
            runs = [bench_alloc_free(p, size, calls) for _ in range(reps)]
            f = min(r[0] for r in runs)
            al = min(r[1] for r in runs)
            print(f"{f'page {p:>2}, {size:>5} tokens':<34}{f:>10.2f}{al:>10.2f}")

    print(f"\n{'tree walks (16,384-token keys)':<34}{'page 1 us':>10}{'page 16 us':>11}")
    walks = {p: [bench_walks(p, 2000) for _ in range(reps)] for p in (1, 16)}
    for label in walks[1][0]:
        t1 = min(r[label] for r in walks[1])
        t16 = min(r[label] for r in walks[16])
        print(f"{label:<34}{t1:>10.2f}{t16:>11.2f}")

    print(f"\n{'eviction (full pool)':<34}{'evict us':>10}")
    for p in (1, 16):
        for n, leaf_len, calls in ((8192, 1024, 60), (8192, 3000, 60), (128, 8192, 2000)):
            t = min(bench_evict(p, n, leaf_len, calls) for _ in range(reps))
            label = f"page {p:>2}, evict({n}), {leaf_len}-tok leaves"
            print(f"{label:<34}{t:>10.2f}")

    print(f"\n{'evict to allocate (full pool)':<34}{'+alloc us':>10}{'reclaim us':>11}")
    for p in (1, 16):
        runs = [bench_evict_alloc(p, 8192, 3000, 60) for _ in range(reps)]
        plain = min(r[0] for r in runs)
        fused = min(r[1] for r in runs)
        print(f"{f'page {p:>2}, 8192 slots':<34}{plain:>10.2f}{fused:>11.2f}")


if __name__ == "__main__":
    main()
