"""The native Mooncake prompt builder (``_native/prompts.hpp``) writes the tokens the numpy
path writes (``traces._fill_mooncake``'s block table, gather and padding), for any block size,
vocabulary, id list and prompt length; so does its hashed-token builder (``tokens._hash_tokens``:
padding, JSONL prompts given by length); a load builds the same prompts with them as without,
and in threads as in one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.native import core
from radixsched.sim.workloads import tokens, traces
from radixsched.sim.workloads.load import load_workload
from radixsched.sim.workloads.tokens import _NO_TOKENS, _Draft

SAMPLE = Path(__file__).resolve().parent / "data" / "mooncake_sample.jsonl"

needs_native = pytest.mark.skipif(
    getattr(core(), "mooncake_prompt", None) is None, reason="no native prompt builder built"
)


def _draft(ids: list[int], n: int, line: int) -> _Draft:
    return _Draft(_NO_TOKENS, 1, line, source=np.array(ids, dtype=np.int64), length=n)


def _build(drafts: Sequence[_Draft], block: int, vocab: int, native: bool) -> list[np.ndarray]:
    copies = [dataclasses.replace(d, prompt=_NO_TOKENS) for d in drafts]
    real, real_hash = traces._native_prompt, tokens._native_hash
    try:
        if not native:
            traces._native_prompt = lambda b, v: None  # type: ignore[assignment]
            tokens._native_hash = lambda v: None  # type: ignore[assignment]
        traces._fill_mooncake(copies, block, vocab)
    finally:
        traces._native_prompt = real  # type: ignore[assignment]
        tokens._native_hash = real_hash  # type: ignore[assignment]
    return [c.prompt for c in copies]


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    block=st.integers(1, 40),
    vocab=st.sampled_from([1, 2, 7, 128_000, 1_000_003, 2**31 - 1]),
    reqs=st.lists(
        st.tuples(
            st.lists(st.integers(0, 2**62), max_size=6), st.integers(1, 200), st.integers(0, 9)
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_native_prompts_match_numpy(block: int, vocab: int, reqs: list) -> None:
    # Ids cut to the prompt's blocks as the reader cuts them, or shorter (padding follows).
    drafts = [_draft(ids[: -(-n // block)], n, line) for ids, n, line in reqs]
    got = _build(drafts, block, vocab, native=True)
    want = _build(drafts, block, vocab, native=False)
    for g, w, d in zip(got, want, drafts, strict=True):
        assert g.dtype == np.int32 and len(g) == d.length
        assert np.array_equal(g, w)


@needs_native
def test_a_partial_last_block_and_padding() -> None:
    # 3 ids of 4 tokens for 10 tokens: two whole blocks, half the third; 2 ids: 8, then padding.
    cut, padded = _draft([5, 9, 2**40], 10, 3), _draft([5, 9], 10, 3)
    got = _build([cut, padded], 4, 128_000, native=True)
    want = _build([cut, padded], 4, 128_000, native=False)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert np.array_equal(got[0][:8], got[1][:8]) and not np.array_equal(got[0], got[1])


@needs_native
def test_a_bad_shape_is_refused_not_written() -> None:
    lib = core()
    assert lib is not None
    out = np.zeros(4, dtype=np.int32)
    ids = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError):
        lib.mooncake_prompt(out, ids, 0, 0, 0, 128_000)
    with pytest.raises(ValueError):
        lib.mooncake_prompt(out, ids, 0, 0, 4, 0)
    assert not out.any()


@needs_native
def test_a_load_builds_the_same_prompts_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    native = load_workload(f"mooncake:{SAMPLE}", num_requests=60)
    monkeypatch.setattr(traces, "_native_prompt", lambda b, v: None)
    numpy = load_workload(f"mooncake:{SAMPLE}", num_requests=60)
    assert [r.rid for r in native.requests] == [r.rid for r in numpy.requests]
    for a, b in zip(native.requests, numpy.requests, strict=True):
        assert np.array_equal(a.prompt_ids, b.prompt_ids)


@needs_native
@pytest.mark.parametrize(
    "vocab", [2, 3, 5, 6, 7, 10, 11, 12, 13, 49, 98, 100, 1000, 1949, 128_000, 2**20 - 1]
)
def test_every_remainder_is_exact(vocab: int) -> None:
    # 4,096 tokens of padding and two blocks per vocabulary: remainders of every size; for 49,
    # 98 and 1,949, exact multiples whose product with the rounded reciprocal falls just under
    # the quotient (the vector path's quotient one short, which its correction must undo; about
    # one in two multiples of 49 here, and real vocabularies meet them once in ~d tokens).
    drafts = [_draft([], 4096, 1), _draft([3, 2**50], 4096, 2)]
    got = _build(drafts, 1024, vocab, native=True)
    want = _build(drafts, 1024, vocab, native=False)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_an_extension_without_the_builder_falls_back_to_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import radixsched.native as native

    monkeypatch.setattr(native, "core", lambda: object())  # an older build: no mooncake_prompt
    assert traces._native_prompt(512, 128_000) is None
    monkeypatch.setattr(native, "core", lambda: None)
    assert traces._native_prompt(512, 128_000) is None
    drafts = [_draft([1, 2], 700, 0)]
    (prompt,) = _build(drafts, 512, 128_000, native=True)  # the numpy path, no native call
    assert len(prompt) == 700 and prompt.dtype == np.int32


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    key=st.integers(0, 2**64 - 1),
    start=st.integers(0, 2**40),
    n=st.integers(0, 300),
    vocab=st.sampled_from([1, 2, 7, 49, 128_000, 1_000_003, 2**31 - 1, 2**40 + 3, 2**63 - 1]),
)
def test_native_hashed_tokens_match_numpy(key: int, start: int, n: int, vocab: int) -> None:
    got = tokens._hash_tokens(key, start, n, vocab)
    want = tokens._hash_tokens_numpy(key, start, n, vocab, np.empty(n, dtype=np.int32))
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_hashed_tokens_beyond_the_native_vocabulary_or_into_a_strided_buffer_use_numpy() -> None:
    assert tokens._native_hash(2**63) is None and tokens._native_hash(0) is None
    strided = np.zeros(20, dtype=np.int32)[::2]
    got = tokens._hash_tokens(5, 3, 10, 1000, strided)
    assert np.array_equal(got, tokens._hash_tokens_numpy(5, 3, 10, 1000, np.empty(10, np.int32)))


@pytest.mark.parametrize("spec", [f"mooncake:{SAMPLE}", "jsonl"])
def test_a_load_builds_the_same_prompts_in_threads_as_in_one(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if spec == "jsonl":  # prompts given by length, some sharing a group's prefix
        lines = [
            f'{{"input_length": {40 + 7 * i}, "output_length": 3, "timestamp": {i}'
            + (', "prefix_group": "g", "prefix_length": 20}' if i % 2 else "}")
            for i in range(30)
        ]
        (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
        spec = f"jsonl:{tmp_path / 't.jsonl'}"
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    one = load_workload(spec)
    monkeypatch.setattr(tokens, "build_threads", lambda n: 3)
    three = load_workload(spec)
    assert len(one.requests) == len(three.requests) > 20
    for a, b in zip(one.requests, three.requests, strict=True):
        assert np.array_equal(a.prompt_ids, b.prompt_ids)


def test_runs_cut_by_tokens_and_every_draft_is_built_once() -> None:
    assert tokens._runs([5, 5, 5, 5], 2) == [0, 2, 4]
    assert tokens._runs([10, 1, 1, 1, 1], 2) == [0, 0, 5]  # the big one alone is over half
    assert tokens._runs([], 3) == [0, 0, 0, 0]
    assert tokens._runs([3], 1) == [0, 1]
    drafts = [_Draft(_NO_TOKENS, 1, i, length=i % 4) for i in range(23)]
    seen: list[int] = []
    real = tokens.build_threads
    try:
        tokens.build_threads = lambda n: 4  # type: ignore[assignment]
        tokens._each_in_threads(drafts, lambda d: seen.append(d.session))
    finally:
        tokens.build_threads = real  # type: ignore[assignment]
    assert sorted(seen) == list(range(23))


def test_a_failure_in_a_thread_is_raised_after_every_thread_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drafts = [_Draft(_NO_TOKENS, 1, i, length=1) for i in range(12)]
    built: list[int] = []

    def build(d: _Draft) -> None:
        if d.session in (5, 10):
            raise ValueError(f"bad {d.session}")
        built.append(d.session)

    monkeypatch.setattr(tokens, "build_threads", lambda n: 3)
    with pytest.raises(ValueError, match="bad 5"):  # the first failed run's, not the last's
        tokens._each_in_threads(drafts, build)
    assert sorted(built) == [0, 1, 2, 3, 4, 8, 9]


def test_build_threads_are_one_per_share_of_tokens_and_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    share = tokens.THREAD_MIN_TOKENS
    assert [tokens.build_threads(k * share) for k in (0, 1, 2, 5)] == [1, 1, 2, 3]
    assert tokens.build_threads(share - 1) == 1
    monkeypatch.setattr(tokens.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert tokens.build_threads(1000 * share) == tokens.MAX_THREADS


def test_a_batch_of_prompts_is_each_prompt_written_alone() -> None:
    """``mooncake_prompts`` (a list a call, the GIL released once) writes what
    ``mooncake_prompt`` writes for each (out, ids, key); mismatched lists are refused."""
    lib = core()
    if lib is None:
        pytest.skip("the native core is not built or is off")
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 50, size=k).astype(np.int64) for k in (0, 1, 3, 7)]
    lens = [5, 16, 40, 100]
    keys = [11, 2**63 + 5, 0, 99]
    outs = [np.empty(n, dtype=np.int32) for n in lens]
    lib.mooncake_prompts(outs, ids, keys, 1234, 16, 32_000)
    for out, i, k in zip(outs, ids, keys, strict=True):
        alone = np.empty(len(out), dtype=np.int32)
        lib.mooncake_prompt(alone, i, 1234, k, 16, 32_000)
        assert np.array_equal(out, alone)
    with pytest.raises(ValueError):
        lib.mooncake_prompts(outs, ids[:3], keys, 1234, 16, 32_000)
    with pytest.raises(ValueError):
        lib.mooncake_prompts(outs, ids, keys, 1234, 0, 32_000)
