"""SGLang-compat matching of a whole waiting queue in one native call
(``NativeRadixCache.match_nodes``, behind ``NativeWaitingQueue.match_all``) against the reference
queue's Python loop (``WaitingQueue.match_all``'s node matching) over the reference
``RadixCache`` and over ``NativeRadixCache``: the same request fields (values and types), the
same device lengths and DFS order, and the same tree after (nodes, splits, access times, clock).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fakes import tree_snapshot
from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.policies import Round
from radixsched.queue import WaitingQueue
from radixsched.request import Req

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

Spec = tuple[list[int], list[int], str | None, str | None]  # prompt, outputs, extra_key, salt


def _req(i: int, spec: Spec) -> Req:
    prompt, outputs, extra, salt = spec
    r = Req(f"r{i}", np.asarray(prompt, dtype=np.int32), extra_key=extra, cache_salt=salt)
    r.output_ids.extend(outputs)
    return r


def _fields(r: Req) -> tuple[Any, ...]:
    vals = (r.prefix_len, r.host_hit_len, r.num_matched_prefix_tokens)
    return (*vals, tuple(map(type, vals)), r.last_node.id, len(r.last_node))


def _rounds(
    queue: WaitingQueue, cached: list[tuple[list[int], Any]], specs: list[Spec], tree: bool
) -> list[Any]:
    """Fill the queue's cache, then two rounds of matching (the second over the first's
    splits and refreshed times): what each round gives and leaves."""
    cache, page = queue.cache, queue.cache.page_size
    for tokens, ns in cached:
        n = len(tokens) - len(tokens) % page
        cache.insert(CacheKey(np.asarray(tokens[:n], dtype=np.int32), ns), np.arange(1, n + 1))
    queue.reqs = [_req(i, s) for i, s in enumerate(specs)]
    seen: list[Any] = []
    for _ in range(2):
        rnd = Round(queue.config)
        device = queue.match_all(rnd, True, tree)
        order = rnd.tree_order() if rnd.tree_order is not None else None
        seen.append((device, order, [_fields(r) for r in queue.reqs], tree_snapshot(cache)))
    return seen


def _check(
    cached: list[tuple[list[int], Any]],
    specs: list[Spec],
    page: int = 1,
    tree: bool = True,
    disable: bool = False,
) -> list[Any]:
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    cfg = SchedulerConfig(schedule_policy="dfs-weight", compat="sglang", page_size=page)
    kw: dict[str, Any] = {"page_size": page, "disable": disable, "compat_sglang": True}
    ref = _rounds(WaitingQueue(cfg, RadixCache(None, **kw)), cached, specs, tree)
    loop = _rounds(WaitingQueue(cfg, NativeRadixCache(None, **kw)), cached, specs, tree)
    fast = NativeWaitingQueue(cfg, NativeRadixCache(None, **kw))
    assert fast.native_nodes  # the native call, not the inherited loop
    got = _rounds(fast, cached, specs, tree)
    assert got == ref
    assert got == loop
    return got


def test_a_partial_match_splits_a_node_and_ticks_the_clock() -> None:
    got = _check([([1, 2, 3, 4, 5, 6, 7, 8], None)], [([1, 2, 3, 9], [], None, None)])
    device, _, fields, (clock, count, _) = got[0]
    assert device == [3]
    assert fields[0][:3] == (3, 0, 3) and fields[0][-1] == 3  # ends at the split's upper part
    assert count == 2  # [1 2 3] and [4 .. 8] (the root is not listed)
    assert got[1][3][0] > clock  # the second round's walk ticked it again


def test_the_cap_at_fill_len_minus_one_and_a_miss() -> None:
    got = _check(
        [([1, 2, 3, 4], None)],
        [([1, 2, 3, 4], [], None, None), ([7, 7], [], None, None), ([1, 2], [], None, None)],
    )
    assert got[0][0] == [4, 0, 2]
    assert [f[2] for f in got[0][2]] == [3, 0, 1]  # num_matched_prefix_tokens, capped


def test_short_keys_under_page_size_16() -> None:
    head = list(range(100, 132))
    specs: list[Spec] = [
        (head[:10], [], None, None),  # shorter than a page: nothing to match
        (head[:20], [], None, None),  # one whole page
        (head, [], None, None),  # the whole cached run: capped at 31
        ([*head[:16], 5, 5], [], None, None),
    ]
    got = _check([(head, None)], specs, page=16)
    assert got[0][0] == [0, 16, 32, 16]
    assert got[0][2][2][2] == 31


def test_output_tokens_are_appended_to_the_prompt() -> None:
    cached = [([1, 2, 3, 4, 5, 6], None)]
    got = _check(cached, [([1, 2, 3], [4, 5], None, None), ([1, 2], [9], None, None)])
    assert got[0][0] == [5, 2]
    assert got[0][2][0][2] == 4  # min(5, fill_len 5 - 1)


def test_namespaces_never_share_a_prefix() -> None:
    tokens = [1, 2, 3, 4, 5]
    cached = [(tokens, None), (tokens[:3], ("a", None)), (tokens[:2], (None, "s"))]
    specs: list[Spec] = [
        (tokens, [], "a", None),
        (tokens, [], None, "s"),
        (tokens, [], None, ""),  # an empty salt is the default namespace
        (tokens, [], "b", None),  # a namespace nothing was cached in
    ]
    got = _check(cached, specs)
    assert got[0][0] == [3, 2, 5, 0]


def test_a_disabled_cache_matches_nothing_and_never_ticks() -> None:
    got = _check([([1, 2, 3], None)], [([1, 2, 3, 4], [], None, None)], disable=True)
    device, _, fields, (clock, _, _) = got[0]
    assert device == [0] and fields[0][:3] == (0, 0, 0)
    assert got[1][3][0] == clock


def test_the_ends_order_the_dfs_and_are_none_without_tree() -> None:
    from radixsched.native.radix import NativeRadixCache

    cached = [([1, 2, 3, 4], None), ([1, 2, 5, 6], None), ([8, 9], None)]
    specs: list[Spec] = [([8, 9, 9], [], None, None), ([1, 2, 5], [], None, None)]
    specs += [([1, 2, 3, 4, 4], [], None, None), ([1, 7], [], None, None)]
    got = _check(cached, specs)
    assert got[0][1] is not None and sorted(got[0][1]) == [0, 1, 2, 3]
    _check(cached, specs, tree=False)  # no DFS: the same fields and tree
    cache = NativeRadixCache(None)
    for tokens, ns in cached:
        cache.insert(CacheKey(np.asarray(tokens, dtype=np.int32), ns), np.arange(1, 5))
    reqs = [_req(i, s) for i, s in enumerate(specs)]
    device, ends = cache.match_nodes(reqs, True)
    assert ends == [(r.last_node, len(r.last_node)) for r in reqs]
    assert device == [r.prefix_len for r in reqs]
    assert cache.match_nodes(reqs, False)[1] is None


def test_a_strided_prompt_is_read_as_its_tokens() -> None:
    from radixsched.native.radix import NativeRadixCache

    cache = NativeRadixCache(None)
    cache.insert(CacheKey(np.asarray([0, 2, 4, 6], dtype=np.int32)), np.arange(1, 5))
    r = Req("s", np.arange(10, dtype=np.int32)[::2])  # a view, not C-contiguous
    assert not r.prompt_ids.flags.c_contiguous
    assert cache.match_nodes([r], False)[0] == [4]
    assert r.num_matched_prefix_tokens == 4


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("disable", [False, True])
def test_touch_prefixes_walks_each_key_as_touch_prefix_does(page: int, disable: bool) -> None:
    """``NativeRadixCache.touch_prefixes`` (one native call) leaves the tree as
    ``touch_prefix`` of each key in order leaves it, and as the reference tree's own: the
    clock, the access times and the splits (a partial match splits; an empty or short key,
    a miss and another namespace only tick or skip as their walk would)."""
    from radixsched.native.radix import NativeRadixCache

    p = page
    cached = [(list(range(1, 8 * p + 1)), None), (list(range(1, 4 * p + 1)), ("x", None))]
    keys = [
        CacheKey(np.arange(1, 3 * p + 2, dtype=np.int32), None),  # splits at 3 pages
        CacheKey(np.zeros(0, dtype=np.int32), None),  # empty: skipped, no tick
        CacheKey(np.arange(1, p, dtype=np.int32), None),  # under a page: a tick only
        CacheKey(np.arange(50, 50 + 2 * p, dtype=np.int32), None),  # a miss
        CacheKey(np.arange(1, 2 * p + 1, dtype=np.int32), ("x", None)),  # its own namespace
        CacheKey(np.arange(1, 8 * p + 1, dtype=np.int64), None),  # converted, whole match
    ]
    kw: dict[str, Any] = {"page_size": p, "disable": disable}
    trees = [RadixCache(None, **kw), NativeRadixCache(None, **kw), NativeRadixCache(None, **kw)]
    for cache in trees:
        for tokens, ns in cached:
            cache.insert(CacheKey(np.asarray(tokens, dtype=np.int32), ns), np.arange(len(tokens)))
    ref, each, batch = trees
    ref.touch_prefixes(iter(keys))
    for key in keys:
        each.touch_prefix(key)
    batch.touch_prefixes(iter(keys))
    assert tree_snapshot(batch) == tree_snapshot(each) == tree_snapshot(ref)
    walks = 5 if p > 1 else 4  # at page 1 the short key is empty too
    assert tree_snapshot(batch)[0] == (0 if disable else 2 + walks)  # the inserts tick too


def test_touch_prefixes_refuses_a_key_that_is_not_a_pair() -> None:
    from radixsched.native.radix import NativeRadixCache

    with pytest.raises(TypeError, match="touch_prefixes: the key must be"):
        NativeRadixCache(None).touch_prefixes([np.arange(3, dtype=np.int32)])  # type: ignore[list-item]


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("disable", [False, True])
def test_read_only_matching_in_one_call_is_the_loops(page: int, disable: bool) -> None:
    """The loop's read-only branch (a policy that reads matches but does not walk: fair, spf
    under compat): the same device lengths and capped matches as the reference loop on
    either tree, and the tree untouched (no tick, no touch, no split)."""
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    p = page
    cached = [(list(range(1, 8 * p + 1)), None), (list(range(1, 4 * p + 1)), ("x", None))]
    specs: list[Spec] = [
        (list(range(1, 3 * p + 2)), [], None, None),  # a partial match: no split here
        (list(range(1, 8 * p + 1)), [], None, None),  # all cached: capped at fill_len - 1
        (list(range(1, 6 * p + 1)), list(range(6 * p + 1, 8 * p + 1)), None, None),  # outputs
        (list(range(1, 2 * p + 1)), [], "x", None),  # its own namespace
        (list(range(1, 2 * p + 1)), [], "x", ""),  # an empty salt: the same namespace
        (list(range(90, 90 + p)), [], None, None),  # a miss
    ]
    cfg = SchedulerConfig(schedule_policy="fair", compat="sglang", page_size=p)
    kw: dict[str, Any] = {"page_size": p, "disable": disable, "compat_sglang": True}
    seen = []
    for queue in (
        WaitingQueue(cfg, RadixCache(None, **kw)),
        WaitingQueue(cfg, NativeRadixCache(None, **kw)),
        NativeWaitingQueue(cfg, NativeRadixCache(None, **kw)),
    ):
        cache = queue.cache
        for tokens, ns in cached:
            n = len(tokens) - len(tokens) % p
            key = CacheKey(np.asarray(tokens[:n], dtype=np.int32), ns)
            cache.insert(key, np.arange(1, n + 1))
        before = tree_snapshot(cache)
        queue.reqs = [_req(i, s) for i, s in enumerate(specs)]
        rnd = Round(queue.config)
        device = queue.match_all(rnd, False, False)
        assert tree_snapshot(cache) == before  # read-only
        got = [(r.num_matched_prefix_tokens, type(r.num_matched_prefix_tokens)) for r in queue.reqs]
        seen.append((device, got, rnd.tree_order))
    assert seen[0] == seen[1] == seen[2]
    if not disable:
        whole = (3 * p + 1) // p * p  # the partial key's whole pages, all cached
        assert seen[2][0][:2] == [whole, 8 * p] and seen[2][1][1][0] == 8 * p - 1


@pytest.mark.parametrize("threshold", [-1, 0, 4, 6])
@pytest.mark.parametrize("check", [-1, 0, 3, 100])
def test_compat_dedup_in_one_call_is_the_loops(threshold: int, check: int) -> None:
    """SGLang's dedup (a group's first member represents it) in one native call: the same
    deferred ids as the reference's for every threshold and check, with groups split by
    namespace (an empty salt is the default one, as ``Req`` normalises it),
    output tokens in the group's key, fills shorter than the threshold left out, and the
    device match above the check excluding a request."""
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    base = [1, 2, 3, 4, 5, 6, 7, 8]
    specs: list[Spec] = [
        (base, [], None, None),
        ([*base[:5], 9], [], None, None),  # shares 5 tokens with the first
        (base, [], "x", None),  # another namespace
        (base, [], None, ""),  # an empty salt: the default namespace
        (base[:3], [7], None, None),  # outputs: 4 tokens
        (base[:2], [], None, None),  # shorter than the threshold
        (base, [], None, None),
        (base[:4], [5, 6], None, None),  # its outputs complete the first's 6 tokens
    ]
    device = [0, 2, 1, 0, 5, 0, 3, 0]
    cfg = SchedulerConfig(
        schedule_policy="fair",
        compat="sglang",
        in_batch_prefix_check_threshold=check,
        in_batch_prefix_deprioritize_threshold=threshold,
    )
    got = []
    for queue in (
        WaitingQueue(cfg, NativeRadixCache(None)),
        NativeWaitingQueue(cfg, NativeRadixCache(None)),
    ):
        queue.reqs = [_req(i, s) for i, s in enumerate(specs)]
        got.append(queue.dedup(device, Round(cfg)))
    assert got[0] == got[1]
    if check == 100 and threshold == 6:
        assert got[1] == frozenset({"r3", "r6", "r7"})  # r0 represents them
