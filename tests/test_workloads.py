"""Workload readers and generators, arrivals, and the optimal hit rate."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.request import Req, SamplingParams
from radixsched.results.optimal import optimal_hits
from radixsched.sim.workloads.load import Workload, load_workload, optimal_hit_rate
from radixsched.sim.workloads.spec import WORKLOADS, describe_workloads, parse_workload_spec
from radixsched.sim.workloads.tokens import WorkloadError
from radixsched.sim.workloads.traces import mooncake_block_hit_rate

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "mooncake_sample.jsonl"
FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tokens_of(w: Workload) -> list[list[int]]:
    return [r.prompt_ids.tolist() for r in w.requests]


# ---- spec strings ------------------------------------------------------------------------


def test_parse_defaults_and_params() -> None:
    kind, params = parse_workload_spec("shared-prefix")
    assert kind.name == "shared-prefix"
    assert params["groups"] == 64 and params["prompts"] == 16 and params["system_len"] == 2048
    assert params["question_len"] == 128 and params["output_len"] == 256
    _, params = parse_workload_spec("shared-prefix:groups=3,system-len=10,shuffle=false")
    assert params["groups"] == 3 and params["system_len"] == 10 and params["shuffle"] is False
    _, params = parse_workload_spec("multi-turn:think_time_s=0.5")
    assert params["think_time_s"] == 0.5


def test_parse_trace_path_forms() -> None:
    _, params = parse_workload_spec("mooncake:/some/where/trace.jsonl")
    assert params["path"] == "/some/where/trace.jsonl" and params["vocab"] == 128_000
    _, params = parse_workload_spec("mooncake:path=t.jsonl,vocab=32000")
    assert params == {"path": "t.jsonl", "vocab": 32000, "block_size": 512}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("sharegpt", "unknown workload 'sharegpt'; valid: mooncake, jsonl, shared-prefix"),
        ("shared-prefix:bogus=1", "unknown param 'bogus'; valid params: groups, prompts"),
        ("shared-prefix:groups", "expected k=v"),
        ("shared-prefix:groups=x", "param 'groups': expected an integer, got 'x'"),
        ("shared-prefix:groups=0", "param 'groups': must be >= 1"),
        ("multi-turn:think_time_s=-1", "param 'think_time_s': must be >= 0"),
        ("multi-turn:think_time_s=nan", "expected a finite number"),
        ("few-shot:shuffle=maybe", "expected a boolean"),
        ("mooncake", "needs a file: mooncake:PATH"),
        ("jsonl:", "needs a file"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        parse_workload_spec(spec)


def test_describe_lists_every_workload_and_param() -> None:
    text = describe_workloads()
    for kind in WORKLOADS.values():
        assert kind.name in text
        for p in kind.params:
            if p.name != "path":
                default = str(p.default).lower() if isinstance(p.default, bool) else p.default
                assert f"{p.name}={default}" in text
    mine = describe_workloads({"shared-prefix": {"groups": 3}})
    assert "groups=3, prompts=16" in mine and "groups=64" not in mine


def test_caller_defaults_fill_the_params_a_spec_leaves_out() -> None:
    defaults = {"shared-prefix": {"groups": 2, "prompts": 3, "system_len": 40}}
    _, params = parse_workload_spec("shared-prefix:groups=5", defaults)
    assert (params["groups"], params["prompts"], params["system_len"]) == (5, 3, 40)
    wl = load_workload("shared-prefix:prompts=2", defaults=defaults)
    assert len(wl.requests) == 4 and wl.requests[0].prompt_len == 40 + 128
    assert wl.params_text.startswith("groups=2, prompts=2, system_len=40, question_len=128")
    # Other generators keep their own defaults.
    assert parse_workload_spec("few-shot", defaults)[1]["questions"] == 1024


# ---- compressed and non-UTF-8 traces ---------------------------------------------------------


def test_gzip_and_zstd_traces_read_like_the_plain_file(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    data = SAMPLE.read_bytes()
    gz, zst = tmp_path / "t.jsonl.gz", tmp_path / "t.jsonl.zst"
    gz.write_bytes(gzip.compress(data))
    zst.write_bytes(zstandard.ZstdCompressor().compress(data))
    plain = load_workload(f"mooncake:{SAMPLE}")
    for path in (gz, zst):
        wl = load_workload(f"mooncake:{path}")
        assert [r.prompt_ids.tolist() for r in wl.requests[:20]] == [
            r.prompt_ids.tolist() for r in plain.requests[:20]
        ]
        assert [r.arrival_time for r in wl.requests] == [r.arrival_time for r in plain.requests]


def test_bad_bytes_and_broken_archives_are_one_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(b'{"input_length": 4, "output_length": 1}\n{"tenant": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9"):
        load_workload(f"jsonl:{latin}")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(SAMPLE.read_bytes())[:2000])
    with pytest.raises(WorkloadError, match=r"cut.jsonl.gz:\d+: cannot read the gzip data"):
        load_workload(f"mooncake:{cut}")
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(b"not gzip at all\n")
    with pytest.raises(WorkloadError, match=r"fake\.jsonl\.gz:1: cannot read the gzip data"):
        load_workload(f"mooncake:{fake}")
    with pytest.raises(WorkloadError, match="is a directory"):
        load_workload(f"mooncake:{tmp_path}")


# ---- generators --------------------------------------------------------------------------

SMALL = {
    "shared-prefix": "shared-prefix:groups=4,prompts=5,system_len=64,question_len=8,output_len=4",
    "multi-turn": "multi-turn:conversations=3,turns=4,first_len=32,turn_len=8,output_len=6",
    "tree-of-thought": "tree-of-thought:trees=2,depth=3,branching=2,root_len=16,step_len=4,output_len=5",
    "few-shot": "few-shot:questions=30,shots=3,shot_len=10,question_len=6,num_subjects=4",
}


@pytest.mark.parametrize("name", list(SMALL))
def test_generators_are_deterministic_per_seed(name: str) -> None:
    a, b = load_workload(SMALL[name], seed=3), load_workload(SMALL[name], seed=3)
    c = load_workload(SMALL[name], seed=4)
    assert tokens_of(a) == tokens_of(b) and tokens_of(a) != tokens_of(c)
    assert [r.rid for r in a.requests] == [r.rid for r in b.requests]
    for r in a.requests:
        assert r.prompt_ids.dtype == np.int32
        assert r.sampling.ignore_eos and r.sampling.max_new_tokens >= 1
        assert int(r.prompt_ids.min()) >= 0 and int(r.prompt_ids.max()) < 128_000
    assert not a.has_timestamps and a.tenants is None


def test_shared_prefix_groups_share_exactly_the_system_prompt() -> None:
    w = load_workload(SMALL["shared-prefix"] + ",shuffle=false")
    assert len(w.requests) == 20
    groups = [w.requests[i : i + 5] for i in range(0, 20, 5)]
    for g in groups:
        for r in g:
            assert r.prompt_len == 72 and r.max_new_tokens == 4
            assert np.array_equal(r.prompt_ids[:64], g[0].prompt_ids[:64])
        assert len({tuple(r.prompt_ids[64:].tolist()) for r in g}) == 5
    assert len({tuple(g[0].prompt_ids[:64].tolist()) for g in groups}) == 4
    # 4 groups x 4 repeats x 64 shared tokens over 20 x 72 prompt tokens.
    assert optimal_hit_rate(w.requests) == pytest.approx(4 * 4 * 64 / (20 * 72))


def test_shared_prefix_shuffle_interleaves_groups() -> None:
    w = load_workload(SMALL["shared-prefix"], seed=0)
    heads = [tuple(r.prompt_ids[:64].tolist()) for r in w.requests]
    runs = sum(1 for a, b in itertools.pairwise(heads) if a != b)
    assert runs > 4  # not grouped back to back


def test_multi_turn_turns_extend_the_previous_context() -> None:
    w = load_workload(SMALL["multi-turn"] + ",think_time_s=2")
    assert len(w.requests) == 12
    by_conv: dict[tuple[int, ...], list[Req]] = {}
    for r in w.requests:
        by_conv.setdefault(tuple(r.prompt_ids[:32].tolist()), []).append(r)
    assert len(by_conv) == 3
    for turns in by_conv.values():
        turns.sort(key=lambda r: r.arrival_time)
        assert [r.arrival_time for r in turns] == [0.0, 2.0, 4.0, 6.0]
        for prev, nxt in itertools.pairwise(turns):
            assert prev.scripted_output is not None and len(prev.scripted_output) == 6
            ctx = np.concatenate([prev.prompt_ids, prev.scripted_output])
            assert np.array_equal(nxt.prompt_ids[: len(ctx)], ctx)
            assert nxt.prompt_len == len(ctx) + 8
    assert w.arrivals == "sessions at t=0"


def test_tree_of_thought_children_extend_their_parent() -> None:
    w = load_workload(SMALL["tree-of-thought"] + ",think_time_s=1")
    assert len(w.requests) == 2 * (1 + 2 + 4)
    by_len: dict[int, list[Req]] = {}
    for r in w.requests:
        by_len.setdefault(r.prompt_len, []).append(r)
    assert sorted(by_len) == [16, 16 + 5 + 4, 16 + 2 * (5 + 4)]
    for child in by_len[25] + by_len[34]:
        parents = [
            p
            for p in w.requests
            if p.scripted_output is not None
            and p.prompt_len + 5 + 4 == child.prompt_len
            and np.array_equal(
                child.prompt_ids[: p.prompt_len + 5],
                np.concatenate([p.prompt_ids, p.scripted_output]),
            )
        ]
        assert len(parents) == 1
        assert child.arrival_time == parents[0].arrival_time + 1.0


def test_few_shot_subjects_share_their_shots() -> None:
    w = load_workload(SMALL["few-shot"])
    assert len(w.requests) == 30
    heads = {tuple(r.prompt_ids[:30].tolist()) for r in w.requests}
    assert len(heads) == 4
    assert all(r.prompt_len == 36 and r.max_new_tokens == 1 for r in w.requests)
    assert optimal_hit_rate(w.requests) == pytest.approx((30 - 4) * 30 / (30 * 36))


# ---- arrivals ----------------------------------------------------------------------------


def test_inf_and_default_arrivals_are_all_zero() -> None:
    for rate in (None, math.inf):
        w = load_workload(SMALL["shared-prefix"], request_rate=rate)
        assert all(r.arrival_time == 0.0 for r in w.requests)
        assert w.arrivals == "all at t=0"


def test_poisson_mean_rate_and_seed() -> None:
    spec = "shared-prefix:groups=40,prompts=100,system_len=4,question_len=2,output_len=1"
    w = load_workload(spec, request_rate=20.0, seed=7)
    t = np.array([r.arrival_time for r in w.requests])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(20.0, rel=0.06)
    gaps = np.diff(t)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)  # exponential: std == mean
    again = load_workload(spec, request_rate=20.0, seed=7)
    assert [r.arrival_time for r in again.requests] == t.tolist()
    assert w.arrivals == "poisson 20 req/s"
    dflt = load_workload(spec, default_rate=20.0, seed=7)
    assert [r.arrival_time for r in dflt.requests] == t.tolist()


def test_session_rate_keeps_the_long_run_request_rate() -> None:
    spec = "multi-turn:conversations=600,turns=4,first_len=4,turn_len=2,output_len=2,think_time_s=0"
    w = load_workload(spec, request_rate=10.0, seed=1)
    t = np.array([r.arrival_time for r in w.requests])
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.1)


def test_num_requests_takes_the_first_in_arrival_order() -> None:
    full = load_workload(SMALL["multi-turn"] + ",think_time_s=1")
    first = load_workload(SMALL["multi-turn"] + ",think_time_s=1", num_requests=5)
    assert [r.rid for r in first.requests] == [r.rid for r in full.requests[:5]]
    assert all(r.arrival_time == 0.0 for r in first.requests[:3])
    with pytest.raises(WorkloadError, match="num_requests"):
        load_workload("few-shot", num_requests=0)
    with pytest.raises(WorkloadError, match="request_rate"):
        load_workload("few-shot", request_rate=0.0)


# ---- mooncake ----------------------------------------------------------------------------


def test_mooncake_sample_loads_with_shared_blocks() -> None:
    w = load_workload(f"mooncake:{SAMPLE}")
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert len(w.requests) == 200 and w.has_timestamps and w.arrivals == "trace timestamps"
    for r, row in zip(w.requests, rows, strict=True):
        assert r.prompt_len == row["input_length"] and r.max_new_tokens == row["output_length"]
        assert r.arrival_time == pytest.approx(row["timestamp"] / 1e3)
        assert r.prompt_ids.dtype == np.int32
    # Requests whose hash ids start alike share exactly those blocks.
    first_block: dict[int, np.ndarray] = {}
    for r, row in zip(w.requests, rows, strict=True):
        h = row["hash_ids"][0]
        if h in first_block:
            assert np.array_equal(first_block[h], r.prompt_ids[:512])
        first_block[h] = r.prompt_ids[:512]
    assert len({tuple(v[:8].tolist()) for v in first_block.values()}) == len(first_block)


def test_requests_of_one_output_length_share_their_sampling_params() -> None:
    w = load_workload(f"mooncake:{SAMPLE}")
    by_length: dict[int, set[int]] = {}
    for r in w.requests:
        assert r.sampling == SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True)
        by_length.setdefault(r.max_new_tokens, set()).add(id(r.sampling))
    assert all(len(ids) == 1 for ids in by_length.values())  # one (frozen) object per length
    assert len(by_length) > 1 and len(by_length) < len(w.requests)


def test_mooncake_ids_define_blocks_and_short_id_lists_are_padded(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 7, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]},
            {"timestamp": 9, "input_length": 1300, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 9, "input_length": 1300, "output_length": 3, "hash_ids": [1, 2]},
        ],
    )
    w = load_workload(f"mooncake:{p}")
    a, b, c, d = w.requests
    assert a.arrival_time == 0.0 and b.arrival_time == pytest.approx(0.002)
    assert np.array_equal(a.prompt_ids[:512], b.prompt_ids[:512])
    assert not np.array_equal(a.prompt_ids[512:700], b.prompt_ids[512:700])
    assert np.array_equal(a.prompt_ids, c.prompt_ids[:1000])
    # Beyond len(hash_ids) * 512 the tokens are request-unique.
    assert c.prompt_len == 1300 and not np.array_equal(c.prompt_ids[1024:], d.prompt_ids[1024:])
    assert mooncake_block_hit_rate(p) == pytest.approx((0 + 512 + 1024 + 1024) / 4300)


@pytest.mark.parametrize("batch", [1, 2, 256])
def test_mooncake_blocks_are_the_same_whichever_batch_generates_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """A block several prompts use comes from the shared table, one that one prompt uses is
    generated with its batch of requests: either way its tokens are the block's own (the
    id's hash), across batch boundaries too."""
    from radixsched.sim.workloads import tokens, traces

    monkeypatch.setattr(traces, "_BATCH", batch)
    rows = [
        {"timestamp": t, "input_length": 512 * len(ids) - 100, "output_length": 2, "hash_ids": ids}
        for t, ids in enumerate([[7, 1, 2], [7, 3], [4, 1, 5, 6], [8], [7, 3, 9]])
    ]
    w = load_workload(f"mooncake:{write_jsonl(tmp_path / 't.jsonl', rows)}")
    for r, row in zip(w.requests, rows, strict=True):
        ids = np.array(row["hash_ids"], dtype=np.int64)
        expect = tokens._block_table(ids, 512, 128000).reshape(-1)[: r.prompt_len]
        assert np.array_equal(r.prompt_ids, expect)


