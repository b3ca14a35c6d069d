"""A checkpoint's leaf views its key in the request's prompt (``_native/kv.cpp``'s
``prompt_block``, radix.hpp's ``Node::key``): a read-only int32 prompt is held by reference,
not copied, while a leaf holds at least 1/16 of it; anything else is copied. Either way the
tree's keys and slots are the reference's."""

from __future__ import annotations

import gc
import sys
from typing import Any

import numpy as np
import pytest

from radixsched.kv import KVManager
from radixsched.native import core
from radixsched.request import Req, SamplingParams
from test_native_kv_rows import _twins

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _prompt(tokens: list[int], *, read_only: bool = True) -> np.ndarray:
    p = np.asarray(tokens, dtype=np.int32)
    p.flags.writeable = not read_only
    return p


def _run(kv: KVManager, rid: str, prompt: Any, *, upto: int | None = None) -> Req:
    """Admit a request (its cached prefix taken), compute its fill up to ``upto`` (all of it
    by default) and cache that."""
    r = Req(rid, prompt, SamplingParams(max_new_tokens=8))
    kv.match_for_admission(r)
    r.lock_node = r.last_node
    kv.cache.inc_lock_ref(r.lock_node)
    kv.take_prefix(r)
    end = r.fill_len if upto is None else upto
    kv.grow([r], [end])
    r.kv_len = end
    kv.checkpoint(r, end)
    return r


def _same_trees(ref: KVManager, fast: KVManager) -> None:
    assert sorted(ref.cache.all_values().tolist()) == sorted(fast.cache.all_values().tolist())
    assert ref.cache.evict(4096) == fast.cache.evict(4096)


def test_a_read_only_prompts_leaf_views_it_and_holds_a_reference_until_evicted() -> None:
    _, fast = _twins(1024)
    prompt = _prompt(list(range(100, 164)))
    before = sys.getrefcount(prompt)
    a = _run(fast, "a", prompt)
    leaf: Any = a.last_node
    assert leaf.key_block == len(prompt) == len(leaf) == 64  # viewed, not copied
    assert leaf.key.tolist() == list(range(100, 164))
    fast.release(a, cache_kv=True)
    del a
    gc.collect()
    assert sys.getrefcount(prompt) == before + 1  # the leaf's reference
    assert fast.cache.evict(64) == 64  # the leaf goes, and its reference with it
    del leaf
    gc.collect()
    assert sys.getrefcount(prompt) == before


def test_a_viewed_key_outlives_its_request_and_every_other_reference() -> None:
    _, fast = _twins(1024)
    a = _run(fast, "a", _prompt(list(range(7, 71))))
    fast.release(a, cache_kv=True)
    del a  # the prompt's only holder is now the leaf
    gc.collect()
    query = _prompt(list(range(7, 71)) + [1] * 8)
    match = fast.cache.match_prefix((query, None))
    assert match.device_len == 64  # matched against the viewed key
    assert match.indices.tolist() == list(range(1, 65))
    leaf: Any = match.last_node
    assert leaf.key.tolist() == list(range(7, 71)) and leaf.key_block == 64
    b = _run(fast, "b", query)  # its leaf: the last 8 of its 72 tokens, a view of them
    tail: Any = b.last_node
    assert tail.key.tolist() == [1] * 8 and tail.key_block == 72


@pytest.mark.parametrize(
    "make",
    [
        lambda t: _prompt(t, read_only=False),  # writeable: somebody may write it
        lambda t: np.asarray(t, dtype=np.int64),  # not int32: converted
        lambda t: _prompt([x for x in t for _ in (0, 1)])[::2],  # strided
    ],
    ids=["writeable", "int64", "strided"],
)
def test_a_prompt_the_tree_cannot_view_is_copied(make: Any) -> None:
    """The leaf (the last 32 of the prompt's 40 tokens, its first 8 cached before) holds a
    block of its own: a later write into a writeable prompt does not reach the tree."""
    ref, fast = _twins(1024)
    tokens = list(range(300, 340))
    for kv in (ref, fast):
        kv.release(_run(kv, "p", _prompt(tokens[:8])), cache_kv=True)
        prompt = make(tokens)
        a = _run(kv, "a", prompt)
        if kv is fast:
            leaf: Any = a.last_node
            assert leaf.key_block == len(leaf) == 32 and leaf.key.tolist() == tokens[8:]
            if prompt.flags.writeable:
                prompt[8:] = -1
                assert leaf.key.tolist() == tokens[8:]
        kv.release(a, cache_kv=True)
    _same_trees(ref, fast)


def test_a_stand_in_prompt_is_copied() -> None:
    _, fast = _twins(1024)
    stand_in = np.broadcast_to(np.zeros(1, dtype=np.int32), (32,))  # stride 0, read-only
    a = _run(fast, "a", stand_in)
    leaf: Any = a.last_node
    assert leaf.key_block == 32 and leaf.key.tolist() == [0] * 32


def test_a_split_and_a_tail_eviction_view_or_copy_by_length() -> None:
    """The parts of a split view the prompt or copy their keys by SlotVec's 1/16 rule, as a
    leaf cut by eviction does; the keys stay the reference's."""
    ref, fast = _twins(1024)
    for kv in (ref, fast):
        c = _run(kv, "c", _prompt(list(range(100, 180))))  # 80 tokens, viewed
        d = _run(kv, "d", _prompt(list(range(100, 104)) + [5] * 76))  # splits c's leaf at 4
        if kv is fast:
            upper: Any = d.last_node.parent
            assert len(upper) == 4 and upper.key_block == 4  # 4 of 80: copied out
            lower = next(n for n in upper.children.values() if n is not d.last_node)
            assert lower.key_block == 80 and lower.key.tolist() == list(range(104, 180))
        for r in (c, d):
            kv.release(r, cache_kv=True)
    _same_trees(ref, fast)


def test_a_fill_past_the_prompt_is_copied_with_its_outputs() -> None:
    """A checkpoint that reaches into the outputs inserts a joined copy (the prompt's block
    does not hold the outputs): the key is the prompt then the outputs, as the reference's."""
    ref, fast = _twins(1024)
    keys = []
    for kv in (ref, fast):
        r = Req("a", _prompt(list(range(50, 82))), SamplingParams(max_new_tokens=8))
        kv.match_for_admission(r)
        r.lock_node = r.last_node
        kv.cache.inc_lock_ref(r.lock_node)
        kv.take_prefix(r)
        r.output_ids = [9, 8, 7, 6]
        kv.grow([r], [36])
        r.kv_len = 36
        kv.checkpoint(r, 36)
        node: Any = r.last_node
        keys.append(node.key.tolist())
        if kv is fast:
            assert node.key_block == 36  # a block of its own
        kv.release(r, cache_kv=True)
    assert keys[0] == keys[1] == [*range(50, 82), 9, 8, 7, 6]
    _same_trees(ref, fast)
