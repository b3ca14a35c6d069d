"""Mutation check of the accelerators: does the equivalence suite notice a broken fast path?

Each mutant below is a plausible bug in ``radixsched/native``, in the native matcher
(``radixsched/_native``) or in the simulator's scalar fast paths (``sim/cost/``): a memo not
re-pointed, a flag that says "in order" when the list is not, a tie number on the wrong side, a
jump that ignores a stop... For each one, a copy of the package with that one change is put
first on ``PYTHONPATH`` (a C++ mutant's copy is built, in a few seconds, and loaded through
``RADIXSCHED_NATIVE_LIB``; the others load the built extension) and the accelerator tests run
against it (``-x``: the first failure kills the
mutant). A mutant that survives is a fast-path bug the tests would not catch: add the test that
fails on it. The source tree is never modified.

Not listed: walks that keep the last round's child cache (``walk_all`` without its
``cache.clear()``): the accelerator tests then read nodes the tree has freed and crash (a
segfault, which this check does not count as a kill). Nor is a
decode jump allowed while requests wait with the batch not full. No workload
we built tells it apart from the original (a memory failure marks the batch full, so such a
decode round follows only rounds that skipped every candidate, and none of our shapes reaches
one, nor did 4,000 draws of ``tests/test_equivalence_fuzz.py`` against it); it is a mutant the
suite cannot kill, not a proof that it is harmless. Nor are changes
that only cost time: hrrn's clamp of a negative wait (a request's entry snapshot never exceeds
the counter it is compared with) and fair's removal of a leaver from the merged list (the
round's sync check then rebuilds the order).

Run: ``.venv/bin/python dev/mutation_check.py [--only ID ...] [--list] [--tests PATHS]``
(about a minute per surviving mutant, less per killed one). Exit status 1 when one survives.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "radixsched"
TESTS = (
    "tests/test_native_optimal.py",
    "tests/test_native_prompts.py",
    "tests/test_native_select.py",
    "tests/test_native_shuffle.py",
    "tests/test_native_random_order.py",
    "tests/test_native_glue.py",
    "tests/test_native_compat_match.py",
    "tests/test_native_compat_round.py",
    "tests/test_decode_native.py",
    "tests/test_native_jump_bookkeeping.py",
    "tests/test_native_order.py",
    "tests/test_native_dfs_order.py",
    "tests/test_native_adder.py",
    "tests/test_native_admit_compat.py",
    "tests/test_native_parts.py",
    "tests/test_costmodel_fastpath.py",
    "tests/test_native_run.py",
    "tests/test_native_attr_values.py",
    "tests/test_costmodel.py",
    "tests/test_equivalence.py",
    "tests/test_golden.py",
    "tests/test_equivalence_fuzz.py",
    "tests/test_native_alloc_evicting.py",
    "tests/test_native_chunks.py",
    "tests/test_native_step.py",
    "tests/test_native_fused_step.py",
    "tests/test_arrive.py",
    "tests/test_native_take.py",
    "tests/test_native_round.py",
    "tests/test_cold_round.py",
    "tests/test_native_checkpoint_rematch.py",
    "tests/test_native_radix_slots.py",
    "tests/test_native_kv_rows.py",
    "tests/test_native_evict_free.py",
    "tests/test_native_leaf_index.py",
    "tests/test_allocator.py",
    "tests/test_deferred_prompts.py",
    "tests/test_run_inputs.py",
    "tests/test_cli_start.py",
    "tests/test_report.py",
    "tests/test_trace_reader.py",
    "tests/test_preflight.py",
    "tests/test_prompt_cache.py",
    "tests/test_native_loop.py",
    "tests/test_native_vclock.py",
    "tests/test_native_key_views.py",
    "tests/test_order_stats.py",
    "tests/test_reqarrays.py",
    "tests/test_clock.py",
    "tests/test_gapstats.py",
    "tests/test_workloads.py",
    "tests/test_policy_runs.py",
    "tests/test_metrics.py",
    "tests/test_native_counting.py",
)


class Mutant(NamedTuple):
    id: str
    file: str  # under radixsched/
    original: str  # must occur exactly once
    mutated: str


MUTANTS = (
    Mutant(
        "optimal-split-keeps-the-whole-span",
        "_native/optimal.cpp",
        "        nodes_[next].key = span.key + m;",
        "        nodes_[next].key = span.key;",
    ),
    Mutant(
        "optimal-one-namespace",
        "_native/optimal.cpp",
        "    uint32_t node = root(ns);",
        "    uint32_t node = root(0);",
    ),
    Mutant(
        "optimal-compare-stops-a-token-short",
        "_native/optimal.cpp",
        "    while (i < n && a[i] == b[i]) ++i;",
        "    while (i + 1 < n && a[i] == b[i]) ++i;",
    ),
    Mutant(
        "optimal-native-takes-any-dtype",
        "results/optimal.py",
        "    if mod is None or any(s.dtype != np.int32 for s in seqs):",
        "    if mod is None:",
    ),
    Mutant(
        "hash-tokens-from-position-zero",
        "_native/prompts.cpp",
        "            tokens(out.data(), out.shape(0), key, first, md);",
        "            tokens(out.data(), out.shape(0), key, 0, md);",
    ),
    Mutant(
        "native-core-loaded-by-every-thread-that-asks",
        "native/__init__.py",
        "            if not _loaded:\n                _loaded.append(_load())",
        "            _loaded.append(_load())",
    ),
    Mutant(
        "prompt-threads-drop-the-last-run",
        "sim/workloads/tokens.py",
        "    bounds.append(len(lengths))",
        "    bounds.append(at)",
    ),
    Mutant(
        "prompt-threads-swallow-a-failure",
        "sim/workloads/tokens.py",
        "        if e is not None:\n            raise e",
        "        if e is not None:\n            break",
    ),
    Mutant(
        "rid-hashes-forget-the-seed",
        "sim/cost/runner.py",
        '        self._seeded = hashlib.blake2b(f"{seed}/".encode(), digest_size=8)',
        '        self._seeded = hashlib.blake2b(b"0/", digest_size=8)',
    ),
    Mutant(
        "rid-hashes-never-emptied",
        "sim/cost/runner.py",
        "            self.clear()\n        state = self._seeded.copy()",
        "            pass\n        state = self._seeded.copy()",
    ),
    Mutant(
        "native-tokens-keep-a-stale-seed",
        "sim/cost/runner.py",
        "        self._recipe, self._recipe_vocab = (self._hashes(), vocab), self.vocab_size",
        "        self._recipe, self._recipe_vocab = (self._rid_hashes, vocab), self.vocab_size",
    ),
    Mutant(
        "native-prefill-timer-of-a-stale-model",
        "sim/cost/runner.py",
        "        if self.cost is self._native_for:\n            return self._native_cost[1]",
        "        if True:\n            return self._native_cost[1]",
    ),
    Mutant(
        "fcfs-round-skips-the-entry-sort",
        "native/queue.py",
        "        positions = self._reference_order(self.policy, None)",
        "        positions = iter(range(len(self.reqs)))",
    ),
    Mutant(
        "fcfs-round-keeps-the-arrivals",
        "native/queue.py",
        "        self.added, self.moved = [], {}\n        order = RoundOrder(self.reqs, positions)\n"
        "        if (",
        "        order = RoundOrder(self.reqs, positions)\n        if (",
    ),
    Mutant(
        "fcfs-round-skips-the-refresh-count",
        "native/queue.py",
        "            self._refresh_rounds += 1  # not due: ``refresh`` only counts it",
        "            pass",
    ),
    Mutant(
        "fcfs-round-for-any-order-without-engine",
        "native/queue.py",
        "            self.fast\n            and self._fcfs\n",
        "            self.fast\n",
    ),
    Mutant(
        "take-native-despite-compat-keys",
        "native/queue.py",
        "        if self._native_take is None or (m is not None and m.keys is not None):\n"
        "            return None\n        order, remove",
        "        if self._native_take is None:\n            return None\n        order, remove",
    ),
    Mutant(
        "arrivals-door-match-uncapped",
        "_native/arrive.cpp",
        "        set(r, n.num_matched_prefix_tokens, below ? matched : cap_obj);\n",
        "        set(r, n.num_matched_prefix_tokens, matched);\n",
    ),
    Mutant(
        "arrivals-share-one-arrival-number",
        "_native/arrive.cpp",
        "        seq = nb::steal(PyNumber_Add(seq.ptr(), one.ptr()));\n",
        "        seq = nb::steal(PyNumber_Add(seq.ptr(), nb::int_(0).ptr()));\n",
    ),
    Mutant(
        "track-many-reads-the-salt-as-the-key",
        "_native/module.cpp",
        "a.extra_key.get(r).is_none() && a.cache_salt.get(r).is_none();",
        "a.extra_key.get(r).is_none() && a.extra_key.get(r).is_none();",
    ),
    Mutant(
        "compat-lof-sorts-ascending",
        "native/queue.py",
        "            reqs.sort(key=_MAX_NEW, reverse=True)",
        "            reqs.sort(key=_MAX_NEW)",
    ),
    Mutant(
        "shuffle-keeps-a-draw-at-the-bound",
        "_native/mt19937.hpp",
        "    } while (r >= bound);",
        "    } while (r > bound);",
    ),
    Mutant(
        "shuffle-draws-a-bit-short",
        "_native/mt19937.hpp",
        "        r = next(mt, index) >> (32 - k);",
        "        r = next(mt, index) >> (33 - k);",
    ),
    Mutant(
        "shuffle-twist-drops-the-odd-term",
        "_native/mt19937.hpp",
        "        mt[k] = mt[(k + kShift) % kWords] ^ (y >> 1) ^ ((y & 1U) != 0 ? 0x9908b0dfU : 0U);",
        "        mt[k] = mt[(k + kShift) % kWords] ^ (y >> 1);",
    ),
    Mutant(
        "shuffle-stops-before-the-second-item",
        "_native/shuffle.cpp",
        "    for (size_t i = n; i-- > 1;) {  // i = n-1 down to 1",
        "    for (size_t i = n; i-- > 2;) {  // i = n-1 down to 1",
    ),
    Mutant(
        "lazy-shuffle-draws-for-the-last-position",
        "_native/lazy_shuffle.cpp",
        "        if (i < n_ - 1) swap_with_pick(i);",
        "        swap_with_pick(i);",
    ),
    Mutant(
        "lazy-shuffle-picks-from-the-front",
        "_native/lazy_shuffle.cpp",
        "        const int64_t j = i + mt::below(r->state, r->index, static_cast<uint32_t>(bound));",
        "        const int64_t j = mt::below(r->state, r->index, static_cast<uint32_t>(bound));",
    ),
    Mutant(
        "lazy-shuffle-swaps-only-in-place",
        "_native/lazy_shuffle.cpp",
        "        if (j == i) return;",
        "        if (j != i) return;",
    ),
    Mutant(
        "lazy-shuffle-length-at-each-read",
        "_native/lazy_shuffle.cpp",
        "        if (n_ < 0) n_ = PyList_GET_SIZE(queue_.ptr());",
        "        n_ = PyList_GET_SIZE(queue_.ptr());",
    ),
    Mutant(
        "lazy-head-reads-one-short",
        "_native/lazy_shuffle.cpp",
        "        for (int64_t i = 0; i < k; ++i) {",
        "        for (int64_t i = 0; i + 1 < k; ++i) {",
    ),
    Mutant(
        "lazy-shuffle-for-a-subclass",
        "native/queue.py",
        "        if pol.order is _RANDOM_ORDER and self._lazy_shuffle is not None and type(rng) is Random:",
        "        if pol.order is _RANDOM_ORDER and self._lazy_shuffle is not None:",
    ),
    Mutant(
        "lazy-head-without-the-draws",
        "native/queue.py",
        "        span: list[Req] = positions.head(order.queue, order._seen, REFRESH_SPAN)",
        "        span: list[Req] = order.queue[:REFRESH_SPAN]",
    ),
    Mutant(
        "take-keeps-a-tried-entry",
        "_native/round.cpp",
        "        pop_key(tried, key.ptr());\n",
        "\n",
    ),
    Mutant(
        "refresh-touches-first-to-last",
        "_native/round.cpp",
        "            touch_fill(t, PySequence_Fast_GET_ITEM(items.ptr(), i), ns_of, plain, joined);",
        "            touch_fill(t, PySequence_Fast_GET_ITEM(items.ptr(), PySequence_Fast_GET_SIZE("
        "items.ptr()) - 1 - i), ns_of, plain, joined);",
    ),
    Mutant(
        "take-deletes-lowest-position-first",
        "_native/round.cpp",
        "    std::sort(at.begin(), at.end(), [](Py_ssize_t a, Py_ssize_t b) { return a > b; });",
        "    std::sort(at.begin(), at.end(), [](Py_ssize_t a, Py_ssize_t b) { return a < b; });",
    ),
    Mutant(
        "continuation-end-off-the-pages",
        "_native/chunks.cpp",
        "        const int64_t end = floor_page(prefix_len + len, b.page);",
        "        const int64_t end = prefix_len + len;",
    ),
    Mutant(
        "extend-run-forgets-cached-prompt-tokens",
        "_native/prefill.cpp",
        "                cached_sum += std::min(cached, prompt);",
        "                cached_sum += 0;",
    ),
    Mutant(
        "common-prefix-skips-a-token",
        "_native/adder.cpp",
        "        i += kBlock;",
        "        i += kBlock + 1;",
    ),
    Mutant(
        "refresh-touches-nothing",
        "_native/round.cpp",
        "        t->touch_at(*memo->node, memo->full ? memo->node->size() : memo->offset);",
        "        (void)t;",
    ),
    Mutant(
        "tried-match-not-restored",
        "_native/round.cpp",
        "        for (const nb::object& r : values_of(tried)) set_matched(m, r.ptr());\n",
        "\n",
    ),
    Mutant(
        "round-flipped-not-rekeyed",
        "_native/round.cpp",
        "        if (!fresh.has(items_of(flipped.ptr())[i])) changed.push_back(items_of(flipped.ptr())[i]);",
        "        (void)i;",
    ),
    Mutant(
        "in-sync-ignores-the-arrivals",
        "_native/round.cpp",
        "    return same_items(members, q, 0, n) && same_items(added.ptr(), q, n, na);",
        "    return same_items(members, q, 0, n);",
    ),
    Mutant(
        "take-bypasses-a-subclass-del",
        "_native/round.cpp",
        "    if (i < 0 || i >= n || !PyList_CheckExact(list)) {",
        "    if (i < 0 || i >= n) {",
    ),
    Mutant(
        "walk-block-skips-a-token",
        "_native/matcher_walk.cpp",
        "    while (m + kBlock <= n && std::memcmp(tokens + m, key + m, kBlock * sizeof(int32_t)) == 0)",
        "    while (m + kBlock <= n && std::memcmp(tokens + m, key + m, (kBlock - 1) * 4) == 0)",
    ),
    Mutant(
        "entry-order-kept-after-requeue",
        "native/queue.py",
        "        self.entry_ordered = ordered and self._fit_entry_order(reqs, placed)",
        "        self.entry_ordered = ordered",
    ),
    Mutant(
        "arrival-order-assumed-after-requeue",
        "native/queue.py",
        "        self._arrival_known = placed\n",
        "        self._arrival_known = True\n",
    ),
    Mutant(
        "admission-end-ignores-cap",
        "native/queue.py",
        "        extra = m.n - cap  # the whole fill is cached: step back to the cap",
        "        extra = 0",
    ),
    Mutant(
        "requeue-placed-one-early",
        "native/queue.py",
        "            elif engine.place(r, j):",
        "            elif engine.place(r, max(j - 1, 0)):",
    ),
    Mutant(
        "dfs-placed-request-not-a-member",
        "_native/dfs_order.cpp",
        "    if (!order_.place(r, j)) return false;\n    join(r.ptr(), false, 0);",
        "    if (!order_.place(r, j)) return false;",
    ),
    Mutant(
        "fair-placed-one-late",
        "native/orders.py",
        "        if not order.place(r, j):\n            return False\n        self.tenant_of",
        "        if not order.place(r, min(j + 1, len(order))):\n            return False\n"
        "        self.tenant_of",
    ),
    Mutant(
        "split-not-repointed",
        "_native/matcher.cpp",
        "        if (m.node.get() != &lower || dirty_.has(e)) continue;",
        "        continue;",
    ),
    Mutant(
        "partial-evict-ignored",
        "_native/matcher.cpp",
        "        if (e.memo.full || e.memo.offset >= keep)",
        "        if (e.memo.full)",
    ),
    Mutant(
        "new-child-ignored",
        "_native/matcher.cpp",
        "    Bucket* regs = by_node->second.get(key);\n",
        "    Bucket* regs = nullptr;\n",
    ),
    Mutant(
        "shortened-hint-trusted",
        "_native/matcher.cpp",
        "(node->parent != nullptr && node->size() == hint->klen)",
        "node->parent != nullptr",
    ),
    Mutant(
        "recycle-drops-the-excess",
        "_native/pool.cpp",
        "            free_all(i, take);\n",
        "            free_all(i + 1, 0);\n",
    ),
    Mutant(
        "recycle-placed-drops-the-excess",
        "_native/pool.cpp",
        "        free(excess.data(), static_cast<int64_t>(excess.size()), false);\n",
        "\n",
    ),
    Mutant(
        "evicted-slots-not-placed",
        "_native/radix.cpp",
        "            copy_slots(begin, k, out + pos);\n",
        "            (void)0;\n",
    ),
    Mutant(
        "evicted-slots-not-placed-in-an-int32-row",
        "_native/radix.cpp",
        "            copy_slots(begin, k, out32 + pos);\n",
        "            (void)0;\n",
    ),
    Mutant(
        "row-views-always-writeable",
        "_native/kv.cpp",
        "            const int flags = PyArray_FLAGS(a) & NPY_ARRAY_WRITEABLE;",
        "            const int flags = NPY_ARRAY_WRITEABLE;",
    ),
    Mutant(
        "row-views-start-at-the-arrays-start",
        "_native/kv.cpp",
        "            char* data = PyArray_BYTES(a) + lo * strides[0];\n",
        "            char* data = PyArray_BYTES(a);\n",
    ),
    Mutant(
        "row-views-of-a-subclass-made-plain",
        "_native/kv.cpp",
        "    if (PyArray_CheckExact(obj.ptr())) {\n        auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());\n        if (PyArray_NDIM(a) == 1 && 0 <= lo",
        "    if (PyArray_Check(obj.ptr())) {\n        auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());\n        if (PyArray_NDIM(a) == 1 && 0 <= lo",
    ),
    Mutant(
        "counting-pool-keeps-a-freed-page",
        "_native/pool.cpp",
        "    first_free_ -= k;\n",
        "    first_free_ -= k - (k > 1);\n",
    ),
    Mutant(
        "counting-recycle-frees-nothing",
        "_native/pool.cpp",
        "        free_count(g);\n        return alloc_into(out, n);\n    }\n    auto free_all",
        "        return alloc_into(out, n);\n    }\n    auto free_all",
    ),
    Mutant(
        "counting-cut-leaf-counts-what-it-keeps",
        "_native/radix.cpp",
        "freed.copy(counting_ ? nullptr : leaf.value.data() + keep, cut);",
        "freed.copy(counting_ ? nullptr : leaf.value.data() + keep, cut + keep);",
    ),
    Mutant(
        "simulator-names-its-slots",
        "sim/cost/runner.py",
        "    reads_kv_slots = False",
        "    reads_kv_slots = True",
    ),
    Mutant(
        "in-batch-check-trusts-the-tail",
        "_native/adder.cpp",
        "    return std::memcmp(a, b, static_cast<size_t>(n - tail) * sizeof(int32_t)) == 0;",
        "    return true;",
    ),
    Mutant(
        "pool-frees-a-group-reversed",
        "_native/pool.cpp",
        "    for (int64_t i = 0; i < k; ++i) stack_[lo + i] = static_cast<int32_t>(pages[i]);",
        "    for (int64_t i = 0; i < k; ++i) stack_[lo + i] = static_cast<int32_t>(pages[k - 1 - i]);",
    ),
    Mutant(
        "dedup-leaver-stays",
        "_native/dedup.cpp",
        "    auto it = members_.find(at->second);\n    leave(at->second, it->second);",
        "    auto it = members_.find(at->second);\n    if (it->second.group == nullptr) leave(at->second, it->second);",
    ),
    Mutant(
        "dedup-members-by-callers-key",
        "_native/dedup.cpp",
        "    const uint64_t u = back ? was->second.first : next_uid_++;",
        "    const uint64_t u = static_cast<uint64_t>(k);",
    ),
    Mutant(
        "dedup-requeue-is-a-stranger",
        "_native/dedup.cpp",
        "    const bool back = was != gone_.end() && was->second.second == rep.rid;",
        "    const bool back = false;",
    ),
    Mutant(
        "dedup-flips-not-reported",
        "_native/dedup.cpp",
        "it->second.group != nullptr) out.flipped.push_back(it->second.k);",
        "it->second.group == nullptr) out.flipped.push_back(it->second.k);",
    ),
    Mutant(
        "dedup-rematch-ignored",
        "_native/dedup.cpp",
        "    if (m.n == n) return;",
        "    if (m.n >= 0) return;",
    ),
    Mutant(
        "grown-key-numbered-last",
        "_native/order.cpp",
        "    for (Mover& m : grew) insert(m.req, std::move(m.key), static_cast<double>(--lo_), mirror);",
        "    for (Mover& m : grew) insert(m.req, std::move(m.key), static_cast<double>(++hi_), mirror);",
    ),
    Mutant(
        "shrunk-keys-unordered",
        "_native/order.cpp",
        "    std::sort(shrank.begin(), shrank.end(), by_old);",
        "    std::reverse(shrank.begin(), shrank.end());",
    ),
    Mutant(
        "moved-grown-key-numbered-last",
        "_native/order.cpp",
        "    for (const Move& m : grew) relocate(m, static_cast<double>(--lo_));",
        "    for (const Move& m : grew) relocate(m, static_cast<double>(++hi_));",
    ),
    Mutant(
        "moved-shrunk-keys-unordered",
        "_native/order.cpp",
        "    std::sort(shrank.begin(), shrank.end(), old_less);",
        "    std::reverse(shrank.begin(), shrank.end());",
    ),
    Mutant(
        "moved-mirror-left-behind",
        "_native/order.cpp",
        "        if (!mirror.is_none()) move_item(list_items(mirror), i, j);",
        "        (void)j;",
    ),
    Mutant(
        "moved-one-slot-too-early",
        "_native/order.cpp",
        "        const size_t j = p > i ? p - 1 : p;",
        "        const size_t j = p > i || p > 0 ? p - 1 : p;",
    ),
    Mutant(
        "moved-despite-a-mixed-shape",
        "_native/order.cpp",
        "        } else if (shape_[k] != str) {",
        "        } else if (false) {",
    ),
    Mutant(
        "moved-a-key-of-another-shape",
        "_native/order.cpp",
        "        if (key[k].kind == Atom::Obj || shape_[k] != (key[k].kind == Atom::Str)) return false;",
        "        if (key[k].kind == Atom::Obj) return false;",
    ),
    Mutant(
        "placed-tie-above-right-neighbour",
        "_native/order.cpp",
        "        t = (left + right) / 2;",
        "        t = left + 1;",
    ),
    Mutant(
        "routing-key-count-change-not-rekeyed",
        "native/orders.py",
        "                rekey.update(self.by_key.get(k, {}))",
        "                pass",
    ),
    Mutant(
        "routing-key-arrivals-not-indexed",
        "native/orders.py",
        "        self._place(arrivals)\n        return iter(range(len(queue)))",
        "        return iter(range(len(queue)))",
    ),
    Mutant(
        "hrrn-ties-not-by-rid",
        "_native/order.cpp",
        "    if (arrival_.at(i) != arrival_.at(j)) return arrival_[i] < arrival_[j];",
        "    return arrival_.at(i) < arrival_.at(j);",
    ),
    Mutant(
        "hrrn-deferred-not-fixed",
        "_native/order.cpp",
        "    fixed_.at(i) = dep || work <= 0;",
        "    fixed_.at(i) = work <= 0;",
    ),
    Mutant(
        "hrrn-head-last-unsorted",
        "_native/order.cpp",
        "    std::sort(from, upto, cmp);",
        "    std::sort(from, upto - 1, cmp);",
    ),
    Mutant(
        "dfs-touched-branch-not-resorted",
        "_native/dfs_order.cpp",
        "    for (int64_t top : touched_) {\n        auto g = groups_.find(top);",
        "    for (int64_t top : std::vector<int64_t>{}) {\n        auto g = groups_.find(top);",
    ),
    Mutant(
        "dfs-deferred-ignored",
        "_native/dfs_order.cpp",
        "    const int64_t dep = is_deferred(r, deferred) ? 1 : 0;",
        "    const int64_t dep = 0;",
    ),
    Mutant(
        "dfs-outside-base-fits",
        "_native/dfs_order.cpp",
        "            return Fit{is_above_base(start), false, 0};",
        "            return Fit{true, false, 0};",
    ),
    Mutant(
        "dfs-old-members-unsorted",
        "_native/dfs_order.cpp",
        "        std::sort(olds.begin(), olds.end());  // positions are distinct",
        "        std::sort(olds.rbegin(), olds.rend());  // the old members backwards",
    ),
    Mutant(
        "spf-round-keyed-as-lpm",
        "_native/round.cpp",
        "        KeyOf key_of = key == kLpmKey ? lpm_key : key == kSpfKey ? spf_key : fair_key;",
        "        KeyOf key_of = key == kLpmKey ? lpm_key : key == kSpfKey ? lpm_key : fair_key;",
    ),
    Mutant(
        "spf-round-key-ignores-the-match",
        "_native/round.cpp",
        "    PyObject* diff = PyNumber_Subtract(fill.ptr(), k.matched.get(r).ptr());",
        "    PyObject* diff = PyNumber_Subtract(fill.ptr(), PyLong_FromLong(0));",
    ),
    Mutant(
        "spf-round-key-reads-a-subclass-fill-len",
        "_native/round.cpp",
        "    if (plain.is_none() || reinterpret_cast<PyObject*>(Py_TYPE(r)) != plain.ptr())\n"
        "        return attr(r, n.fill_len);",
        "    if (plain.is_none())\n        return attr(r, n.fill_len);",
    ),
    Mutant(
        "spf-round-key-ignores-deferral",
        "_native/round.cpp",
        "    key.push_back(Atom::of(dep ? Py_True : Py_False));\n    key.push_back(Atom::of(more",
        "    key.push_back(Atom::of(Py_False));\n    key.push_back(Atom::of(more",
    ),
    Mutant(
        "spf-batch-keys-skip-the-floor",
        "native/orders.py",
        "            max(1, r.fill_len - r.num_matched_prefix_tokens),",
        "            r.fill_len - r.num_matched_prefix_tokens,",
    ),
    Mutant(
        "fair-observe-skips-new-tenants",
        "_native/round.cpp",
        "        if (t.ptr() == last.ptr()) continue;",
        "        if (last.is_valid() && t.ptr() != last.ptr()) continue;",
    ),
    Mutant(
        "fair-observe-misses-the-arrivals",
        "native/orders.py",
        "        self._add_tenants(tenants, queue, len(self.out))",
        "        self._add_tenants(tenants, queue, len(queue))",
    ),
    Mutant(
        "fair-two-tenants-in-dict-order",
        "native/orders.py",
        "        if len(self.by_tenant) < 2:",
        "        if len(self.by_tenant) < 3:",
    ),
    Mutant(
        "touch-fills-drops-the-outputs",
        "_native/round.cpp",
        "    if (no == 0) return true;",
        "    if (no >= 0) return true;",
    ),
    Mutant(
        "touch-fills-reads-a-subclass-fill",
        "_native/round.cpp",
        "    if (plain.is_none() || reinterpret_cast<PyObject*>(Py_TYPE(r)) != plain.ptr()) return false;",
        "    if (plain.is_none()) return false;",
    ),
    Mutant(
        "touch-fills-wraps-a-wide-output",
        "_native/round.cpp",
        "overflow != 0 || x < INT32_MIN || x > INT32_MAX) return false;",
        "overflow != 0) return false;",
    ),
    Mutant(
        "fair-native-round-skips-the-observation",
        "native/orders.py",
        "        self._add_tenants(tenants, arrivals, 0)\n        fair.observe_active(frozenset(tenants))",
        "        self._add_tenants(tenants, arrivals, 0)",
    ),
    Mutant(
        "fair-native-round-misses-running-tenants",
        "native/orders.py",
        "        self._add_tenants(tenants, running, 0)\n        self._add_tenants(tenants, arrivals, 0)",
        "        self._add_tenants(tenants, arrivals, 0)",
    ),
    Mutant(
        "fair-one-order-takes-another-tenants-arrival",
        "native/orders.py",
        "        if self.out is not order.reqs or any(r.tenant_key != tenant for r in arrivals):",
        "        if self.out is not order.reqs:",
    ),
    Mutant(
        "fair-native-key-longest-last",
        "_native/round.cpp",
        "Atoms fair_key(PyObject* r, nb::handle /*deferred*/, nb::handle /*plain*/) {\n"
        "    KeyAttrs& k = key_attrs();\n    nb::object matched = neg_matched(k, r);",
        "Atoms fair_key(PyObject* r, nb::handle /*deferred*/, nb::handle /*plain*/) {\n"
        "    KeyAttrs& k = key_attrs();\n    nb::object matched = k.matched.get(r);",
    ),
    Mutant(
        "dfs-round-declined-not-rebuilt",
        "_native/round.cpp",
        "            return;\n    }\n    order.rebuild(queue, deferred);",
        "            return;\n    }",
    ),
    Mutant(
        "dfs-round-changed-not-rekeyed",
        "_native/round.cpp",
        "order.advance_items(changed_of(added, flipped, moved), arrivals, deferred, queue)",
        "order.advance_items({}, arrivals, deferred, queue)",
    ),
    Mutant(
        "dfs-take-leaver-kept",
        "_native/round.cpp",
        "            dfs->remove(r);",
        "            (void)dfs;",
    ),
    Mutant(
        "dfs-order-not-handed-to-round",
        "native/queue.py",
        "        if isinstance(engine, DfsWeightEngine) and self.matcher is not None:",
        "        if False:",
    ),
    Mutant(
        "dfs-order-at-slot-ties-reversed",
        "_native/radix.cpp",
        "            return x.weight != y.weight ? x.weight > y.weight : x.slot < y.slot;",
        "            return x.weight != y.weight ? x.weight > y.weight : x.slot > y.slot;",
    ),
    Mutant(
        "dfs-order-at-weights-not-summed",
        "_native/radix.cpp",
        "        for (Node* cur = node; cur != nullptr; cur = cur->parent) weight[cur] += c;",
        "        for (Node* cur = node; cur != nullptr; cur = nullptr) weight[cur] += c;",
    ),
    Mutant(
        "dfs-order-at-inside-ascending",
        "_native/radix.cpp",
        "                for (auto kv = it->second.rbegin(); kv != it->second.rend(); ++kv)",
        "                for (auto kv = it->second.begin(); kv != it->second.end(); ++kv)",
    ),
    Mutant(
        "compat-int-field-kept-when-changed",
        "_native/compat_fill.hpp",
        "            case 1: return v == low;",
        "            case 1: return true;",
    ),
    Mutant(
        "compat-last-node-kept-when-changed",
        "_native/compat_round.cpp",
        "    if (!same) k.last_node.set(req, nb::cast(m.walk.node));",
        "    if (last == nullptr) k.last_node.set(req, nb::cast(m.walk.node));",
    ),
    Mutant(
        "fair-round-not-observed",
        "native/orders.py",
        "        self._observe(queue, rnd)\n",
        "\n",
    ),
    Mutant(
        "checkpoint-duplicates-kept",
        "_native/kv.cpp",
        "        if (dup_end > c.lo) {",
        "        if (false) {",
    ),
    Mutant(
        "checkpoint-rematch-skipped",
        "_native/kv.cpp",
        "    if (res.length != c.lo || tree.disabled()) {",
        "    if (tree.disabled()) {",
    ),
    Mutant(
        "checkpoint-inserted-length-stale",
        "_native/kv.cpp",
        "            set(req, n.cache_inserted_len, a);\n",
        "\n",
    ),
    Mutant(
        "grown-row-not-copied",
        "_native/kv.cpp",
        "new_row(2 * new_len, wide_);\n            copy_into(row, have, fresh);\n",
        "new_row(2 * new_len, wide_);\n",
    ),
    Mutant(
        "settled-row-not-copied",
        "_native/kv.cpp",
        "!pool.slots_fit_int32());\n        copy_into(row, have, fresh);\n",
        "!pool.slots_fit_int32());\n",
    ),
    Mutant(
        "settle-claims-over-the-rows-head",
        "_native/kv.cpp",
        "pool.claim_into(data + have, n);",
        "pool.claim_into(data, n);",
    ),
    Mutant(
        "int32-slot-copy-one-short",
        "_native/radix.hpp",
        "std::memcpy(out, in, static_cast<size_t>(n) * sizeof(int32_t));",
        "std::memcpy(out, in, static_cast<size_t>(n - 1) * sizeof(int32_t));",
    ),
    Mutant(
        "wide-pool-gets-int32-rows",
        "_native/kv.cpp",
        "          wide_(!pool_->slots_fit_int32()),",
        "          wide_(false),",
    ),
    Mutant(
        "int32-fit-off-by-one",
        "_native/pool.hpp",
        "return pool_size() - 1 <= INT32_MAX;",
        "return pool_size() - 1 < INT32_MAX;",
    ),
    Mutant(
        "grown-row-always-int64",
        "_native/kv.cpp",
        "new_row(2 * new_len, wide_);",
        "new_row(2 * new_len, true);",
    ),
    Mutant(
        "int64-row-narrowed-unchecked",
        "_native/kv.cpp",
        "        if (from[i] < INT32_MIN || from[i] > INT32_MAX)\n",
        "        if (false)\n",
    ),
    Mutant(
        "widen-drops-the-last-slot",
        "_native/radix.cpp",
        "    for (; i < n; ++i) out[i] = in[i];",
        "    for (; i + 1 < n; ++i) out[i] = in[i];",
    ),
    Mutant(
        "widen-block-copies-one-short",
        "_native/radix.cpp",
        "        std::memcpy(out + i, block, static_cast<size_t>(c) * sizeof(int64_t));",
        "        std::memcpy(out + i, block, static_cast<size_t>(c - 1) * sizeof(int64_t));",
    ),
    Mutant(
        "narrow-accepts-wide-vectors",
        "_native/radix.cpp",
        "    ok = _mm_movemask_epi8(_mm_cmpeq_epi32(bad, _mm_setzero_si128())) == 0xFFFF;",
        "    ok = true;",
    ),
    Mutant(
        "spare-row-kept-while-viewed",
        "_native/kv.cpp",
        "        if (Py_REFCNT(o) != 1 ||",
        "        if (Py_REFCNT(o) > 2 ||",
    ),
    Mutant(
        "evicts-one-slot-short",
        "_native/kv.cpp",
        "    const int64_t short_by = n - pool.available_size();",
        "    const int64_t short_by = n - pool.available_size() - 1;",
    ),
    Mutant(
        "decode-loop-context-stride-one",
        "_native/decode.cpp",
        "            const auto ctx = double(total_ctx + k * b);",
        "            const auto ctx = double(total_ctx + k);",
    ),
    Mutant(
        "scalar-step-drops-host-load",
        "sim/cost/runner.py",
        "                new + len(decode), attn + ctx, kv + ctx, host, entries, len(extend)",
        "                new + len(decode), attn + ctx, kv + ctx, 0, entries, len(extend)",
    ),
    Mutant(
        "decode-step-one-entry-short",
        "sim/cost/runner.py",
        "    return cost._efficiency_factor(b), cost._fixed_s(b, b, 0)",
        "    return cost._efficiency_factor(b), cost._fixed_s(b, b - 1, 0)",
    ),
    Mutant(
        "scalar-tokens-ignore-stop-ids",
        "sim/cost/runner.py",
        "                if r.sampling.stop_token_ids or r.scripted_output is not None:\n                    break",
        "                if r.scripted_output is not None:\n                    break",
    ),
    Mutant(
        "jump-ignores-stop-tokens",
        "_native/decode.cpp",
        "        if (!free || cols.can_stop()) return 1;",
        "        if (!free) return 1;",
    ),
    Mutant(
        "jump-one-step-too-many",
        "_native/decode.cpp",
        "std::min(limit, floor_div(room - sum, int64_t(n)))",
        "std::min(limit, floor_div(room - sum, int64_t(n)) + 1)",
    ),
    Mutant(
        "settled-kv-len-off-by-one",
        "_native/decode.cpp",
        "py::set_int(r, names_.kv_len, o.fills[j] - 1);",
        "py::set_int(r, names_.kv_len, o.fills[j]);",
    ),
    Mutant(
        "jump-past-horizon",
        "_native/decode.cpp",
        "const int64_t m = std::min(n, int64_t(at) + 1);",
        "const int64_t m = n;",
    ),
    Mutant(
        "jump-past-horizon-while-waiting",
        "native/scheduler.py",
        "cols.jump_round(self._decode_run, self, free, horizon)",
        "cols.jump_round(self._decode_run, self, free, None if self.waiting else horizon)",
    ),
    Mutant(
        "jump-round-ignores-defers",
        "_native/decode.cpp",
        "    if (!run.defers || b.cols.can_stop()) return nb::none();",
        "    if (b.cols.can_stop()) return nb::none();",
    ),
    Mutant(
        "jump-round-asks-no-may-jump",
        "_native/decode.cpp",
        "    const bool free = free_ ? *free_ : may_jump(run, sched);",
        "    const bool free = free_ ? *free_ : true;",
    ),
    Mutant(
        "jump-round-may-jump-ignores-preemption",
        "_native/decode.cpp",
        "    return truthy(py::get(sched, n.batch_is_full)) && !run.preempts;",
        "    return truthy(py::get(sched, n.batch_is_full));",
    ),
    Mutant(
        "jump-round-ignores-an-overridden-may-jump",
        "_native/decode.cpp",
        "    if (!run.may_jump_here) return truthy(call0(sched, n.may_jump));",
        "",
    ),
    Mutant(
        "jump-round-clock-always-set",
        "_native/decode.cpp",
        "    } else if (greater(end, py::get(clock, n.t))) {  // jump_to: _t = max(_t, end)",
        "    } else {",
    ),
    Mutant(
        "jump-round-any-clock-is-virtual",
        "_native/decode.cpp",
        "    const bool virt = clock.type().is(run.vclock);",
        "    const bool virt = PyObject_HasAttr(clock.ptr(), n.t) == 1;",
    ),
    Mutant(
        "jump-round-decays-any-tracker-natively",
        "_native/decode.cpp",
        "    if (r.type().is(run.tracker) && floats) {",
        "    if (floats) {",
    ),
    Mutant(
        "jump-round-ignores-an-overridden-decay",
        "_native/decode.cpp",
        "    if (!run.decay_here) {",
        "    if (false) {",
    ),
    Mutant(
        "jump-round-peak-always-the-usage",
        "_native/decode.cpp",
        "    if (greater(usage, py::get(st, n.peak_kv_usage)))  // max(peak, usage)",
        "    if (true)",
    ),
    Mutant(
        "jump-round-usage-always-doubles",
        "_native/decode.cpp",
        "        if (capacity <= exact && used <= exact && used >= -exact)",
        "        if (true)",
    ),
    Mutant(
        "jump-round-duration-from-the-new-time",
        "_native/decode.cpp",
        "    const nb::object duration = steal_or_throw(PyNumber_Subtract(end.ptr(), t0.ptr()));",
        "    const nb::object duration = steal_or_throw(\n"
        "        PyNumber_Subtract(end.ptr(), py::get(py::get(sched, n.clock), n.now)().ptr()));",
    ),
    Mutant(
        "jump-round-leaves-the-batch-settled",
        "_native/decode.cpp",
        "    py::set(sched, n.unsettled, Py_True);",
        "",
    ),
    Mutant(
        "jump-round-charges-after-the-retire",
        "_native/decode.cpp",
        "    if (run.charges) nb::handle(sched).attr(n.charge_decode)(reqs, k_obj);\n"
        "    if (!maybe.empty()) retire_after_jump(b, run, sched, maybe, out, clock);",
        "    if (!maybe.empty()) retire_after_jump(b, run, sched, maybe, out, clock);\n"
        "    if (run.charges) nb::handle(sched).attr(n.charge_decode)(reqs, k_obj);",
    ),
    Mutant(
        "jump-round-ignores-an-overridden-retire",
        "_native/decode.cpp",
        "    if (run.retire_here && retire_is_native(run)) {",
        "    if (retire_is_native(run)) {",
    ),
    Mutant(
        "jump-round-declined-retire-dropped",
        "_native/decode.cpp",
        "    nb::handle(sched).attr(n.retire_finished)(nb::cast(maybe), out);",
        "",
    ),
    Mutant(
        "jump-round-retire-keeps-the-batch-full",
        "_native/decode.cpp",
        "            if (nb::cast<int64_t>(got) > 0) py::set(sched, n.batch_is_full, Py_False);",
        "",
    ),
    Mutant(
        "jump-round-failed-reservation-declines",
        "_native/decode.cpp",
        "    if (k == 0) {  // raise self._alloc_failed(total)",
        "    if (k == 0) return nb::none();\n    if (false) {",
    ),
    Mutant(
        "jump-round-outcome-shares-one-list",
        "_native/decode.cpp",
        "        py::set(o, n.retracted, list());",
        "        py::set(o, n.retracted, py::get(o, n.finished));",
    ),
    Mutant(
        "jump-round-builds-any-outcome-plainly",
        "native/scheduler.py",
        '        and not hasattr(cls, "__post_init__")\n',
        "\n",
    ),
    Mutant(
        "jump-round-ignores-a-replaced-retire",
        "_native/decode.cpp",
        "    return got == run.retire_fn.ptr();",
        "    return got != nullptr;",
    ),
    Mutant(
        "decode-tokens-clip-ignored",
        "native/scheduler.py",
        "cols.decode_tokens(clip if clip <= _INT64_MAX else _INT64_MAX)",
        "cols.decode_tokens(_INT64_MAX)",
    ),
    Mutant(
        "closed-loop-jumps-past-other-replicas",
        "sim/deploy/replicas.py",
        "    if reply_s is not None:",
        "    if False:",
    ),
    Mutant(
        "lookahead-ignores-stop-ids",
        "sim/deploy/replicas.py",
        "            return now + floor\n",
        "            pass\n",
    ),
    Mutant(
        "lookahead-ignores-waiting-requests",
        "sim/deploy/replicas.py",
        "    to_go = [*s.decode_tokens_to_go(), *(r.remaining_new_tokens for r in queued)]",
        "    to_go = [*s.decode_tokens_to_go()]",
    ),
    Mutant(
        "lookahead-reads-deferred-request-fields",
        "sim/deploy/replicas.py",
        "    to_go = [*s.decode_tokens_to_go(), ",
        "    to_go = [*(r.remaining_new_tokens for r in s.running), ",
    ),
    Mutant(
        "lookahead-one-step-too-far",
        "sim/deploy/replicas.py",
        "    return now + max(min(to_go, default=1), 1) * floor",
        "    return now + (max(min(to_go, default=1), 1) + 1) * floor",
    ),
    Mutant(
        "step-floor-reads-every-expert",
        "sim/cost/roofline.py",
        "        weights = max(m.shared_params * m.dtype_bytes if m.is_moe else m.weight_bytes, 0.0)",
        "        weights = max(m.weight_bytes, 0.0)",
    ),
    Mutant(
        "finish-check-skips-stops",
        "_native/decode.cpp",
        "if (can_stop() || out_len_[i] >= max_new_[i])",
        "if (out_len_[i] >= max_new_[i])",
    ),
    Mutant(
        "chunks-fused-with-mixed-batches",
        "native/scheduler.py",
        "            and not cfg.enable_mixed_chunk\n",
        "\n",
    ),
    Mutant(
        "decode-need-rounds-down",
        "_native/decode.cpp",
        "if (page > 1) end = -floor_div(-end, page) * page;",
        "if (page > 1) end = floor_div(end, page) * page;",
    ),
    Mutant(
        "decode-tokens-unclipped",
        "_native/decode.cpp",
        "std::min(std::max<int64_t>(max_new_[i] - out_len_[i], 0), clip);",
        "std::max<int64_t>(max_new_[i] - out_len_[i], 0);",
    ),
    Mutant(
        "guard-shares-past-the-shorter-end",
        "_native/adder.cpp",
        "    if (k > std::min(na, nb_)) return false;",
        "    if (k > std::min(na, nb_) + 1) return false;",
    ),
    Mutant(
        "guard-shares-compares-one-short",
        "_native/adder.cpp",
        "    return same_tokens(a + from, b + from, k - from);",
        "    return same_tokens(a + from, b + from, k - from - 1);",
    ),
    Mutant(
        "guard-ignores-what-the-cache-holds",
        "_native/adder.cpp",
        "            shares_at_least(fill, na, other.data(), nb_, least, start + threshold))",
        "            shares_at_least(fill, na, other.data(), nb_, least, least))",
    ),
    Mutant(
        "adder-memory-check-inclusive",
        "_native/adder.cpp",
        "    if (!(total_tokens < static_cast<double>(room) - b.total_offset))",
        "    if (!(total_tokens <= static_cast<double>(room) - b.total_offset))",
    ),
    Mutant(
        "adder-chunk-ignores-input-budget",
        "_native/adder.cpp",
        "    if (b.has_chunk && !c.compat && b.n_admitted > 0)\n",
        "    if (b.has_chunk && !c.compat && b.n_admitted < 0)\n",
    ),
    Mutant(
        "adder-compat-chunk-cut-at-input-budget",
        "_native/adder.cpp",
        "    if (b.has_chunk && !c.compat && b.n_admitted > 0)\n",
        "    if (b.has_chunk && b.n_admitted > 0)\n",
    ),
    Mutant(
        "adder-compat-checks-first-chunk",
        "_native/adder.cpp",
        "    const int64_t first = (will_chunk && !c.compat) ? floor_page(rem_chunk, p) : cand;",
        "    const int64_t first = will_chunk ? floor_page(rem_chunk, p) : cand;",
    ),
    Mutant(
        "adder-preempts-nothing-once-full",
        "_native/adder.cpp",
        "            (batch_is_full && !preemption))\n",
        "            batch_is_full)\n",
    ),
    Mutant(
        "adder-compat-reserves-discounted",
        "_native/adder.cpp",
        "        if (cfg.compat) {\n",
        "        if (false) {\n",
    ),
    Mutant(
        "adder-charge-forgets-page",
        "_native/adder.cpp",
        "    const int64_t immediate = paged + page;",
        "    const int64_t immediate = paged;",
    ),
    Mutant(
        "adder-guard-ignores-cached-prefix",
        "_native/adder.cpp",
        "        const int64_t start = std::max(cached, a.prefix_len);",
        "        const int64_t start = a.prefix_len;",
    ),
    Mutant(
        "adder-memo-cap-not-applied",
        "_native/adder.cpp",
        "        length = std::min(m->n, cap);",
        "        length = m->n;",
    ),
    Mutant(
        "adder-input-budget-spent-below-zero",
        "_native/adder.cpp",
        "    if (b.rem_input_tokens <= 0) return Verdict::Other;",
        "    if (b.rem_input_tokens < 0) return Verdict::Other;",
    ),
    Mutant(
        "adder-input-tokens-unpaged",
        "_native/adder.cpp",
        "    const int64_t input_tokens = ceil_page(cand, p);",
        "    const int64_t input_tokens = cand;",
    ),
    Mutant(
        "adder-check-lock-not-released",
        "_native/adder.cpp",
        "        tree.dec_lock_ref(*last);\n        verdict",
        "        verdict",
    ),
    Mutant(
        "int-float-negative-fraction-equal",
        "_native/order.cpp",
        "    return frac > 0 ? -1 : (frac < 0 ? 1 : 0);",
        "    return frac > 0 ? -1 : 0;",
    ),
    Mutant(
        "evict-drops-a-stale-leaf",
        "_native/radix.cpp",
        "            push(leaf);\n            continue;",
        "            continue;",
    ),
    Mutant(
        "slot-table-ignores-the-type-version",
        "_native/py_attr.hpp",
        "        if (e.type == t && e.name == name && valid && e.version == t->tp_version_tag) return e;",
        "        if (e.type == t && e.name == name) return e;",
    ),
    Mutant(
        "slot-set-skips-a-custom-setattr",
        "_native/py_attr.hpp",
        "            if (t->tp_setattro == PyObject_GenericSetAttr &&\n",
        "            if (true &&\n",
    ),
    Mutant(
        "slot-set-keeps-the-old-value",
        "_native/py_attr.hpp",
        "        slot = Py_NewRef(v.ptr());\n        Py_XDECREF(old);",
        "        if (old == nullptr) slot = Py_NewRef(v.ptr());",
    ),
    Mutant(
        "own-value-index-one-off",
        "_native/py_attr.hpp",
        "        if (entries[i].me_key == name) return i;",
        "        if (entries[i].me_key == name) return i + 1 < k->dk_nentries ? i + 1 : i;",
    ),
    Mutant(
        "own-value-past-a-custom-getattribute",
        "_native/py_attr.hpp",
        "        !PyUnicode_CheckExact(name) || t->tp_getattro != PyObject_GenericGetAttr ||",
        "        !PyUnicode_CheckExact(name) ||",
    ),
    Mutant(
        "own-value-past-a-custom-setattr",
        "_native/py_attr.hpp",
        "        t->tp_setattro != PyObject_GenericSetAttr)\n        return;",
        "        false)\n        return;",
    ),
    Mutant(
        "own-value-past-a-heap-class-attribute",
        "_native/py_attr.hpp",
        "        if (PyType_HasFeature(const_cast<PyTypeObject*>(d), Py_TPFLAGS_HEAPTYPE) ||\n",
        "        if (false ||\n",
    ),
    Mutant(
        "own-value-past-a-descriptor",
        "_native/py_attr.hpp",
        "            d->tp_descr_get != nullptr || d->tp_descr_set != nullptr)",
        "            false)",
    ),
    Mutant(
        "own-value-set-when-unset",
        "_native/py_attr.hpp",
        "        if (old == nullptr) return false;\n        values[e.value_at] = Py_NewRef(v);\n"
        "        Py_DECREF(old);",
        "        values[e.value_at] = Py_NewRef(v);\n        Py_XDECREF(old);",
    ),
    Mutant(
        "own-dict-set-dropped",
        "_native/py_attr.hpp",
        "    if (PyDict_SetItem(dict, name, v) < 0) throw nb::python_error();\n    return true;",
        "    return true;",
    ),
    Mutant(
        "own-value-never-filled",
        "_native/py_attr.hpp",
        "    fill_managed(e, t, name, descr, o);",
        "    (void)descr;\n    (void)o;",
    ),
    Mutant(
        "slot-view-kept-however-short",
        "_native/radix.cpp",
        "    if (n * kShareFraction < block || n == 0) {",
        "    if (n == 0) {",
    ),
    Mutant(
        "row-buffer-handed-out-while-a-node-views-it",
        "_native/kv.cpp",
        "    if (!b.owner || b.len == 0 || b.owner.use_count() != 2) return nullptr;",
        "    if (!b.owner || b.len == 0) return nullptr;",
    ),
    Mutant(
        "split-tail-copied-not-viewed",
        "_native/radix.cpp",
        "    view(from.data_ + m, from.data_ + from.n_, owner, from.block_);",
        "    assign(from.data_ + m, from.data_ + from.n_);",
    ),
    Mutant(
        "allreduce-memo-ignores-the-token-count",
        "_native/prefill.cpp",
        "        const auto it = allreduce_memo.find(tokens);",
        "        const auto it = allreduce_memo.begin();",
    ),
    Mutant(
        "decode-paged-fit-exclusive",
        "_native/decode.cpp",
        "        if (need_total(mid, page) <= room)",
        "        if (need_total(mid, page) < room)",
    ),
    Mutant(
        "prefill-token-one-position-early",
        "_native/prefill.cpp",
        "stand_in(nb::cast<uint64_t>(h), uint64_t(prefix + it.num_new), vocab);",
        "stand_in(nb::cast<uint64_t>(h), uint64_t(prefix + it.num_new - 1), vocab);",
    ),
    Mutant(
        "prefill-middle-chunk-emits",
        "_native/prefill.cpp",
        "if (!it.produces) continue;  // a middle chunk: checkpointed at the next step",
        "// a middle chunk emitted like a last one",
    ),
    Mutant(
        "chunk-end-off-the-pages",
        "_native/chunks.cpp",
        "    const int64_t end = floor_page(prefix_len + rem, b.page);",
        "    const int64_t end = prefix_len + rem;",
    ),
    Mutant(
        "fused-chunks-past-the-horizon",
        "_native/prefill.cpp",
        "if (steps > 0 && (horizon.is_none() || !less(now, horizon) ||",
        "if (steps > 0 && (horizon.is_none() || false ||",
    ),
    Mutant(
        "prefill-running-x-unscaled",
        "_native/prefill.cpp",
        "get(st, n.running_x_s)) + double(size) * d));",
        "get(st, n.running_x_s)) + d));",
    ),
    Mutant(
        "compat-match-uncapped",
        "_native/compat_match.cpp",
        "    if (total <= f.n - 1)\n",
        "    if (true)\n",
    ),
    Mutant(
        "compat-match-drops-outputs",
        "_native/compat_match.cpp",
        "    if (no == 0) return Fill{prompt.data(), np};\n",
        "    if (no >= 0) return Fill{prompt.data(), np};\n",
    ),
    Mutant(
        "compat-dedup-ignores-namespaces",
        "_native/compat_match.cpp",
        "        number = PyLong_AsLongLong(idx);\n",
        "        number = -1;\n",
    ),
    Mutant(
        "compat-round-memo-without-touch",
        "_native/compat_round.cpp",
        "    m.walk.node = tree.touch_at(*memo.node, memo.full ? memo.node->size() : memo.offset);\n",
        "    m.walk.node = memo.node;\n",
    ),
    Mutant(
        "compat-round-spf-ignores-entry-time",
        "_native/compat_round.cpp",
        "        return x.entry < y.entry;\n",
        "        return false;\n",
    ),
    Mutant(
        "compat-round-spf-deferred-not-last",
        "_native/compat_round.cpp",
        "        if (x.deferred != y.deferred) return x.deferred < y.deferred;\n",
        "\n",
    ),
    Mutant(
        "compat-round-kept-keys-ignore-namespaces",
        "_native/compat_round.cpp",
        "s.groups.duplicate_at(rec->ns, rec->head.data(), rec->hash)",
        "s.groups.duplicate_at(nb::none(), rec->head.data(), rec->hash)",
    ),
    Mutant(
        "compat-round-matcher-cap-ignored",
        "_native/compat_round.cpp",
        "m = match_memo(k, s.tree, *memo, req, std::min(memo->n, f.n - 1));",
        "m = match_memo(k, s.tree, *memo, req, memo->n);",
    ),
    Mutant(
        "compat-round-kept-fill-len-ignored",
        "_native/compat_round.cpp",
        "            f.n = t.fill_len;\n",
        "            f.n = t.fill_len + 1;\n",
    ),
    Mutant(
        "touch-keys-walks-empty-keys",
        "_native/radix_match.cpp",
        "        if (kp.len == 0) continue;\n",
        "        if (kp.len < 0) continue;\n",
    ),
    Mutant(
        "sort-lof-arrivals-first-among-equals",
        "_native/round.cpp",
        "    std::merge(at.begin(), mid, mid, at.end(), std::back_inserter(order), later);",
        "    std::merge(mid, at.end(), at.begin(), mid, std::back_inserter(order), later);",
    ),
    Mutant(
        "tenant-counts-run-counted-once",
        "_native/round.cpp",
        "        if (t.ptr() == last.ptr()) {\n            ++run;",
        "        if (t.ptr() == last.ptr()) {\n            run = 1;",
    ),
    Mutant(
        "shuffle-in-place-skips-the-second-item",
        "_native/lazy_shuffle.cpp",
        "    for (Py_ssize_t i = n; i-- > 1;) {\n        const auto j =",
        "    for (Py_ssize_t i = n; i-- > 2;) {\n        const auto j =",
    ),
    Mutant(
        "fair-decode-charged-once-per-tenant",
        "native/scheduler.py",
        "            for _ in range(n):\n",
        "            for _ in range(min(n, 1)):\n",
    ),
    Mutant(
        "compat-fcfs-keeps-list-under-priorities",
        "native/queue.py",
        "        if pol.key is fcfs_sglang and not priorities:\n",
        "        if pol.key is fcfs_sglang:\n",
    ),
    Mutant(
        "compat-lof-ignores-priorities",
        "native/queue.py",
        "        if pol.key is lof_sglang and not priorities:\n",
        "        if pol.key is lof_sglang:\n",
    ),
    Mutant(
        "decode-need-page-1-one-step-more",
        "_native/decode.cpp",
        "            total += std::max<int64_t>(fill_[i] + (steps - 1) - have_[i], 0);",
        "            total += std::max<int64_t>(fill_[i] + steps - have_[i], 0);",
    ),
    Mutant(
        "retire-drops-the-row-after-each-finished",
        "_native/decode.cpp",
        "            if (p < gone.size() && gone[p] == i) {",
        "            if (p < gone.size() && gone[p] + 1 == i) {",
    ),
    Mutant(
        "decode-remove-keeps-the-first-removed-row",
        "_native/decode.cpp",
        "        size_t w = size_t(positions[0]), p = 0;  // the rows before it stay",
        "        size_t w = size_t(positions[0]) + 1, p = 0;  // the rows before it stay",
    ),
    Mutant(
        "retraction-order-longest-prompt-last",
        "_native/decode.cpp",
        "                return neg_prompt > o.neg_prompt;",
        "                return neg_prompt < o.neg_prompt;",
    ),
    Mutant(
        "retraction-order-priority-sign-ignored",
        "_native/decode.cpp",
        "            keys[i].prio = static_cast<__int128>(*p) * -static_cast<__int128>(sign);",
        "            keys[i].prio = static_cast<__int128>(*p);",
    ),
    Mutant(
        "retraction-order-none-priority-most-important",
        "_native/decode.cpp",
        "        if (p.is_none()) return sign > 0 ? INT64_MAX : INT64_MIN;",
        "        if (p.is_none()) return sign > 0 ? INT64_MIN : INT64_MAX;",
    ),
    Mutant(
        "retraction-order-priority-overflow-wraps",
        "_native/decode.cpp",
        "        if (overflow != 0) return std::nullopt;",
        "        if (overflow != 0) return int64_t(overflow > 0 ? INT64_MAX : INT64_MIN);",
    ),
    Mutant(
        "retraction-order-declined-returns-none",
        "native/scheduler.py",
        "        if got is None:  # no rows, a priority past int64 or a policy the columns do not know",
        "        if got is None and not self.reqs:  # no rows, a priority past int64 or a policy",
    ),
    Mutant(
        "decode-squeeze-keeps-each-removed-row",
        "_native/decode.cpp",
        "            const size_t from = size_t(positions[p]) + 1;",
        "            const size_t from = size_t(positions[p]);",
    ),
    Mutant(  # (not a weaker check: bad rows past it are undefined behaviour, a crash)
        "decode-remove-at-refuses-with-another-error",
        "_native/decode.cpp",
        '            throw std::invalid_argument("remove_at: positions must be ascending rows of the batch");',
        '            throw std::out_of_range("remove_at: positions must be ascending rows of the batch");',
    ),
    Mutant(
        "decode-remove-at-keeps-stopping-count",
        "_native/decode.cpp",
        "    for (int64_t i : positions) stopping_ -= stops_[size_t(i)];",
        "    for (int64_t i : positions) stopping_ -= 0 * stops_[size_t(i)];",
    ),
    Mutant(
        "stand-ins-long-path-off-by-one",
        "_native/decode.cpp",
        "        PyObject* t = v <= uint64_t(LONG_MAX) ? PyLong_FromLong(long(v))",
        "        PyObject* t = v <= uint64_t(LONG_MAX) ? PyLong_FromLong(long(v) ^ 1)",
    ),
    Mutant(
        "retire-covers-rows-that-can-stop",
        "_native/decode.cpp",
        "            if (row.stops || row.out_len > row.max_new ||",
        "            if (row.out_len > row.max_new ||",
    ),
    Mutant(
        "settle-takes-stop-id-requests-for-plain",
        "_native/decode.cpp",
        "    if (stops && truthy(py::get(py::get(r, k.sampling), k.stop_token_ids))) return false;",
        "    (void)stops;",
    ),
    Mutant(
        "retire-length-finish-exclusive",
        "_native/decode.cpp",
        "        if (row.out_len >= row.max_new)\n",
        "        if (row.out_len > row.max_new)\n",
    ),
    Mutant(
        "arrivals-ignore-namespaces",
        "_native/module.cpp",
        "    const bool plain_ns = a.extra_key.get(r).is_none() && a.cache_salt.get(r).is_none();",
        "    const bool plain_ns = true;",
    ),
    Mutant(
        "arrivals-entry-order-from-last-pair",
        "_native/arrive.cpp",
        "        } else if (ordered) {\n",
        "        } else {\n",
    ),
    Mutant(
        "arrivals-door-skips-duplicate-rid",
        "native/arrive.py",
        "            rid in by_rid\n            or r.priority is not None\n",
        "            r.priority is not None\n",
    ),
    Mutant(
        "arrivals-door-cap-forgets-the-page",
        "native/arrive.py",
        "            or max_new > min(max_req_len - n - 1, capacity - -(-n // p) * p - p - 1)",
        "            or max_new > min(max_req_len - n - 1, capacity - -(-n // p) * p - 1)",
    ),
    Mutant(
        "arrivals-delivered-before-due",
        "sim/deploy/open_loop.py",
        "    while j < n and arrivals[j] <= now:",
        "    while j < n and arrivals[j] <= now + 0.05:",
    ),
    Mutant(
        "arrivals-delivered-without-their-prompts",
        "sim/deploy/open_loop.py",
        "    reqs[j - 1]  # indexed for its side effect: a deferred sequence builds through it\n",
        "\n",
    ),
    Mutant(
        "series-check-forgets-the-sample-before",
        "results/series.py",
        "        before = np.concatenate(([self._last], t[:-1]))",
        "        before = np.concatenate(([t[0]], t[:-1]))",
    ),
    Mutant(
        "series-check-keeps-the-old-last-time",
        "results/series.py",
        "        self._last = times[-1]\n",
        "\n",
    ),
    Mutant(
        "client-requests-reused-when-copies-are-asked",
        "sim/deploy/run.py",
        "sorted(own if reuse else map(clone_request, own),",
        "sorted(own,",
    ),
    Mutant(
        "deferred-requests-reused-when-copies-are-asked",
        "sim/deploy/run.py",
        "    reqs = [own[i] for i in order] if reuse else [clone_request(own[i]) for i in order]",
        "    reqs = [own[i] for i in order]",
    ),
    Mutant(
        "build-prompts-keeps-the-built-prompt-in-the-draft",
        "sim/workloads/deferred.py",
        "            d.prompt = p\n",
        "\n",
    ),
    Mutant(
        "summary-times-take-a-nan-time-for-none",
        "results/reqarrays.py",
        "    present[nans] = [values[k] is not None for k in nans]",
        "    present[nans] = False",
    ),
    Mutant(
        "percentiles-leave-the-first-position-with-zeros",
        "results/stats.py",
        "    if _may_hold_zero(part) and (part == 0).any():",
        "    if False:",
    ),
    Mutant(
        "build-prompts-writes-into-the-drafts-buffer",
        "sim/workloads/deferred.py",
        "            d.prompt = _NO_TOKENS\n",
        "\n",
    ),
    Mutant(
        "lpm-round-skips-the-refresh-count",
        "native/queue.py",
        "                if self._refresh_rounds % REFRESH_INTERVAL and self.refresh_on and self.reqs:\n"
        "                    self._refresh_rounds += 1\n",
        "                if self._refresh_rounds % REFRESH_INTERVAL and self.refresh_on and self.reqs:\n"
        "                    pass\n",
    ),
    Mutant(
        "round-counts-a-refresh-that-is-due",
        "native/queue.py",
        "        if not due and self.refresh_on and self.matches and self.reqs:\n",
        "        if self.refresh_on and self.matches and self.reqs:\n",
    ),
    Mutant(
        "requeue-keeps-the-arrival-order-answer",
        "native/queue.py",
        "            self._arrival_settled = False  # the list changed\n",
        "            pass\n",
    ),
    Mutant(
        "arrival-order-skips-a-pair",
        "native/queue.py",
        "            next(later, None)\n",
        "            next(later, None)\n            next(later, None)\n",
    ),
    Mutant(
        "door-batch-cap-keeps-the-last-token",
        "_native/arrive.cpp",
        "        int64_t cap = len_of(get(r, n.prompt_ids)) + len_of(get(r, n.output_ids)) - 1;\n",
        "        int64_t cap = len_of(get(r, n.prompt_ids)) + len_of(get(r, n.output_ids));\n",
    ),
    Mutant(
        "door-batch-matches-outside-the-namespace",
        "_native/module.cpp",
        "        out.append(t.match_len(tok.data(), tok.shape(0), ns));",
        "        out.append(t.match_len(tok.data(), tok.shape(0), 0));",
    ),
    Mutant(
        "continuation-skips-the-checkpoint",
        "native/step.py",
        "    if req.extend_end > req.prefix_len:  # ``_continue_chunked``, without its call\n",
        "    if False:\n",
    ),
    Mutant(
        "continuation-keeps-an-empty-batch-full",
        "native/step.py",
        "    if not s.batch.reqs:\n        s.batch_is_full = False\n",
        "    if False:\n        s.batch_is_full = False\n",
    ),
    Mutant(
        "native-admission-never-preempts",
        "native/admit.py",
        "    preempts = type(adder) is not Budgets and s.config.enable_priority_preemption\n",
        "    preempts = False\n",
    ),
    Mutant(
        "rematch-from-lock-touches-nothing-above",
        "_native/radix.cpp",
        "    for (Node* cur = &start; cur != root_.get(); cur = cur->parent) cur->last_access_time = now;\n",
        "\n",
    ),
    Mutant(
        "rematch-from-lock-ignores-namespace",
        "_native/radix.cpp",
        "    if (top == nullptr || top->ns != ns) return false;",
        "    if (top == nullptr) return false;",
    ),
    Mutant(
        "rematch-shortcut-touches-nothing",
        "_native/kv.cpp",
        "            m = WalkResult{tree.touch_at(*res.node, res.node->size()), c.aligned};",
        "            m = WalkResult{res.node, c.aligned};",
    ),
    Mutant(
        "rematch-shortcut-ignores-namespace",
        "_native/kv.cpp",
        "            (!from_lock || c.lock->ns == c.ns)) {",
        "            true) {",
    ),
    Mutant(
        "rematch-shortcut-on-a-partial-page",
        "_native/kv.cpp",
        "        if (!tree.disabled() && (c.aligned - start) % tree.page_size() == 0 &&",
        "        if (!tree.disabled() &&",
    ),
    Mutant(
        "evict-free-frees-nothing",
        "_native/kv.cpp",
        "    if (n != 0) pool.free(freed.data(), n, false);",
        "    (void)n;",
    ),
    Mutant(
        "leaf-list-moved-leaf-not-reindexed",
        "_native/radix.cpp",
        "    leaf_at_[static_cast<size_t>(last.id)] = at;\n",
        "\n",
    ),
    Mutant(
        "leaf-list-adds-a-member-twice",
        "_native/radix.cpp",
        "    if (leaf_at_[id]) return;\n",
        "\n",
    ),
    Mutant(
        "leaf-index-kept-over-a-reset",
        "_native/radix.cpp",
        "    for (const Leaf& leaf : leaves_) leaf_at_[static_cast<size_t>(leaf.id)] = 0;\n",
        "\n",
    ),
    Mutant(
        "leaf-index-refuses-no-foreign-id",
        "_native/radix.cpp",
        '    if (id >= leaf_at_.size()) throw std::invalid_argument(node_desc(n) + ": not of this tree");\n',
        "    if (id >= leaf_at_.size()) leaf_at_.resize(id + 1);\n",
    ),
    Mutant(
        "cut-leaf-view-kept-however-short",
        "_native/radix.cpp",
        "    if (n != 0 && n * kShareFraction >= block_) {",
        "    if (n != 0) {",
    ),
    Mutant(
        "pool-fast-free-no-rollback",
        "_native/pool.cpp",
        "            for (int64_t q = 0; q < i; ++q) stack_pos_[pages[q]] = 0;\n",
        "\n",
    ),
    Mutant(
        "pool-fast-free-takes-free-pages",
        "_native/pool.cpp",
        "static_cast<uint64_t>(page - 1) >= top || stack_pos_[page] != 0",
        "static_cast<uint64_t>(page - 1) >= top || stack_pos_[page] < 0",
    ),
    Mutant(
        "pool-fast-free-stacks-a-group-reversed",
        "_native/pool.cpp",
        "        stack_[lo + i] = static_cast<int32_t>(page);",
        "        stack_[lo + k - 1 - i] = static_cast<int32_t>(page);",
    ),
    Mutant(
        "evict-free-buffer-not-cleared",
        "_native/radix.cpp",
        "    out.clear();\n    Freed freed;",
        "    Freed freed;",
    ),
    Mutant(
        "move-lock-skips-the-new-node",
        "_native/radix.cpp",
        "    for (Node* cur = &node; cur != old; cur = cur->parent) {\n        if (cur->lock_ref == 0)",
        "    for (Node* cur = node.parent; cur != old; cur = cur->parent) {\n        if (cur->lock_ref == 0)",
    ),
    Mutant(
        "rematch-copies-one-slot-short",
        "_native/kv.cpp",
        "            tree.path_slots(*m.node, m.length, c.lo, dup_end, c.row + c.lo);",
        "            tree.path_slots(*m.node, m.length, c.lo, dup_end - 1, c.row + c.lo);",
    ),
    # The command's start and setup (``cli``): the collector's passes around the imports,
    # the preflight and the load.
    Mutant(
        "setup-keeps-the-preflight-s-garbage",
        "cli/simulate.py",
        "    if program:\n        gc.collect(1)\n",
        "    if program:\n        pass\n",
    ),
    Mutant(
        "load-objects-stay-young",
        "cli/simulate.py",
        "        if thaw:\n            gc.freeze()\n",
        "        if thaw:\n            pass\n",
    ),
    Mutant(
        "a-call-s-load-objects-moved-too",
        "cli/simulate.py",
        "        thaw = program and gc.get_freeze_count() == 0\n",
        "        thaw = gc.get_freeze_count() == 0\n",
    ),
    Mutant(
        "command-leaves-the-load-frozen",
        "cli/simulate.py",
        "        if thaw:\n            gc.unfreeze()\n",
        "        if thaw:\n            pass\n",
    ),
    Mutant(
        "program-imports-with-the-collector-on",
        "cli/__main__.py",
        "    gc.disable()\n",
        "",
    ),
    Mutant(
        "start-imports-what-a-run-does-without",
        "cli/simulate.py",
        '    "rich.table",\n',
        '    "rich.table",\n    "rich.progress",\n',
    ),
    Mutant(
        "preflight-with-the-collector-paused",
        "cli/simulate.py",
        "    _preflight(rs, policies, args.config)\n",
        "    gc.disable()\n    _preflight(rs, policies, args.config)\n    gc.enable()\n",
    ),
    Mutant(
        "native-id-bound-too-tight",
        "sim/workloads/mooncake_lines.py",
        "ids = np.empty(len(block) // 2 + 1, dtype=np.int64)",
        "ids = np.empty(len(block) // 3 + 1, dtype=np.int64)",
    ),
    Mutant(
        "line-blocks-count-one-line-short",
        "sim/workloads/mooncake_lines.py",
        '            rows = block.count(b"\\n") + 1\n',
        '            rows = block.count(b"\\n")\n',
    ),
    Mutant(
        "runs-in-a-frozen-heap-keep-the-garbage-before",
        "sim/policy_runs.py",
        "                if i and gc.get_freeze_count():\n",
        "                if False:\n",
    ),
    Mutant(
        "load-req-tenant-as-cache-salt",
        "sim/workloads/load.py",
        "                None,\n                d.tenant,\n",
        "                d.tenant,\n                None,\n",
    ),
    Mutant(
        "mooncake-draft-stamp-as-offset",
        "sim/workloads/traces.py",
        "0.0, (ts - t0) / 1e3, None",
        "(ts - t0) / 1e3, 0.0, None",
    ),
    # The inter-token gaps' statistics made a batch at a time (``results.gapstats``).
    Mutant(
        "gap-stream-misses-the-last-sequence",
        "results/gapstats.py",
        'last = int(np.searchsorted(self.ends, b - 1, side="right")) + 1',
        'last = int(np.searchsorted(self.ends, b - 1, side="right"))',
    ),
    Mutant(
        "gap-stream-keeps-the-gap-between-sequences",
        "results/gapstats.py",
        "np.cumsum(self.lens[first : last - 1]) - 1)",
        "np.cumsum(self.lens[first : last - 1]))",
    ),
    Mutant(
        "gap-stream-joins-lists-as-arrays",
        "results/gapstats.py",
        "        if self.loose[last] != self.loose[first]:\n",
        "        if False:\n",
    ),
    Mutant(
        "gap-leaves-split-unaligned",
        "results/gapstats.py",
        "    half -= half % 8\n    return _leaves(",
        "    return _leaves(",
    ),
    Mutant(
        "gap-stats-streams-a-nan",
        "results/gapstats.py",
        "    if low < 0 or high >= _FINITE:\n",
        "    if low < 0:\n",
    ),
    Mutant(
        "gap-stats-negative-gaps-streamed",
        "results/gapstats.py",
        "    if low < 0 or high >= _FINITE:\n",
        "    if high >= _FINITE:\n",
    ),
    Mutant(
        "gap-rank-one-past-in-its-bucket",
        "results/gapstats.py",
        "k = r - (int(ends[b - 1]) if b else 0)",
        "k = r - (int(ends[b - 1]) if b else 0) + 1",
    ),
    # The load and the preflight (``sim``): the hash ids' packing, the throw-away pools, the
    # bound's key.
    Mutant(
        "hash-ids-packed-at-the-chunk-s-index",
        "sim/workloads/mooncake_lines.py",
        'struct.pack_into(f"={len(part)}q", arr.data, 8 * lo, *part)',
        'struct.pack_into(f"={len(part)}q", arr.data, lo, *part)',
    ),
    Mutant(
        "bool-scan-misses-true",
        "sim/workloads/mooncake_lines.py",
        '    return (b"r" in block and b"true" in block) or (b"f" in block and b"false" in block)',
        '    return b"f" in block and b"false" in block',
    ),
    Mutant(
        "hash-ids-take-2-to-the-31",
        "sim/workloads/mooncake_lines.py",
        "    if int(arr.min()) < 0 or int(arr.max()) >= 2**31:\n        return None\n    return arr",
        "    if int(arr.min()) < 0 or int(arr.max()) > 2**31:\n        return None\n    return arr",
    ),
    Mutant(
        "preflight-pools-of-the-run-s-size",
        "sim/preflight.py",
        "kv_slots=min(int(cost.kv_capacity_tokens()), cfg.page_size),",
        "kv_slots=int(cost.kv_capacity_tokens()),",
    ),
    Mutant(
        "bound-key-scripted-flag-swapped",
        "sim/workloads/load.py",
        'scripted = {False: "\\0False\\n", True: "\\0True\\n"}',
        'scripted = {True: "\\0False\\n", False: "\\0True\\n"}',
    ),
    Mutant(
        "table-never-highlights",
        "results/table.py",
        "    highlight = False if console.color_system is None else None\n",
        "    highlight = False\n",
    ),
    Mutant(
        "table-highlights-without-styles",
        "results/table.py",
        "    highlight = False if console.color_system is None else None\n",
        "    highlight = None\n",
    ),
    Mutant(
        "native-prefill-charges-no-tokens",
        "native/scheduler.py",
        "            charge(r.tenant_key, n, 0)\n",
        "            charge(r.tenant_key, 0, 0)\n",
    ),
    Mutant(
        "native-run-forgets-the-tenants",
        "native/scheduler.py",
        "                if self._charges:\n                    self._charge_prefill(",
        "                if False:\n                    self._charge_prefill(",
    ),
    Mutant(
        "direct-step-forgets-the-tenants",
        "native/step.py",
        "            if before is not None:\n",
        "            if False:\n",
    ),
    Mutant(
        "chunk-limit-policy-fuses-its-continuation",
        "native/scheduler.py",
        "        self._fusion = fresh and self.policy.chunk_limit is None  # the policy is frozen\n",
        "        self._fusion = fresh\n",
    ),
    Mutant(
        "continuation-ignores-the-chunk-limit",
        "_native/chunks.cpp",
        "    if (limit) rem = std::min(rem, *limit);  // rem = min(rem, chunked_req_limit)\n",
        "\n",
    ),
    Mutant(
        "limited-step-passes-no-limit",
        "native/step.py",
        "    got = _plan_into(s, req, b, running, limit)\n",
        "    got = _plan_into(s, req, b, running, None)\n",
    ),
    Mutant(
        "limited-fallback-forgets-the-limit",
        "native/step.py",
        "        adder.chunked_req_limit = limit\n",
        "\n",
    ),
    Mutant(
        "limited-keeps-an-empty-batch-full",
        "native/step.py",
        "    if not s.batch.reqs:  # (``_build_prefill``'s)\n        s.batch_is_full = False\n",
        "    if False:\n        s.batch_is_full = False\n",
    ),
    Mutant(
        "limited-budgets-not-exclusive",
        "native/step.py",
        "chunk, exclusive_chunking=True)\n",
        "chunk, exclusive_chunking=False)\n",
    ),
    Mutant(
        "fair-charges-int-weights-as-doubles",
        "native/scheduler.py",
        "        floats = type(none) is float and type(inc) is float  # (ints add exactly, unbounded)\n",
        "        floats = True\n",
    ),
    Mutant(
        "fair-native-charge-reassociates",
        "_native/decode.cpp",
        "    for (int64_t i = 0; i < n; ++i) c = (c + none) + inc;\n",
        "    for (int64_t i = 0; i < n; ++i) c = c + (none + inc);\n",
    ),
    Mutant(
        "join-floats-takes-any-number",
        "_native/decode.cpp",
        "            if (!PyFloat_CheckExact(v)) return false;\n",
        "\n",
    ),
    Mutant(
        "decay-ratio-never-stops-at-the-floor",
        "_native/decode.cpp",
        "        if (cur <= lo && dec >= 0) break;\n",
        "\n",
    ),
    Mutant(
        "decay-ratio-max-keeps-a-nan-floor",
        "_native/decode.cpp",
        "        cur = lo > d ? lo : d;\n",
        "        cur = d > lo ? d : lo;\n",
    ),
    Mutant(
        "decay-ignores-an-int-ratio",
        "native/scheduler.py",
        "        if type(r) is NewTokenRatioTracker and type(cur) is type(dec) is type(lo) is float:\n",
        "        if type(r) is NewTokenRatioTracker:\n",
    ),
    Mutant(
        "fresh-direct-ignores-the-setup",
        "native/scheduler.py",
        "        self._fresh_direct = fresh and self._steps_direct()\n",
        "        self._fresh_direct = self._steps_direct()\n",
    ),
    Mutant(
        "loop-steps-at-the-arrival",
        "_native/loop.cpp",
        "PyObject_RichCompareBool(start.ptr(), ta.ptr(), Py_LT);",
        "PyObject_RichCompareBool(start.ptr(), ta.ptr(), Py_LE);",
    ),
    Mutant(
        "loop-forgets-the-chunked-request",
        "_native/loop.cpp",
        "    while (truth(waiting) || truth(running) || !get(sched, n.chunked_req).is_none()) {\n",
        "    while (truth(waiting) || truth(running)) {\n",
    ),
    Mutant(
        "loop-samples-kv-usage-of-free-only",
        "_native/loop.cpp",
        "    nb::object used = checked(PyNumber_Add(f.ptr(), e.ptr()));\n",
        "    nb::object used = f;\n",
    ),
    Mutant(
        "loop-drops-the-samples-of-a-raising-run",
        "_native/loop.cpp",
        "        if (!flush()) PyErr_Clear();\n",
        "        buf_.clear();\n",
    ),
    Mutant(
        "loop-reports-progress-before-adding",
        "_native/loop.cpp",
        "            done += py::len_of(finished);\n",
        "            done += 0;\n",
    ),
    Mutant(
        "loop-samples-a-step-that-came-back-none",
        "_native/loop.cpp",
        "        if (out.is_none()) {\n            stuck = true;\n            break;\n        }\n",
        "        if (out.is_none()) {\n            stuck = true;\n        }\n",
    ),
    Mutant(
        "open-loop-native-ignores-check-integrity",
        "sim/deploy/open_loop.py",
        "    if native is not None and not check_integrity:\n",
        "    if native is not None:\n",
    ),
    Mutant(
        "arrive-door-skips-the-duplicate-test",
        "_native/arrive.cpp",
        "    if (has || !get(r, n.priority).is_none()) return false;\n",
        "    if (!get(r, n.priority).is_none()) return false;\n",
    ),
    Mutant(
        "arrive-door-prompt-pages-floored",
        "_native/arrive.cpp",
        "    const int64_t pages = (fill + page - 1) / page * page;",
        "    const int64_t pages = fill / page * page;",
    ),
    Mutant(
        "arrive-door-forgets-the-processed-tokens",
        "_native/arrive.cpp",
        "        set(r, n.queue_entry_processed_tokens, processed);\n",
        "",
    ),
    Mutant(
        "arrive-door-forgets-the-default-priority",
        "_native/arrive.cpp",
        "        if (prio) set(r, n.priority, default_priority);\n",
        "",
    ),
    Mutant(
        "arrive-door-stamps-no-times-arrival",
        "_native/arrive.cpp",
        "        set(get(r, n.times), n.arrival, t);\n",
        "",
    ),
    Mutant(
        "arrive-queue-pass-ties-break-the-order",
        "_native/arrive.cpp",
        "PyObject_RichCompareBool(entry.ptr(), last.ptr(), Py_GE);",
        "PyObject_RichCompareBool(entry.ptr(), last.ptr(), Py_GT);",
    ),
    Mutant(
        "arrive-door-passes-a-huge-max-new",
        "_native/arrive.cpp",
        "    return overflow == 0;\n",
        "    if (overflow) out = 1;\n    return true;\n",
    ),
    Mutant(
        "deferred-never-builds-ahead-on-two-cpus",
        "sim/workloads/deferred.py",
        "        self._prefetch = usable_cpus() > 1\n",
        "        self._prefetch = usable_cpus() > 2\n",
    ),
    Mutant(
        "deferred-ahead-swallows-its-failure",
        "sim/workloads/deferred.py",
        "        if self._failed is not None:\n            raise self._failed\n",
        "        if self._failed is not None:\n            return []\n",
    ),
    Mutant(
        "prompts-built-alone-use-every-cpu",
        "sim/workloads/tokens.py",
        '    if getattr(_ALONE, "on", False):\n        return 1\n',
        "",
    ),
    Mutant(
        "mooncake-prompts-one-pad-key",
        "_native/prompts.cpp",
        "                const MooncakeShape s{block_salt, k[i], static_cast<size_t>(block), vocab};",
        "                const MooncakeShape s{block_salt, k[0], static_cast<size_t>(block), vocab};",
    ),
    Mutant(
        "fused-step-forgets-the-failed-request",
        "_native/prefill.cpp",
        "            if (!r.failed.is_none()) queue.attr(nb::handle(n.note_tried))(r.failed);\n",
        "\n",
    ),
    Mutant(
        "fused-step-keeps-the-batch-fullness",
        "_native/prefill.cpp",
        "            set(sched, n.batch_is_full, r.batch_is_full ? Py_True : Py_False);\n",
        "\n",
    ),
    Mutant(
        "fused-step-runs-when-nothing-extends",
        "_native/prefill.cpp",
        "        if (!extends) return nb::none();\n",
        "\n",
    ),
    Mutant(
        "fused-step-takes-nothing",
        "_native/prefill.cpp",
        "            queue_take(waiting, positions, f[0], f[1], f[2], std::move(moved), std::move(tried),\n"
        "                       std::move(added), f[3], f[4]);\n",
        "\n",
    ),
    Mutant(
        "fused-step-sets-no-chunked-request",
        "_native/prefill.cpp",
        "            set(sched, n.chunked_req, chunked);\n",
        "\n",
    ),
    Mutant(
        "fused-step-sees-no-chunked-request",
        "_native/prefill.cpp",
        "                             exclusive, slots, running, has_chunked, full};\n",
        "                             exclusive, slots, running, false, full};\n",
    ),
    Mutant(
        "fused-take-always-asks-the-queue",
        "_native/prefill.cpp",
        "        if (take_fixed.is_none() || native_take.is_none()) {  // the queue's own take\n",
        "        if (true) {\n",
    ),
    Mutant(
        "fused-take-ignores-a-native-take-off",
        "_native/prefill.cpp",
        "        if (take_fixed.is_none() || native_take.is_none()) {  // the queue's own take\n",
        "        if (take_fixed.is_none()) {\n",
    ),
    Mutant(
        "fused-step-ignores-a-declined-run",
        "_native/prefill.cpp",
        "        return res.is_none() ? nb::object(std::move(can_run)) : res;\n",
        "        return res;\n",
    ),
    Mutant(
        "continue-chunk-skips-the-checkpoint",
        "_native/prefill.cpp",
        "        if (ended > get_int(req, n.prefix_len)) kv_checkpoint(kv, req, ended);\n"
        "        const nb::object got",
        "        const nb::object got",
    ),
    Mutant(
        "continue-chunk-admits-at-the-extend-end",
        "_native/prefill.cpp",
        "            a = admission_rec_.make({req, get(req, n.prefix_len), t[0], t[1]});\n",
        "            a = admission_rec_.make({req, get(req, n.extend_end), t[0], t[1]});\n",
    ),
    Mutant(
        "fused-fresh-charges-nobody",
        "native/step.py",
        "        charges: list[tuple[Req, int]] | None = [] if s._charges else None\n"
        "        got = s.prefill_run.step(\n"
        "            s, s.native_adder, s.cache.tree, s.kv.native, q, order, ratio,",
        "        charges: list[tuple[Req, int]] | None = None\n"
        "        got = s.prefill_run.step(\n"
        "            s, s.native_adder, s.cache.tree, s.kv.native, q, order, ratio,",
    ),
    Mutant(
        "fused-outcome-forgets-the-charges",
        "native/step.py",
        "    if charges:\n        s._charge_prefill(charges)\n",
        "",
    ),
    Mutant(
        "middle-chunks-forget-the-charges",
        "native/scheduler.py",
        "        if charges:  # each chunk's tokens, charged in order\n"
        "            self._charge_prefill(charges)\n",
        "",
    ),
    Mutant(
        "extend-run-charges-the-prompt",
        "_native/prefill.cpp",
        "append(charges, nb::make_tuple(it.req, it.num_new));",
        "append(charges, nb::make_tuple(it.req, it.prompt));",
    ),
    Mutant(
        "chunks-charge-nothing",
        "_native/prefill.cpp",
        "            if (!charges.is_none()) append(charges, nb::make_tuple(req, shape.tokens));\n",
        "",
    ),
    Mutant(
        "prompt-block-views-a-writeable-prompt",
        "_native/kv.cpp",
        "    if (PyArray_TYPE(a) != NPY_INT32 || PyArray_NDIM(a) != 1 || PyArray_ISWRITEABLE(a) ||",
        "    if (PyArray_TYPE(a) != NPY_INT32 || PyArray_NDIM(a) != 1 ||",
    ),
    Mutant(
        "prompt-block-keeps-its-reference",
        "_native/kv.cpp",
        "        if (Py_IsInitialized() && PyGILState_Check()) Py_DECREF(obj);",
        "        if (Py_IsInitialized() && PyGILState_Check()) (void)obj;",
    ),
    Mutant(
        "checkpoint-views-the-joined-outputs",
        "_native/kv.cpp",
        "        if (aligned <= np) {  // (else `tokens` are the joined copy)",
        "        if (true) {  // (else `tokens` are the joined copy)",
    ),
    Mutant(
        "insert-copies-a-viewable-key",
        "_native/radix.cpp",
        "        key = SlotVec(tokens + rel, tokens + n_tokens, *key_share);",
        "        key.assign(tokens + rel, tokens + n_tokens);",
    ),
    Mutant(
        "split-copies-the-lower-key",
        "_native/radix.cpp",
        "    child.key.assign_tail(up->key, static_cast<size_t>(m));",
        "    child.key.assign(up->key.data() + m, up->key.data() + up->key.size());",
    ),
    Mutant(
        "fused-continued-ignores-covers",
        "native/step.py",
        "    fused = covered or admission.covers(s, b)\n",
        "    fused = True\n",
    ),
    Mutant(
        "fused-continued-ignores-a-new-chunked-request",
        "native/step.py",
        "    if b.new_chunked_req is None and not s.eos_ids and fused:\n",
        "    if not s.eos_ids and fused:\n",
    ),
    Mutant(
        "fused-outcome-joins-nothing",
        "native/step.py",
        "    d, n, tokens, finished, joined, size = got\n    s.batch.extend(joined)\n",
        "    d, n, tokens, finished, joined, size = got\n",
    ),
    Mutant(
        "packed-times-ends-in-items-not-bytes",
        "sim/workloads/deferred.py",
        "    ends = itertools.accumulate(8 * n for n in lens)",
        "    ends = itertools.accumulate(n for n in lens)",
    ),
    Mutant(
        "build-copy-drops-the-session",
        "sim/workloads/deferred.py",
        "    return _Draft(d.prompt, d.output_len, d.session, fill=d.fill, source=d.source, length=d.length)",
        "    return _Draft(d.prompt, d.output_len, 0, fill=d.fill, source=d.source, length=d.length)",
    ),
    Mutant(
        "deferred-builder-never-closed",
        "sim/workloads/deferred.py",
        "            self._builder.close()  # every batch built (however reached): the thread ends\n",
        "            pass\n",
    ),
    Mutant(
        "deferred-builder-outlives-its-requests",
        "sim/workloads/deferred.py",
        "        weakref.finalize(self, self._builder.close)\n",
        "",
    ),
    Mutant(
        "joined-reads-any-array-as-doubles",
        "results/requests.py",
        '    if all(type(s) is array and s.typecode == "d" for s in seqs):',
        "    if all(type(s) is array for s in seqs):",
    ),
    Mutant(
        "std-halves-not-on-numpys-split",
        "results/stats.py",
        "    half -= half % 8\n",
        "",
    ),
    Mutant(
        "std-splits-numpys-blocks",
        "results/stats.py",
        "_PAIRWISE_BLOCK = 128",
        "_PAIRWISE_BLOCK = 64",
    ),
    Mutant(
        "percentiles-skip-the-zero-check-at-a-zero-minimum",
        "results/stats.py",
        "    return not (part.min() > 0 or part.max() < 0)",
        "    return not (part.min() >= 0 or part.max() < 0)",
    ),
    Mutant(
        "trace-lines-take-a-key-twice",
        "_native/trace_lines.cpp",
        "        if (which < 0 || seen[which]) return false;",
        "        if (which < 0) return false;",
    ),
    Mutant(
        "trace-lines-take-integers-past-2-53",
        "_native/trace_lines.cpp",
        "            if (v > kExact) return false;\n",
        "",
    ),
    Mutant(
        "fast-records-keep-every-hash-id",
        "sim/workloads/mooncake_lines.py",
        "    ends = starts + np.minimum(c, -(-np.array(inputs, dtype=np.int64) // block))",
        "    ends = starts + c",
    ),
    Mutant(
        "native-block-takes-any-input-length",
        "sim/workloads/mooncake_lines.py",
        "    if not (inputs.min() > 0 and inputs.max() <= MAX_PROMPT_TOKENS and outputs.min() > 0):",
        "    if not (inputs.min() > 0 and outputs.min() > 0):",
    ),
    Mutant(
        "clock-jump-to-moves-on-a-tie",
        "clock.py",
        "        if t > self._t:\n",
        "        if t >= self._t:\n",
    ),
    Mutant(
        "rid-hash-encodes-any-rid-as-a-str",
        "sim/cost/runner.py",
        '        state.update(rid.encode() if type(rid) is str else f"{rid}".encode())\n',
        "        state.update(rid.encode())  # type: ignore[attr-defined]\n",
    ),
    Mutant(
        "native-tokens-kept-across-a-new-seed",
        "sim/cost/runner.py",
        "        if self.vocab_size is self._recipe_vocab and got[0].seed == self.seed:\n",
        "        if self.vocab_size is self._recipe_vocab:\n",
    ),
    Mutant(
        "native-tokens-kept-across-a-new-vocab",
        "sim/cost/runner.py",
        "        if self.vocab_size is self._recipe_vocab and got[0].seed == self.seed:\n",
        "        if self._recipe_vocab is not None and got[0].seed == self.seed:\n",
    ),
    Mutant(
        "native-step-kept-across-a-new-cost",
        "sim/cost/runner.py",
        "        if made[0] is self.cost and made[1] is self.vocab_size and made[2] is self.seed:\n",
        "        if made[0] is not None and made[1] is self.vocab_size and made[2] is self.seed:\n",
    ),
    Mutant(
        "native-step-kept-across-a-new-vocab",
        "sim/cost/runner.py",
        "        if made[0] is self.cost and made[1] is self.vocab_size and made[2] is self.seed:\n",
        "        if made[0] is self.cost and made[2] is self.seed:\n",
    ),
    Mutant(
        "native-step-kept-across-a-new-seed",
        "sim/cost/runner.py",
        "        if made[0] is self.cost and made[1] is self.vocab_size and made[2] is self.seed:\n",
        "        if made[0] is self.cost and made[1] is self.vocab_size:\n",
    ),
    Mutant(
        "native-step-offered-without-tokens",
        "native/runner.py",
        "        if cost is None or tokens is None:\n",
        "        if cost is None:\n",
    ),
    Mutant(
        "fused-outcome-finished-as-retracted",
        "native/step.py",
        "    # (positional, the fields' order: a keyword call costs a third more)\n"
        '    return StepOutcome("extend", d, size, 1, n, finished, [], tokens)\n',
        "    # (positional, the fields' order: a keyword call costs a third more)\n"
        '    return StepOutcome("extend", d, size, 1, n, [], finished, tokens)\n',
    ),
    Mutant(
        "batch-outcome-finished-as-retracted",
        "native/step.py",
        '            return StepOutcome("extend", d, size, 1, n, finished, [], tokens)  # (positional)\n',
        '            return StepOutcome("extend", d, size, 1, n, [], finished, tokens)  # (positional)\n',
    ),
    Mutant(
        "compact-cuts-a-long-prompt-short",
        "sim/workloads/deferred.py",
        "        r.prompt_ids = shared_stand_in(n) if s is None else s\n",
        "        r.prompt_ids = _STAND_INS[:n] if s is None else s\n",
    ),
    Mutant(
        "compact-cuts-a-long-output-short",
        "sim/workloads/deferred.py",
        "        r.output_ids = shared_stand_in(n) if s is None else s  # type: ignore[assignment]\n",
        "        r.output_ids = _STAND_INS[:n] if s is None else s  # type: ignore[assignment]\n",
    ),
    Mutant(
        "through-builds-when-already-built",
        "sim/workloads/deferred.py",
        "        if j > self._built:\n            self._build_through(j - 1)\n",
        "        if j >= self._built:\n            self._build_through(j - 1)\n",
    ),
    Mutant(
        "through-builds-one-short",
        "sim/workloads/deferred.py",
        "        if j > self._built:\n            self._build_through(j - 1)\n",
        "        if j > self._built:\n            self._build_through(j - 2)\n",
    ),
    Mutant(
        "evictor-binds-over-an-evict-of-its-own",
        "native/scheduler.py",
        '        getattr(evict, "__func__", None) is native_radix.NativeRadixCache.evict\n',
        "        True\n",
    ),
    Mutant(
        "evictor-binds-to-any-pool",
        "native/scheduler.py",
        "        and type(pool) is cache._pool_type\n",
        "        and True\n",
    ),
    Mutant(
        "open-loop-skips-the-last-arrivals-steps",
        "sim/deploy/open_loop.py",
        "    steps(math.inf, None, done)  # the last arrival's steps: until the replica is idle\n",
        "",
    ),
    Mutant(
        "vclock-reads-past-a-replaced-method",
        "_native/vclock.hpp",
        "    return Py_TYPE(clock) == k.type && _PyType_Lookup(k.type, name) == fn;",
        "    return Py_TYPE(clock) == k.type;",
    ),
    Mutant(
        "vclock-reads-past-any-bound-now",
        "_native/vclock.hpp",
        "    if (PyMethod_Check(bound.ptr()) && PyMethod_GET_FUNCTION(bound.ptr()) == k.now &&",
        "    if (PyMethod_Check(bound.ptr()) &&",
    ),
    Mutant(
        "vclock-never-jumps-forward",
        "_native/vclock.hpp",
        "PyObject_RichCompareBool(t.ptr(), cur.ptr(), Py_GT);",
        "PyObject_RichCompareBool(t.ptr(), cur.ptr(), Py_LT);",
    ),
    Mutant(
        "bulk-pack-times-first-float-everywhere",
        "_native/bulk.cpp",
        "            dst[j] = PyFloat_AS_DOUBLE(v);",
        "            dst[j] = PyFloat_AS_DOUBLE(PyList_GET_ITEM(seq, 0));",
    ),
    Mutant(
        "bulk-columns-complete-without-a-finish-time",
        "_native/bulk.cpp",
        "        if (how == kEnded && p[2 * n + i]) completed.append",
        "        if (how == kEnded) completed.append",
    ),
    Mutant(
        "bulk-columns-token-mask-from-scheduled",
        "_native/bulk.cpp",
        "            !read_time(py::get(tm, k.first_token), t[2 * n + i], p[n + i]) ||",
        "            !read_time(py::get(tm, k.first_token), t[2 * n + i], p[i]) ||",
    ),
    Mutant(
        "bulk-columns-any-finish-an-abort",
        "_native/bulk.cpp",
        "                           : py::get(fin, k.reason).ptr() == abort.ptr() ? kAborted",
        "                           : py::get(fin, k.reason).ptr() != nullptr ? kAborted",
    ),
    Mutant(
        "bulk-clone-shares-the-templates-lists",
        "_native/bulk.cpp",
        "            Py_SETREF(py::detail::slot_at(o, at), fresh);",
        "            Py_DECREF(fresh);",
    ),
    Mutant(
        "bulk-clone-takes-each-columns-first",
        "_native/bulk.cpp",
        "            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(PyList_GET_ITEM(column, i)));",
        "            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(PyList_GET_ITEM(column, 0)));",
    ),
    Mutant(
        "bulk-copy-slots-copies-the-template",
        "_native/bulk.cpp",
        "            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(py::detail::slot_at(src, at)));",
        "            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(py::detail::slot_at(like.ptr(), at)));",
    ),
    Mutant(
        "bulk-gaps-from-each-first-time",
        "_native/bulk.cpp",
        "            for (Py_ssize_t k = 1; k < n; ++k) dst[at++] = t[k] - t[k - 1];",
        "            for (Py_ssize_t k = 1; k < n; ++k) dst[at++] = t[k] - t[0];",
    ),
    Mutant(
        "packed-times-keep-a-native-decline",
        "sim/workloads/deferred.py",
        '        return [array("d", s) for s in seqs] if packed is None else packed',
        "        return packed or []",
    ),
    Mutant(
        "compact-stand-ins-not-shared",
        "sim/workloads/deferred.py",
        "        s = _SHARED[n] = stand_in(n)",
        "        s = stand_in(n)",
    ),
    Mutant(
        "built-prompts-left-writeable",
        "sim/workloads/load.py",
        "            d.prompt.flags.writeable = False",
        "            pass",
    ),
    Mutant(
        "native-columns-complete-without-a-finish-time",
        "results/reqarrays.py",
        "    completed = (code == _ENDED) & present[2]",
        "    completed = code == _ENDED",
    ),
    Mutant(
        "cloned-requests-ignore-other-fields",
        "sim/workloads/load.py",
        "    if clone is None or not ds or not all(_all_none(map(f, ds)) for f in _EXTRAS):",
        "    if clone is None or not ds:",
    ),
    Mutant(
        "clone-template-never-checked",
        "sim/workloads/load.py",
        "    if _differing(a, b) != _PER_REQUEST or _differing(a.times, b.times) != _PER_TIMES:",
        "    if False:",
    ),
    Mutant(
        "cloned-drafts-all-one-session",
        "sim/workloads/traces.py",
        '            "session": list(range(len(stamps))),',
        '            "session": [0] * len(stamps),',
    ),
    Mutant(
        "buffered-blocks-keep-the-newline",
        "sim/workloads/mooncake_lines.py",
        "            held = end - cut - 1",
        "            held = end - cut",
    ),
    Mutant(
        "series-columns-may-be-views",
        "results/series.py",
        "        return SeriesArrays(*(np.array(rows[:, j]) for j in range(_COLS)))  # (each a copy)",
        "        return SeriesArrays(*(np.asarray(rows[:, j]) for j in range(_COLS)))  # (each a copy)",
    ),
    Mutant(
        "bulk-count-buckets-count-each-bucket-once",
        "_native/bulk.cpp",
        "        ++c[b];",
        "        c[b] = 1;",
    ),
    Mutant(
        "bulk-keep-buckets-keep-every-gap",
        "_native/bulk.cpp",
        "        if (k[b]) dst[at++] = v[i];",
        "        dst[at++] = v[i];",
    ),
    Mutant(
        "first-late-at-the-limit",
        "sim/workloads/mooncake_lines.py",
        "    over = np.flatnonzero((np.array(stamps, dtype=np.float64) - t0) / 1e3 > MAX_ARRIVAL_S)",
        "    over = np.flatnonzero((np.array(stamps, dtype=np.float64) - t0) / 1e3 >= MAX_ARRIVAL_S)",
    ),
    Mutant(
        "keys-after-skip-the-first-part",
        "sim/workloads/tokens.py",
        "    keys = (column ^ np.uint64(_key(first))) * np.uint64(_GOLDEN)",
        "    keys = (column ^ np.uint64(first)) * np.uint64(_GOLDEN)",
    ),
    Mutant(
        "all-none-by-the-wrong-identity",
        "sim/workloads/load.py",
        "    return not any(map(operator.is_not, values, itertools.repeat(None)))",
        "    return not any(map(operator.is_, values, itertools.repeat(None)))",
    ),
)


class Verdict(NamedTuple):
    mutant: Mutant
    killed: bool
    seconds: float
    by: str  # the first failing test


def _native_lib() -> str:
    """The built extension the unmutated runs load (``RADIXSCHED_NATIVE_LIB``, else the
    installed one)."""
    path = os.environ.get("RADIXSCHED_NATIVE_LIB")
    if not path:
        spec = importlib.util.find_spec("radixsched._native._core")
        path = spec.origin if spec is not None else None
    if not path:
        raise SystemExit("the mutation check needs the native core built (pip install -e .)")
    return path


def _build(copy: Path) -> str:
    """The copy's (mutated) native sources built in Release into ``copy``/build; the module."""
    root = copy / "native-src"
    shutil.rmtree(root, ignore_errors=True)
    (root / "src").mkdir(parents=True)
    shutil.copy(ROOT / "CMakeLists.txt", root)
    shutil.copytree(copy / "radixsched", root / "src" / "radixsched")
    build = copy / "build"
    bindir = Path(sys.executable).parent
    cmake = shutil.which("cmake", path=str(bindir)) or "cmake"
    ninja = shutil.which("ninja", path=str(bindir)) or "ninja"
    for cmd in (
        [cmake, "-S", str(root), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}", f"-DCMAKE_MAKE_PROGRAM={ninja}"],
        [cmake, "--build", str(build)],
    ):  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    return str(next(build.glob("_core*.so")))