def test_mooncake_sample_hit_rates() -> None:
    block = mooncake_block_hit_rate(SAMPLE)
    assert block == pytest.approx(0.061875, abs=1e-6)
    tokens = optimal_hit_rate(load_workload(f"mooncake:{SAMPLE}").requests)
    # Token-level (capped at prompt_len - 1) agrees with the block count on this trace.
    assert tokens == pytest.approx(block, abs=1e-4) and tokens <= block


@pytest.mark.skipif(not FULL_TRACE.exists(), reason=f"full Mooncake trace not at {FULL_TRACE}")
def test_mooncake_full_trace_optimal_rate_is_65_1_percent() -> None:
    assert mooncake_block_hit_rate(FULL_TRACE) == pytest.approx(0.651, abs=5e-4)


# ---- jsonl -------------------------------------------------------------------------------


def test_jsonl_all_fields(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"input_ids": [5, 6, 7], "output_length": 2, "arrival_time": 1.5, "priority": 3},
            {
                "input_length": 50,
                "prefix_group": "sys",
                "prefix_length": 40,
                "output_ids": [9, 9, 8],
                "arrival_time": 1.0,
                "tenant": "t1",
                "routing_key": "k",
                "extra_key": "ns",
            },
            {"input_length": 60, "prefix_group": "sys", "prefix_length": 30, "output_length": 4,
             "arrival_time": 2.0, "tenant": "t0"},
        ],
    )  # fmt: skip
    w = load_workload(f"jsonl:{p}")
    assert w.has_timestamps and w.tenants == ("t0", "t1")
    b, a, c = w.requests
    assert a.prompt_ids.tolist() == [5, 6, 7] and a.priority == 3 and a.arrival_time == 0.5
    assert b.arrival_time == 0.0 and b.max_new_tokens == 3
    assert b.scripted_output is not None and b.scripted_output.tolist() == [9, 9, 8]
    assert (b.tenant, b.routing_key, b.extra_key) == ("t1", "k", "ns")
    assert np.array_equal(b.prompt_ids[:30], c.prompt_ids[:30])
    assert not np.array_equal(b.prompt_ids[30:40], c.prompt_ids[30:40])
    assert b.prompt_len == 50 and c.prompt_len == 60
    summary = w.summary()
    assert summary["requests"] == 3 and summary["prompt_tokens"] == 3 + 50 + 60
    assert summary["output_tokens"] == 2 + 3 + 4 and summary["last_arrival_s"] == 1.0
    w2 = load_workload(f"jsonl:{p}", request_rate=math.inf)
    assert all(r.arrival_time == 0.0 for r in w2.requests)


