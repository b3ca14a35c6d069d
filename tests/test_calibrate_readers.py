"""The calibration readers on files real clients wrote (tests/data/bench_tools: GuideLLM 0.2.1
through 0.8.1, sglang.bench_serving, vllm bench serve, each run against radixsched serve), on
unsupported and damaged files, and the replay of the benchmark's shared prefixes."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.cli.main import main
from radixsched.sim.calibrate.measured import (
    MeasuredRun,
    PrefixBucket,
    ResultFileError,
    read_result_file,
)
from radixsched.sim.calibrate.prompts import replay_prompts

TOOLS = Path(__file__).parent / "data" / "bench_tools"
ONE_64 = (PrefixBucket(100.0, 1, 64),)
TWO_BUCKETS = (PrefixBucket(50.0, 1, 64), PrefixBucket(50.0, 2, 32))
INF = math.inf

# file -> (version named, [(name, rate, concurrency)], prefixes)
GUIDELLM: dict[str, tuple[str, list[tuple[str, float, int | None]], Any]] = {
    "guidellm-0.2.1/benchmarks.json": (
        "0.2-0.3",
        [("constant@2", 2.0, None), ("constant@4", 4.0, None), ("constant@8", 8.0, None)],
        (),
    ),
    "guidellm-0.3.1/benchmarks.json": (
        "0.2-0.3",
        [("concurrent@1", INF, 1), ("concurrent@2", INF, 2), ("concurrent@4", INF, 4)],
        ONE_64,
    ),
    "guidellm-0.4.0/benchmarks.json.gz": (
        "0.4",
        [("constant@2", 2.0, None), ("constant@4", 4.0, None), ("constant@8", 8.0, None)],
        ONE_64,
    ),
    "guidellm-0.5.4/benchmarks.json.gz": (
        "0.5.4",
        [("concurrent@1", INF, 1), ("concurrent@2", INF, 2), ("concurrent@4", INF, 4)],
        ONE_64,
    ),
    "guidellm-0.6.1/benchmarks.json.gz": (
        "0.6.1",
        [("constant@2", 2.0, None), ("constant@4", 4.0, None), ("constant@8", 8.0, None)],
        (PrefixBucket(100.0, 2, 64),),
    ),
    "guidellm-0.7.4/benchmarks.json": (
        "0.7.4",
        [("poisson@2", 2.0, None), ("poisson@6", 6.0, None)],
        TWO_BUCKETS,
    ),
    "guidellm-0.8.1/benchmarks.json.gz": (
        "0.8.1",
        [("constant@2", 2.0, None), ("constant@4", 4.0, None), ("constant@8", 8.0, None)],
        TWO_BUCKETS,
    ),
    "guidellm-0.8.1/concurrent.json.gz": (
        "0.8.1",
        [("concurrent@1", INF, 1), ("concurrent@4", INF, 4)],
        ONE_64,
    ),
}


def _raw(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def _last_token(r: dict[str, Any]) -> float:
    """Seconds from the send to the last token, from the raw request record."""
    if "start_time" in r:  # 0.2-0.3
        return float(r["last_token_time"] - r["start_time"])
    return float(r["info"]["timings"]["last_token_iteration"] - r["request_start_time"])


@pytest.mark.parametrize("name", sorted(GUIDELLM))
def test_every_guidellm_version_reads_with_its_stages_and_prefixes(name: str) -> None:
    version, stages, prefixes = GUIDELLM[name]
    runs = read_result_file(TOOLS / name)
    assert [(r.name, r.request_rate, r.max_concurrency) for r in runs] == stages
    raw = _raw(TOOLS / name)["benchmarks"]
    for run, bench in zip(runs, raw, strict=True):
        assert run.source == "guidellm" and run.tool_version == version
        assert run.model == "tiny-random" and run.prefixes == prefixes
        assert run.structure_note is None
        successful = bench["requests"]["successful"]
        assert len(run.requests) == len(successful) == 20 and run.num_failed == 0
        # TTFT as GuideLLM itself computed it, request by request; E2E: to the last token
        # (the request's latency also holds the stream's closing chunks).
        for m, r in zip(run.requests, successful, strict=True):
            assert m.ttft_s == pytest.approx(r["time_to_first_token_ms"] / 1e3, abs=1e-6)
            assert m.e2e_s == pytest.approx(_last_token(r), abs=1e-6)
            assert m.ttft_s <= m.e2e_s <= r["request_latency"] + 1e-6
            assert m.prompt_len == r["prompt_tokens"] and m.output_len == 16
        assert min(m.sent_at or 0.0 for m in run.requests) == 0.0


def test_guidellm_08_keeps_the_servers_cached_tokens() -> None:
    runs = read_result_file(TOOLS / "guidellm-0.8.1/benchmarks.json.gz")
    raw = _raw(TOOLS / "guidellm-0.8.1/benchmarks.json.gz")["benchmarks"][0]
    cached = [r["cached_tokens"] for r in raw["requests"]["successful"]]
    assert [m.cached_tokens for m in runs[0].requests] == cached
    assert any(c and c >= 32 for c in cached)  # the server did hit the shared prefixes


def test_sglang_jsonl_runs_and_their_structure() -> None:
    gsp = read_result_file(TOOLS / "sglang-0.5.23/gsp.jsonl")
    assert [(r.request_rate, r.max_concurrency) for r in gsp] == [(4.0, None), (16.0, None)]
    raw = [json.loads(line) for line in (TOOLS / "sglang-0.5.23/gsp.jsonl").open()]
    for run, doc in zip(gsp, raw, strict=True):
        assert len(run.requests) == doc["completed"] == 20 and run.model == "tiny-random"
        ttft = np.mean([m.ttft_s for m in run.requests]) * 1e3
        assert ttft == pytest.approx(doc["mean_ttft_ms"], rel=1e-9)
        # The gsp arguments are not in the file: the structure is unknown and said so.
        assert run.prefixes is None and "--gsp-*" in (run.structure_note or "")
    rand = read_result_file(TOOLS / "sglang-0.5.23/random.jsonl")
    assert [(r.request_rate, r.max_concurrency) for r in rand] == [(INF, 2), (INF, 8)]
    assert all(r.prefixes == () and r.structure_note is None for r in rand)


@pytest.mark.parametrize("rate", [4, 16])
def test_vllm_bench_serve_results(rate: int) -> None:
    path = TOOLS / f"vllm-0.33.0/rate{rate}.json"
    (run,) = read_result_file(path)
    doc = _raw(path)
    assert (run.source, run.request_rate, run.max_concurrency) == ("vllm", rate, None)
    assert len(run.requests) == doc["completed"] == 20
    ttft = np.mean([m.ttft_s for m in run.requests]) * 1e3
    assert ttft == pytest.approx(doc["mean_ttft_ms"], rel=1e-9)
    e2e = [m.e2e_s for m in run.requests]
    assert e2e == pytest.approx(doc["latencies"], abs=2e-3)
    assert [m.sent_at for m in run.requests] == pytest.approx(
        [t - min(doc["start_times"]) for t in doc["start_times"]]
    )
    assert run.prefixes is None and "--random-prefix-len" in (run.structure_note or "")


# ---- unsupported and damaged files -----------------------------------------------------------


def _edited(tmp_path: Path, name: str, edit: Any) -> Path:
    doc = _raw(TOOLS / name)
    edit(doc)
    out = tmp_path / "report.json"
    out.write_text(json.dumps(doc))
    return out


def _set_version(doc: dict[str, Any]) -> None:
    doc["metadata"]["guidellm_version"] = "0.9.0"


def _drop_metadata_version(doc: dict[str, Any]) -> None:
    del doc["metadata"]["guidellm_version"]


def _null_first_token(doc: dict[str, Any]) -> None:
    doc["benchmarks"][1]["requests"]["successful"][3]["info"]["timings"][
        "first_token_iteration"
    ] = None


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            _set_version,
            r"GuideLLM report version 0\.9\.0 is not supported \(fields benchmarks, "
            r"conclusions, config, metadata\); supported: 0\.2-0\.8$",
        ),
        (_drop_metadata_version, r"version unknown \(metadata version 2\) is not supported"),
        (
            _null_first_token,
            r"GuideLLM 0\.8\.1 report: benchmark 1: request 3: info: timings: field "
            r"'first_token_iteration': expected a number, got null$",
        ),
    ],
)
def test_unsupported_or_damaged_guidellm_reports_say_which(
    tmp_path: Path, edit: Any, match: str
) -> None:
    path = _edited(tmp_path, "guidellm-0.8.1/benchmarks.json.gz", edit)
    with pytest.raises(ResultFileError, match=match) as err:
        read_result_file(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_calibrate_refuses_an_unsupported_report_in_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _edited(tmp_path, "guidellm-0.8.1/benchmarks.json.gz", _set_version)
    rc = main(["calibrate", str(path), "--gpu", "cpu", "-o", str(tmp_path / "c.json")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "0.9.0 is not supported" in err[0]
    assert not (tmp_path / "c.json").exists()


# ---- the replay sends what the benchmark sent ------------------------------------------------


def _heads(run: MeasuredRun, n: int) -> set[bytes]:
    return {r.prompt_ids[:n].tobytes() for r in replay_prompts(run, 0)}


def test_replay_shares_the_prefixes_the_guidellm_spec_recorded() -> None:
    run = read_result_file(TOOLS / "guidellm-0.7.4/benchmarks.json")[0]
    reqs = replay_prompts(run, 0)
    assert [r.prompt_len for r in reqs] == [m.prompt_len for m in run.requests]
    # Bucket 1: one 64-token prefix; bucket 2: two 32-token ones: three distinct 32-token heads.
    assert len(_heads(run, 32)) == 3
    assert len({r.prompt_ids[32:].tobytes() for r in reqs}) == len(reqs)  # the rest unique
    one = read_result_file(TOOLS / "guidellm-0.3.1/benchmarks.json")[0]
    assert len(_heads(one, 64)) == 1 and len(_heads(one, 65)) == len(one.requests)


def test_replay_without_a_known_structure_is_request_unique() -> None:
    (run,) = read_result_file(TOOLS / "vllm-0.33.0/rate4.json")
    assert len(_heads(run, 8)) == len(run.requests)


def test_calibrate_on_a_guidellm_report_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GuideLLM as a client of the calibration loop: its real file, read as is, fitted."""
    out = tmp_path / "cal.json"
    src = str(TOOLS / "guidellm-0.8.1/concurrent.json.gz")
    rc = main(["calibrate", src, "--gpu", "cpu", "-o", str(out), "--iterations", "2"])
    assert rc == 0
    assert "concurrent@4" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["fitted_on"]["model"] == "tiny-random"
    assert [r["source"] for r in doc["fitted_on"]["runs"]] == ["guidellm", "guidellm"]


