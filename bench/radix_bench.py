"""Radix cache micro-benchmark: insert, match, match_len and evict-half throughput.

Workload (deterministic, numpy ``default_rng(0)``): 200 groups x 50 requests; each sequence is a
2,000-token group prefix plus a 200-token unique suffix over a 128,000-token vocabulary, in a
seeded shuffled order. Per page size: insert all 10,000 sequences (values are fresh allocator
slots, allocated before the timer starts; duplicates are freed after it stops), then
``match_prefix`` each, then ``match_len`` each, then ``evict(total_size() // 2)``.
Throughput counts the page-aligned key tokens of every call. Each page size runs ``--repeat``
times on a fresh cache (default 3) and the best value of each metric is reported.

Run: ``.venv/bin/python bench/radix_bench.py [--json PATH] [--page-sizes 1 16] [--tree T]
[--clock wall|cpu]``; ``--tree native`` (the default where the native core is built) times the
C++ tree through its Python face (``NativeRadixCache``), ``--tree python`` the Python reference
tree, ``--tree sglang-rust --sglang-tree-core SO`` SGLang 0.5.23's Rust tree core, from its
wheel, as its adapter calls it (``bench/sglang_rust_tree.py``: its ``match`` is the walk plus the
slots, ``collect_full_device_indices``; its ``match_len`` the walk alone, lengths and node ids;
eviction not timed). ``--clock cpu`` times this thread's CPU time instead of wall time.

Measured 2026-12-06 09:51-10:04 UTC, load average 2.7-5.4, the three trees' runs alternated in
the same minutes (``--tree native`` at commit a605db8; before: dab3a53): with ``--clock cpu``
(median of 5) match_prefix 335k / 336k seq/s at page 1 / 16 (before: 297k / 300k), SGLang's
Rust tree core's walk + slots 107k / 110k: 3.12x / 3.07x (before: 2.76x / 2.74x); on the wall
clock (median of 10) 330k / 313k against 79k / 84k (4.2x / 3.7x; the load slowed the Rust core
more). Insert (136k / 155k), match_len (375k / 380k) and evict half (18 / 12 ms) did not change.
SGLang's Python tree (measured 2026-11-30, not again): inserts 18.8k seq/s, matches 26.3k,
evicts half in 62 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import numpy as np
from rich.console import Console
from rich.table import Table

from radixsched.cache import CacheKey, RadixCache, TokenAllocator
from radixsched.native import core
from radixsched.native.radix import NativeRadixCache

GROUPS = 200
PER_GROUP = 50
PREFIX_LEN = 2000
SUFFIX_LEN = 200
VOCAB = 128_000


# The timers' clock (--clock): wall time, or this thread's CPU time, which a shared, loaded
# machine's other processes do not inflate (they still share its caches and memory bandwidth).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock: list[Callable[[], float]] = [time.perf_counter]


def now() -> float:
    return _clock[0]()


class Row(NamedTuple):
    page_size: int
    insert_tokens_per_s: float
    insert_seqs_per_s: float
    match_tokens_per_s: float
    match_seqs_per_s: float
    match_len_tokens_per_s: float
    match_len_seqs_per_s: float
    evict_half_s: float
    evicted_tokens: int
    tree_tokens: int


def _row(
    p: int,
    n: int,
    n_tok: int,
    times: tuple[float, float, float],
    t_evict: float,
    evicted: int,
    tree_tokens: int,
) -> Row:
    """A row from the insert, match and match_len timings of ``n`` sequences of ``n_tok`` tokens."""
    t_insert, t_match, t_match_len = times
    return Row(
        page_size=p,
        insert_tokens_per_s=n_tok / t_insert,
        insert_seqs_per_s=n / t_insert,
        match_tokens_per_s=n_tok / t_match,
        match_seqs_per_s=n / t_match,
        match_len_tokens_per_s=n_tok / t_match_len,
        match_len_seqs_per_s=n / t_match_len,
        evict_half_s=t_evict,
        evicted_tokens=evicted,
        tree_tokens=tree_tokens,
    )


def make_workload(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, VOCAB, size=(GROUPS, PREFIX_LEN), dtype=np.int32)
    suffixes = rng.integers(0, VOCAB, size=(GROUPS * PER_GROUP, SUFFIX_LEN), dtype=np.int32)
    seqs = [
        np.concatenate([prefixes[i // PER_GROUP], suffixes[i]]) for i in range(GROUPS * PER_GROUP)
    ]
    order = rng.permutation(len(seqs))
    return [seqs[i] for i in order]


def run(page_size: int, seqs: list[np.ndarray], tree: type[RadixCache | NativeRadixCache]) -> Row:
    p = page_size
    padded = -(-(PREFIX_LEN + SUFFIX_LEN) // p) * p
    allocator = TokenAllocator(len(seqs) * padded, page_size=p)
    cache = tree(allocator, page_size=p)
    keys = [CacheKey(s) for s in seqs]
    aligned = (len(seqs[0]) // p) * p
    values = []
    for _ in seqs:
        v = allocator.alloc(padded)
        assert v is not None
        values.append(v)
    n_tok = aligned * len(seqs)

    gc.collect()
    gc.disable()
    try:
        t0 = now()
        results = [cache.insert(k, v) for k, v in zip(keys, values, strict=True)]
        t_insert = now() - t0

        t0 = now()
        matched = [cache.match_prefix(k).device_len for k in keys]
        t_match = now() - t0

        t0 = now()
        matched_len = [cache.match_len(k) for k in keys]
        t_match_len = now() - t0
    finally:
        gc.enable()
    assert matched == matched_len == [aligned] * len(seqs), "every sequence must match whole"

    # Duplicates and the unaligned tail page go back to the allocator (outside the timers).
    for r, v in zip(results, values, strict=True):
        allocator.free(v[: r.prefix_len])
        allocator.free(v[aligned:])
    tree_tokens = cache.total_size()
    allocator.check_integrity(cache_slots=cache.all_values())

    t0 = now()
    evicted = cache.evict(tree_tokens // 2)
    t_evict = now() - t0
    cache.check_integrity()
    allocator.check_integrity(cache_slots=cache.all_values())
    assert tree_tokens // 2 <= evicted < tree_tokens // 2 + p

    return _row(
        p, len(seqs), n_tok, (t_insert, t_match, t_match_len), t_evict, evicted, tree_tokens
    )


def run_sglang_rust(page_size: int, seqs: list[np.ndarray], mod: ModuleType) -> Row:
    """``run`` for SGLang's Rust tree core: the same workload and timers. Its ``match`` is the
    walk plus ``collect_full_device_indices`` (the slots, as ``match_prefix`` returns them
    here); its ``match_len`` is the walk alone (length and node ids, the core's
    ``match_prefix``). Eviction is not timed (NaN): the core evicts node by node under the
    cache's allocator protocol, which has no counterpart here."""
    from sglang_rust_tree import RustTree

    p = page_size
    padded = -(-(PREFIX_LEN + SUFFIX_LEN) // p) * p
    tree = RustTree(mod, p)
    keys = [RustTree.key(s) for s in seqs]
    values = [RustTree.value(np.arange(i * padded, (i + 1) * padded)) for i in range(len(seqs))]
    aligned = (len(seqs[0]) // p) * p
    n_tok = aligned * len(seqs)

    gc.collect()
    gc.disable()
    try:
        t0 = now()
        for k, v in zip(keys, values, strict=True):
            tree.insert(k, v)
        t_insert = now() - t0

        t0 = now()
        matched = [len(tree.match_slots(k)) for k in keys]
        t_match = now() - t0

        t0 = now()
        matched_len = [tree.match(k).device_prefix_len for k in keys]
        t_match_len = now() - t0
    finally:
        gc.enable()
    assert matched == matched_len == [aligned] * len(seqs), "every sequence must match whole"
    times = (t_insert, t_match, t_match_len)
    return _row(p, len(seqs), n_tok, times, float("nan"), 0, tree.total_size())


def best_of(runs: list[Row]) -> Row:
    """Best value of each metric over repeated runs (the machine may be shared)."""
    return Row(
        page_size=runs[0].page_size,
        insert_tokens_per_s=max(r.insert_tokens_per_s for r in runs),
        insert_seqs_per_s=max(r.insert_seqs_per_s for r in runs),
        match_tokens_per_s=max(r.match_tokens_per_s for r in runs),
        match_seqs_per_s=max(r.match_seqs_per_s for r in runs),
        match_len_tokens_per_s=max(r.match_len_tokens_per_s for r in runs),
        match_len_seqs_per_s=max(r.match_len_seqs_per_s for r in runs),
        evict_half_s=min(r.evict_half_s for r in runs),
        evicted_tokens=runs[0].evicted_tokens,
        tree_tokens=runs[0].tree_tokens,
    )


TREES = {
    "native": "NativeRadixCache",
    "python": "RadixCache",
    "sglang-rust": "SGLang RustUnifiedTreeCore (match = walk + slots, match_len = walk)",
}


def tree_runner(
    ap: argparse.ArgumentParser, name: str, so: str | None
) -> Callable[[int, list[np.ndarray]], Row]:
    """One run per page size of the tree named ``name`` (bad flags: one error line, exit 2)."""
    if name != "sglang-rust":
        cls = NativeRadixCache if name == "native" else RadixCache
        return lambda p, seqs: run(p, seqs, cls)
    if not so or not os.path.isfile(so):
        ap.error(f"--sglang-tree-core: {so!r} is not a file (see bench/sglang_rust_tree.py)")
    from sglang_rust_tree import load

    try:
        mod = load(so)
    except ImportError as e:
        ap.error(f"--sglang-tree-core {so}: {e}")
    return lambda p, seqs: run_sglang_rust(p, seqs, mod)


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument(
        "--repeat", type=int, default=3, help="fresh runs per page size; best of each metric"
    )
    ap.add_argument(
        "--tree",
        choices=list(TREES),
        default="native" if core() is not None else "python",
        help="which radix tree (default: native when built)",
    )
    ap.add_argument(
        "--sglang-tree-core",
        metavar="SO",
        default=os.environ.get("RADIXSCHED_SGLANG_TREE_CORE"),
        help="SGLang's Rust tree core extension, for --tree sglang-rust (see sglang_rust_tree.py)",
    )
    ap.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall time (default) or this thread's CPU time (for a loaded machine)",
    )
    args = ap.parse_args(argv)
    _clock[0] = CLOCKS[args.clock]
    runner = tree_runner(ap, args.tree, args.sglang_tree_core)

    seqs = make_workload()
    rows = [best_of([runner(p, seqs) for _ in range(max(args.repeat, 1))]) for p in args.page_sizes]

    table = Table(
        title=f"{TREES[args.tree]}: {GROUPS}x{PER_GROUP} seqs, {PREFIX_LEN}+{SUFFIX_LEN} tokens"
        f" ({args.clock} clock)"
    )
    for col in (
        "page",
        "insert Mtok/s",
        "insert kseq/s",
        "match Mtok/s",
        "match kseq/s",
        "match_len Mtok/s",
        "match_len kseq/s",
        "evict half",
        "evicted tok",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.page_size),
            f"{r.insert_tokens_per_s / 1e6:.1f}",
            f"{r.insert_seqs_per_s / 1e3:.1f}",
            f"{r.match_tokens_per_s / 1e6:.1f}",
            f"{r.match_seqs_per_s / 1e3:.1f}",
            f"{r.match_len_tokens_per_s / 1e6:.1f}",
            f"{r.match_len_seqs_per_s / 1e3:.1f}",
            "—" if math.isnan(r.evict_half_s) else f"{r.evict_half_s * 1e3:.1f} ms",
            f"{r.evicted_tokens / 1e6:.2f}M",
        )
    Console(width=max(Console().width, 130)).print(table)

    if args.json:
        payload = {
            "tree": args.tree,
            "clock": args.clock,
            "rows": [
                {
                    "page_size": r.page_size,
                    "insert_tokens_per_s": r.insert_tokens_per_s,
                    "match_tokens_per_s": r.match_tokens_per_s,
                    "match_len_tokens_per_s": r.match_len_tokens_per_s,
                    "evict_half_s": None if math.isnan(r.evict_half_s) else r.evict_half_s,
                    "insert_seqs_per_s": r.insert_seqs_per_s,
                    "match_seqs_per_s": r.match_seqs_per_s,
                    "match_len_seqs_per_s": r.match_len_seqs_per_s,
                    "evicted_tokens": r.evicted_tokens,
                }
                for r in rows
            ],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