def test_jsonl_timestamps_in_ms_and_untimed_files(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "t.jsonl",
        [{"input_length": 4, "output_length": 1, "timestamp": ms} for ms in (3000, 1000)],
    )
    w = load_workload(f"jsonl:{p}")
    assert [r.arrival_time for r in w.requests] == [0.0, 2.0]
    q = write_jsonl(tmp_path / "u.jsonl", [{"input_length": 4, "output_length": 1}] * 3)
    w = load_workload(f"jsonl:{q}")
    assert not w.has_timestamps and all(r.arrival_time == 0.0 for r in w.requests)


BAD_LINES: list[tuple[dict[str, Any], str]] = [
    ({"input_length": -3, "output_length": 1}, "field 'input_length': expected a positive integer, got -3"),
    ({"input_length": 4}, "missing field 'output_length'"),
    ({"input_length": 4, "output_length": 0}, "field 'output_length': expected a positive integer, got 0"),
    ({"input_length": 4.5, "output_length": 1}, "field 'input_length'"),
    ({"input_ids": [], "output_length": 1}, "field 'input_ids': expected a non-empty list"),
    ({"input_ids": [1, -2], "output_length": 1}, "field 'input_ids': expected integers in"),
    ({"input_ids": [1, "a"], "output_length": 1}, "field 'input_ids': expected a list of non-negative"),
    ({"input_ids": [1], "input_length": 1, "output_length": 1}, "exactly one of"),
    ({"input_length": 4, "output_length": 1, "prefix_group": "g"}, "go together"),
    ({"input_length": 4, "output_length": 1, "prefix_group": "g", "prefix_length": 5},
     "field 'prefix_length': must be <= input_length"),
    ({"input_length": 4, "output_length": 1, "arrival_time": -1}, "field 'arrival_time'"),
    ({"input_length": 4, "output_length": 1, "arrival_time": 1, "timestamp": 1}, "not both"),
    ({"input_length": 4, "output_length": 1, "priority": "high"}, "field 'priority'"),
    ({"input_length": 4, "output_length": 1, "tenant": 5}, "field 'tenant': expected a string"),
    ({"input_length": 4, "output_len": 1}, "unknown field 'output_len'"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "match"), BAD_LINES)