# Put first in the copy's folder (on PYTHONPATH): an editable install's import hook would
# otherwise import the checkout's radixsched, not the mutated copy.
_SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
"""


def _env(copy: Path, native_lib: str) -> dict[str, str]:
    (copy / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "PYTHONDONTWRITEBYTECODE": "1",
        "RADIXSCHED_NATIVE": "1",
        "RADIXSCHED_NATIVE_LIB": native_lib,
    }
    probe = "import radixsched; print(radixsched.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if not where.startswith(str(copy)):
        raise SystemExit(f"the mutated copy is not what Python imports ({where})")
    return env


def _check(m: Mutant, copy: Path, tests: list[str], native_lib: str) -> Verdict:
    path = copy / "radixsched" / m.file
    source = path.read_text()
    if source.count(m.original) != 1:
        raise SystemExit(f"{m.id}: its original text occurs {source.count(m.original)} times")
    path.write_text(source.replace(m.original, m.mutated))
    # The accelerated core runs over the native core only: a Python mutant runs with the built
    # extension, a C++ one with the mutated sources built into a scratch folder.
    t0 = time.monotonic()
    try:
        lib = _build(copy) if m.file.startswith("_native/") else native_lib
        run = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"),
                *("--hypothesis-seed", "0", *tests),
            ],
            cwd=ROOT,
            env=_env(copy, lib),
            capture_output=True,
            text=True,
        )
    finally:
        path.write_text(source)
    if run.returncode not in (0, 1):  # not a test failure: a collection error, a crash...
        raise SystemExit(f"{m.id}: pytest exited {run.returncode}\n{run.stdout[-3000:]}")
    failed = [
        ln.removeprefix("FAILED ") for ln in run.stdout.splitlines() if ln.startswith("FAILED")
    ]
    return Verdict(m, run.returncode == 1, time.monotonic() - t0, failed[0] if failed else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=None, metavar="ID")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--tests", nargs="+", default=list(TESTS))
    args = ap.parse_args()
    console = Console(width=150)
    chosen = [m for m in MUTANTS if args.only is None or m.id in args.only]
    if args.list:
        for m in chosen:
            console.print(f"{m.id:40s} {m.file}")
        return 0
    verdicts = []
    native_lib = _native_lib()
    with tempfile.TemporaryDirectory() as d:
        copy = Path(d)
        shutil.copytree(PACKAGE, copy / "radixsched", ignore=shutil.ignore_patterns("__pycache__"))
        for m in chosen:
            v = _check(m, copy, args.tests, native_lib)
            verdicts.append(v)
            console.print(
                f"{m.id}: {'killed' if v.killed else '[red]SURVIVED[/]'} ({v.seconds:.0f} s)"
            )
    table = Table(title="accelerator mutants against the equivalence tests")
    for col in ("mutant", "file", "verdict", "first failing test"):
        table.add_column(col)
    for v in verdicts:
        verdict = "killed" if v.killed else "[red]survived[/]"
        table.add_row(v.mutant.id, v.mutant.file, verdict, v.by)
    console.print(table)
    survived = [v for v in verdicts if not v.killed]
    console.print(f"{len(verdicts) - len(survived)} of {len(verdicts)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