def test_calibrate_notes_an_unknown_structure_once_per_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "cal.json"
    src = str(TOOLS / "sglang-0.5.23/gsp.jsonl")
    with caplog.at_level("WARNING"):
        rc = main(
            [
                "calibrate",
                src,
                "--gpu",
                "cpu",
                "-o",
                str(out),
                "--iterations",
                "1",
                "--no-holdout",
                "--max-total-tokens",
                "65536",
            ]
        )
    assert rc == 0
    notes = [r.getMessage() for r in caplog.records if "--gsp-*" in r.getMessage()]
    assert len(notes) == 1 and "request-unique prompts" in notes[0]


# ---- calibrate --workload: the user's own prompts --------------------------------------------


def _trace(tmp_path: Path, lens: list[int], prefix: int) -> Path:
    lines = [
        {"input_length": n, "prefix_group": 0, "prefix_length": prefix, "output_length": 16}
        for n in lens
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_match_trace_takes_the_next_prompt_of_each_length() -> None:
    from radixsched.sim.calibrate.prompts import match_trace

    (run,) = read_result_file(TOOLS / "vllm-0.33.0/rate4.json")
    lens = [m.prompt_len for m in run.requests]
    trace = [np.full(n, j, dtype=np.int32) for j, n in enumerate([*lens[::-1], 7])]
    prompts, exact = match_trace(run, trace)
    assert exact == len(run.requests)
    assert [len(p) for p in prompts] == lens
    assert len({int(p[0]) for p in prompts}) == len(prompts)  # each trace prompt used once
    # A length the trace lacks: the next unused prompt, extended to the measured length.
    short = [np.full(5, 1, dtype=np.int32), np.full(6, 2, dtype=np.int32)]
    prompts, exact = match_trace(run, short)
    assert exact == 0 and [len(p) for p in prompts] == lens
    assert [int(p[0]) for p in prompts[:4]] == [1, 2, 1, 2]


def test_calibrate_workload_replays_the_users_prefixes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = TOOLS / "vllm-0.33.0/rate4.json"
    (run,) = read_result_file(src)
    trace = _trace(tmp_path, [m.prompt_len for m in run.requests], prefix=64)
    out = tmp_path / "cal.json"
    with caplog.at_level("WARNING"):
        rc = main(
            [
                *("calibrate", str(src), "--gpu", "cpu", "-o", str(out), "--iterations", "1"),
                *("--workload", f"jsonl:{trace}"),
            ]
        )
    assert rc == 0 and out.exists()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "request-unique" not in said and "match a --workload" not in said
    # What the replay sends: the trace's prompts, so its 64-token group prefix is shared.
    from radixsched.sim.calibrate.prompts import with_trace
    from radixsched.sim.workloads.load import load_workload

    replayed, exact = with_trace(
        run, [r.prompt_ids for r in load_workload(f"jsonl:{trace}").requests]
    )
    assert exact == len(run.requests)
    reqs = replay_prompts(replayed, 0)
    assert len({r.prompt_ids[:64].tobytes() for r in reqs}) == 1
    assert len({r.prompt_ids[:65].tobytes() for r in reqs}) == len(reqs)


def test_calibrate_workload_that_cannot_load_is_a_flag_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = TOOLS / "vllm-0.33.0/rate4.json"
    missing = tmp_path / "none.jsonl"
    rc = main(
        [
            *("calibrate", str(src), "--gpu", "cpu", "-o", str(tmp_path / "c.json")),
            *("--workload", f"jsonl:{missing}"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("radixsched: error: --workload jsonl:")
    assert not (tmp_path / "c.json").exists()


# ---- inference-perf ----------------------------------------------------------------------------

IPERF = TOOLS / "inference-perf-0.7.0"


def test_inference_perf_stages_from_the_files_beside_the_per_request_report() -> None:
    runs = read_result_file(IPERF / "per_request_lifecycle_metrics.json.gz")
    assert [(r.name, r.request_rate, r.max_concurrency) for r in runs] == [
        ("stage 0 rate 2", 2.0, None),
        ("stage 1 rate 6", 6.0, None),
    ]
    for k, run in enumerate(runs):
        stage = json.loads((IPERF / f"stage_{k}_lifecycle_metrics.json").read_text())
        ok = stage["successes"]
        assert len(run.requests) == ok["count"] and run.num_failed == 0
        ttft = np.mean([m.ttft_s for m in run.requests])
        assert ttft == pytest.approx(ok["latency"]["time_to_first_token"]["mean"], rel=1e-9)
        assert {m.output_len for m in run.requests} == {16}  # the server's count
        assert run.model == "tiny-random" and run.prefixes == (PrefixBucket(100.0, 2, 64),)


def test_inference_perf_without_its_stage_files_says_so(tmp_path: Path) -> None:
    lone = tmp_path / "per_request_lifecycle_metrics.json.gz"
    lone.write_bytes((IPERF / "per_request_lifecycle_metrics.json.gz").read_bytes())
    with pytest.raises(ResultFileError, match=r"inference-perf report: no stage_0_lifecycle"):
        read_result_file(lone)


def test_guidellm_chunks_that_carry_several_tokens_are_measured_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GuideLLM 0.6+ counts the streamed chunks that carried tokens: tiny-random's random
    bytes wait for whole UTF-8 characters, so its chunks carry several tokens, and calibrate
    says that the measured TTFT is a first chunk's. A layout without the count says nothing."""
    import logging

    from radixsched.cli.main import main

    path = TOOLS / "guidellm-0.8.1" / "benchmarks.json.gz"
    runs = read_result_file(path)
    assert all(r.tokens_per_chunk is not None and 3.0 < r.tokens_per_chunk < 5.0 for r in runs)
    assert all(
        r.tokens_per_chunk is None
        for r in read_result_file(TOOLS / "guidellm-0.3.1" / "benchmarks.json")
    )
    argv = ["calibrate", str(path), "--gpu", "cpu", "--max-total-tokens", "4096"]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "--check", "default", "--quiet"]) == 0
    said = [m for m in caplog.messages if "streamed chunks carried" in m]
    assert len(said) == 1 and f"({len(runs)} of its runs)" in said[0]