def test_jsonl_errors_name_file_line_and_field(
    tmp_path: Path, line: dict[str, Any], match: str
) -> None:
    good = {"input_length": 4, "output_length": 1}
    p = write_jsonl(tmp_path / "trace.jsonl", [good] * 16 + [line])
    with pytest.raises(WorkloadError) as exc:
        load_workload(f"jsonl:{p}")
    assert str(exc.value).startswith(f"{p}:17: ")
    assert match in str(exc.value)


def test_jsonl_exact_error_message(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "trace.jsonl", [{"input_length": 4, "output_length": 1}] * 16
                    + [{"input_length": -3, "output_length": 1}])  # fmt: skip
    with pytest.raises(WorkloadError) as exc:
        load_workload(f"jsonl:{p}")
    assert str(exc.value) == (f"{p}:17: field 'input_length': expected a positive integer, got -3")


def test_other_bad_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(WorkloadError, match=r"nope\.jsonl: no such file$"):
        load_workload(f"jsonl:{missing}")
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload(f"mooncake:{missing}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 4, "output_length": 1}\n\n{nope\n')
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:3: invalid JSON"):
        load_workload(f"jsonl:{bad}")
    arr = tmp_path / "arr.jsonl"
    arr.write_text("[1, 2]\n")
    with pytest.raises(WorkloadError, match=r"arr\.jsonl:1: expected a JSON object"):
        load_workload(f"jsonl:{arr}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_workload(f"jsonl:{empty}")
    mixed = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"input_length": 4, "output_length": 1, "arrival_time": 0},
            {"input_length": 4, "output_length": 1},
        ],
    )
    with pytest.raises(WorkloadError, match=r"mixed\.jsonl:2: arrival given on some lines only"):
        load_workload(f"jsonl:{mixed}")
    moon = write_jsonl(
        tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 4, "output_length": 1}]
    )
    with pytest.raises(WorkloadError, match=r"m\.jsonl:1: missing field 'hash_ids'"):
        load_workload(f"mooncake:{moon}")
    moon2 = write_jsonl(
        tmp_path / "m2.jsonl",
        [{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1.5]}],
    )
    with pytest.raises(WorkloadError, match=r"m2\.jsonl:1: field 'hash_ids'"):
        load_workload(f"mooncake:{moon2}")


# ---- optimal hit rate --------------------------------------------------------------------


def mk(rid: str, prompt: list[int], t: float = 0.0, out: list[int] | None = None, **kw: Any) -> Req:
    n = len(out) if out else 1
    scripted = np.array(out, dtype=np.int32) if out else None
    return Req(rid, np.array(prompt), SamplingParams(max_new_tokens=n, ignore_eos=True),
               arrival_time=t, scripted_output=scripted, **kw)  # fmt: skip


def brute_force_hits(reqs: list[Req], page: int) -> list[int]:
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_time)
    hits = [0] * len(reqs)
    done: list[tuple[Any, list[int]]] = []
    for i in order:
        r = reqs[i]
        p = r.prompt_ids.tolist()
        best = 0
        for ns, seq in done:
            if ns != r.namespace:
                continue
            k = 0
            while k < min(len(p), len(seq)) and p[k] == seq[k]:
                k += 1
            best = max(best, k)
        hits[i] = min(best, len(p) - 1) // page * page
        seq = list(p)
        if r.scripted_output is not None:
            seq += r.scripted_output[: r.max_new_tokens - 1].tolist()
        done.append((r.namespace, seq))
    return hits


def test_optimal_hit_rate_basics() -> None:
    same = [mk("a", [1, 2, 3, 4]), mk("b", [1, 2, 3, 4])]
    assert optimal_hit_rate(same) == pytest.approx(3 / 8)  # capped at prompt_len - 1
    ns = [mk("a", [1, 2, 3, 4]), mk("b", [1, 2, 3, 4], extra_key="other")]
    assert optimal_hit_rate(ns) == 0.0
    later_first = [mk("a", [1, 2, 3, 4, 5], t=1.0), mk("b", [1, 2, 3], t=0.0)]
    assert optimal_hit_rate(later_first) == pytest.approx(3 / 8)
    # Earlier scripted output (but its last token) is cached too.
    turns = [mk("a", [1, 2], out=[3, 4, 5]), mk("b", [1, 2, 3, 4, 5, 6], t=1.0)]
    assert optimal_hit_rate(turns) == pytest.approx(4 / 8)
    paged = [mk("a", list(range(10))), mk("b", list(range(10)))]
    assert optimal_hit_rate(paged, page_size=4) == pytest.approx(8 / 20)
    assert optimal_hit_rate([]) == 0.0
    with pytest.raises(ValueError, match="page_size"):
        optimal_hit_rate(same, page_size=0)


def test_multi_turn_optimal_counts_previous_outputs() -> None:
    w = load_workload(SMALL["multi-turn"])
    hits = optimal_hits(w.requests, 1)
    assert hits == brute_force_hits(w.requests, 1)
    by_rid = dict(zip([r.rid for r in w.requests], hits, strict=True))
    later = [r for r in w.requests if r.prompt_len > 32]
    # The previous prompt and its output but the last token (never fed back) are cached.
    assert all(by_rid[r.rid] == r.prompt_len - 8 - 1 for r in later)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 2), min_size=1, max_size=24),
            st.floats(0, 3),
            st.lists(st.integers(0, 2), max_size=4),
            st.sampled_from([None, "x"]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([1, 2, 3]),
)
def test_optimal_hits_match_brute_force(
    specs: list[tuple[list[int], float, list[int], str | None]], page: int
) -> None:
    reqs = [mk(f"r{i}", p, t, o or None, extra_key=ns) for i, (p, t, o, ns) in enumerate(specs)]
    assert optimal_hits(reqs, page) == brute_force_hits(reqs, page)


# ---- generated tokens --------------------------------------------------------------------------


def test_generated_tokens_are_pinned() -> None:
    """The hashed tokens every trace's prompts are made of: changing them changes every
    recorded schedule, so their first values are written down here."""
    from radixsched.sim.workloads import tokens

    table = tokens._block_table(np.array([0, 7, 2**40], dtype=np.int64), 512, 128000)
    assert table[:, :4].tolist() == [
        [56662, 30684, 69861, 94099],
        [14451, 19335, 72364, 110829],
        [64197, 54635, 27134, 21550],
    ]
    assert tokens._hash_tokens(12345, 1000, 4, 32000).tolist() == [23777, 12098, 9816, 19002]


@settings(max_examples=150, deadline=None)
@given(
    key=st.integers(0, 2**64 - 1),
    start=st.integers(0, 2**40),
    n=st.integers(0, 700),
    vocab=st.sampled_from([1, 2, 3, 1000, 32000, 128000, 151936, 2**31 - 1]),
)
def test_hashed_tokens_equal_the_plain_formula(key: int, start: int, n: int, vocab: int) -> None:
    """``hash(key, position) mod vocab`` with numpy's own remainder: the generator's in-place,
    divide-by-reciprocal form must give the same tokens for every key, offset and vocabulary."""
    from radixsched.sim.cost.splitmix import splitmix64
    from radixsched.sim.workloads import tokens

    pos = np.arange(start, start + n, dtype=np.uint64)
    mixed = splitmix64(np.uint64(key) ^ (pos * np.uint64(tokens._GOLDEN)))
    expect = (mixed % np.uint64(vocab)).astype(np.int32)
    assert np.array_equal(tokens._hash_tokens(key, start, n, vocab), expect)
    ids = np.array([key % 2**63, start, n], dtype=np.int64)
    salted = splitmix64(ids.astype(np.uint64) ^ np.uint64(tokens._key(tokens._SALT_BLOCK)))
    block = np.arange(64, dtype=np.uint64) * np.uint64(tokens._GOLDEN)
    rows = splitmix64(salted[:, None] ^ block[None, :]) % np.uint64(vocab)
    assert np.array_equal(tokens._block_table(ids, 64, vocab), rows.astype(np.int32))


def test_mooncake_prompts_are_their_blocks_then_their_own_padding(tmp_path: Path) -> None:
    """Each prompt is its blocks' tokens (a block used once or several times, a short last
    one) and, past ``len(hash_ids) * 512``, the request's own hashed padding."""
    from radixsched.sim.workloads import tokens

    rows = [
        {"timestamp": t, "input_length": n, "output_length": 2, "hash_ids": ids}
        for t, (n, ids) in enumerate([(700, [1, 2]), (1500, [1]), (300, [1, 2, 3]), (512, [4])])
    ]
    w = load_workload(f"mooncake:{write_jsonl(tmp_path / 't.jsonl', rows)}")
    for i, (r, row) in enumerate(zip(w.requests, rows, strict=True)):
        ids = np.array(row["hash_ids"], dtype=np.int64)
        blocks = tokens._block_table(ids, 512, 128000).reshape(-1)[: r.prompt_len]
        assert np.array_equal(r.prompt_ids[: len(blocks)], blocks)
        pad = tokens._hash_tokens(
            tokens._key(tokens._SALT_PAD, i), len(blocks), r.prompt_len - len(blocks), 128000
        )
        assert np.array_equal(r.prompt_ids[len(blocks) :], pad)


@pytest.mark.parametrize("rate", [None, 2.0, math.inf])
def test_mooncake_num_requests_builds_only_the_kept_prompts_and_the_same_ones(
    monkeypatch: pytest.MonkeyPatch, rate: float | None
) -> None:
    """``num_requests`` builds the prompts of the requests it keeps, no others, and each is
    the prompt the whole trace's load gives that request (a block several kept prompts share
    is in the shared table, one only one of them uses is generated with its batch)."""
    from radixsched.sim.workloads import traces

    whole = {r.rid: r for r in load_workload(f"mooncake:{SAMPLE}", request_rate=rate).requests}
    built: list[int] = []
    fill = traces._fill_mooncake

    def counting(drafts: Any, block: int, vocab: int) -> None:
        built.append(len(drafts))
        fill(drafts, block, vocab)

    monkeypatch.setattr(traces, "_fill_mooncake", counting)
    monkeypatch.setattr(traces, "_BATCH", 7)  # batches that cut the kept requests
    part = load_workload(f"mooncake:{SAMPLE}", request_rate=rate, num_requests=30).requests
    assert built == [30] and len(part) == 30
    for r in part:
        ref = whole[r.rid]
        assert r.arrival_time == ref.arrival_time and r.max_new_tokens == ref.max_new_tokens
        assert np.array_equal(r.prompt_ids, ref.prompt_ids), r.rid
    assert [r.rid for r in part] == list(whole)[:30]


def test_mooncake_num_requests_keeps_each_lines_padding_when_lines_are_out_of_order(
    tmp_path: Path,
) -> None:
    """The earliest requests are not the first lines: each kept prompt (padded past its ids)
    is still the one its own line gives in the whole load."""
    rows = [
        {"timestamp": t, "input_length": 900, "output_length": 2, "hash_ids": [1]}
        for t in (50, 40, 30, 20, 10)
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    whole = {r.rid: r.prompt_ids for r in load_workload(f"mooncake:{path}").requests}
    part = load_workload(f"mooncake:{path}", num_requests=2).requests
    assert [r.rid for r in part] == ["mooncake-4", "mooncake-3"]
    from radixsched.sim.workloads import tokens

    for r in part:
        assert np.array_equal(r.prompt_ids, whole[r.rid])
        line = int(r.rid.split("-")[1])  # the padding is keyed by the request's line
        pad = tokens._hash_tokens(tokens._key(tokens._SALT_PAD, line), 512, 388, 128000)
        assert np.array_equal(r.prompt_ids[512:], pad)


def test_jsonl_num_requests_hashes_only_the_kept_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts given by length are hashed only for the requests the load keeps, and each is
    the one the whole load gives it (group prefix, then its own tokens keyed by its line)."""
    from radixsched.sim.workloads import tokens, traces

    rows = [
        {"input_length": 60 + i, "output_length": 2, "timestamp": 100 - i}
        | ({"prefix_group": "g", "prefix_length": 20} if i % 2 else {})
        for i in range(9)
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    whole = {r.rid: r.prompt_ids for r in load_workload(f"jsonl:{path}").requests}
    calls: list[int] = []
    real = tokens._hash_tokens

    def counting(key: int, start: int, n: int, vocab: int, out: Any = None) -> Any:
        calls.append(n)
        return real(key, start, n, vocab, out)

    monkeypatch.setattr(traces, "_hash_tokens", counting)
    part = load_workload(f"jsonl:{path}", num_requests=3).requests
    assert [r.rid for r in part] == ["jsonl-8", "jsonl-7", "jsonl-6"]
    assert sorted(calls) == sorted([68, 20, 47, 66])  # 8's own; 7's group prefix and own; 6's
    for r in part:
        assert np.array_equal(r.prompt_ids, whole[r.rid])
    assert np.array_equal(whole["jsonl-7"][:20], whole["jsonl-5"][:20])


# ---- prompts lent between loads (DraftMemo) ----------------------------------------------


def test_a_memo_lends_prompts_to_loads_at_other_rates(
    tmp_path: Path, built_blocks: list[int]
) -> None:
    from radixsched.sim.workloads import load as workloads

    built = built_blocks
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(SAMPLE.read_bytes())
    spec = f"mooncake:{trace}"
    memo = workloads.DraftMemo()
    first = load_workload(spec, request_rate=5, num_requests=40, memo=memo)
    assert built
    n = len(built)
    every = load_workload(spec, request_rate=9, memo=memo)  # the 40 lent, the rest built
    assert len(built) > n
    n = len(built)
    again = load_workload(spec, request_rate=3, memo=memo)
    assert len(built) == n  # nothing left to build
    fresh = load_workload(spec, request_rate=3)
    assert tokens_of(again) == tokens_of(fresh)
    assert [r.arrival_time for r in again.requests] == [r.arrival_time for r in fresh.requests]
    lent = {r.rid: r.prompt_ids for r in every.requests}
    assert all(lent[r.rid] is r.prompt_ids for r in first.requests)
    # Another seed, or a changed file: built anew.
    load_workload(spec, request_rate=3, seed=1, memo=memo)
    assert len(built) > n
    n = len(built)
    load_workload(spec, request_rate=3, seed=1, memo=memo)
    assert len(built) == n
    trace.write_bytes(SAMPLE.read_bytes())
    os.utime(trace, ns=(0, 10**9))
    load_workload(spec, request_rate=3, seed=1, memo=memo)
    assert len(built) > n


def test_the_load_s_positional_constructors_match_the_field_order() -> None:
    # ``load_workload`` builds each Req, and ``traces._build_mooncake`` each draft, by
    # position: a field moved in either class must fail here, not shift values silently.
    import dataclasses

    from radixsched.request import Req
    from radixsched.sim.workloads.load import REQ_FIELDS
    from radixsched.sim.workloads.tokens import DRAFT_FIELDS, _Draft

    names = [f.name for f in dataclasses.fields(Req)]
    assert tuple(names[: len(REQ_FIELDS)]) == REQ_FIELDS
    assert tuple(f.name for f in dataclasses.fields(_Draft)) == DRAFT_FIELDS
