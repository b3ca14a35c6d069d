"""Bad input to ``radixsched calibrate`` and ``simulate --calibration``: every malformed file is
an error that names the file (and the run, request and field), never a traceback, a crash or
a silently wrong fit.

The documents are the fixtures of ``tests/data/calibration`` with one thing broken; no test
runs a whole fit (the ones that reach it fail at its first replay, or replace it).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.main import main
from radixsched.sim.calibrate.measured import ResultFileError, read_result_file
from radixsched.sim.cost.calibration_file import read_calibration, write_calibration
from radixsched.sim.cost.table import CalibrationError

DATA = Path(__file__).parent / "data" / "calibration"
VLLM = DATA / "vllm_benchmark_serving.json"
SWEEP = DATA / "live_tiny_random" / "sweep0.json.gz"
GOOD_DOC = {"format": "radixsched-calibration", "version": 1, "constants": {"mfu": 0.4}}


def _vllm(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(VLLM.read_text())
    doc.update(changes)
    return doc


def _small_vllm(k: int = 4, **changes: Any) -> dict[str, Any]:
    """The vLLM fixture cut to its first ``k`` requests (a replay of it takes little time)."""
    doc = _vllm()
    for key in ("input_lens", "output_lens", "ttfts", "itls", "errors"):
        doc[key] = doc[key][:k]
    doc.update(changes)
    return doc


def _bench_run(mutate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A one-run ``radixsched bench --sweep`` document (its first run), ``mutate``d."""
    doc: dict[str, Any] = json.loads(gzip.decompress(SWEEP.read_bytes()))
    doc["runs"] = doc["runs"][:1]
    if mutate is not None:
        mutate(doc["runs"][0])
    return doc


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _calibrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``radixsched calibrate ARGS`` (CPU, quiet): its status and its stderr."""
    rc = main(["calibrate", *args, "--gpu", "cpu", "--quiet", "--iterations", "0"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


# ---- result files: vLLM / sglang per-request lists -------------------------------------------

N = len(_vllm()["ttfts"])


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"ttfts": ["x"] * N}, r"request 0: field 'ttfts': expected a number, got 'x'"),
        ({"ttfts": [math.nan] * N}, r"request 0: field 'ttfts': expected a finite number"),
        ({"ttfts": [math.inf] * N}, r"request 0: field 'ttfts': expected a finite number"),
        ({"ttfts": [True] * N}, r"request 0: field 'ttfts': expected a number, got True"),
        ({"ttfts": [-0.01] * N}, r"request 0: first token -0\.01 s before the request was sent"),
        ({"input_lens": [None] * N}, r"request 0: field 'input_lens': expected a number"),
        ({"input_lens": ["abc"] * N}, r"request 0: field 'input_lens': expected a number"),
        ({"input_lens": [12.7] * N}, r"field 'input_lens': expected a whole number from 1"),
        ({"input_lens": [0] * N}, r"field 'input_lens': expected a whole number from 1"),
        ({"input_lens": [10**12] * N}, r"field 'input_lens': expected a whole number from 1"),
        ({"output_lens": [10**12] * N}, r"field 'output_lens': expected a whole number from 0"),
        ({"output_lens": [3.5] * N}, r"field 'output_lens': expected a whole number from 0"),
        ({"itls": [0.01] * N}, r"request 0: field 'itls': expected a list of gaps, got 0\.01"),
        ({"itls": [[None]] * N}, r"request 0: field 'itls': expected a number, got null"),
        ({"itls": [["a"]] * N}, r"request 0: field 'itls': expected a number, got 'a'"),
        ({"itls": [[-0.5]] * N}, r"request 0: field 'itls': negative gap -0\.5 s"),
        ({"ttfts": [0.01] * 10}, r"per-request lists of different lengths \(.*ttfts 10"),
        ({"errors": ["", "boom"]}, r"per-request lists of different lengths \(.*errors 2"),
        ({"errors": "oops"}, r"field 'errors': expected a list, got 'oops'"),
        ({"errors": {"a": 1}}, r"field 'errors': expected a list"),
        ({"start_times": ["x"] * N}, r"field 'start_times': expected a number, got 'x'"),
        ({"request_rate": "fast"}, r"field 'request_rate': expected a positive number or 'inf'"),
        ({"request_rate": math.nan}, r"field 'request_rate': expected a positive number"),
        ({"max_concurrency": math.nan}, r"field 'max_concurrency': expected a finite number"),
        ({"max_concurrency": math.inf}, r"field 'max_concurrency': expected a finite number"),
        ({"max_concurrency": "4"}, r"field 'max_concurrency': expected a number, got '4'"),
        ({"max_concurrency": 2.5}, r"field 'max_concurrency': expected a whole number >= 1"),
        ({"server_info": "x"}, r"field 'server_info': expected an object, got 'x'"),
    ],
)
def test_bad_per_request_lists_name_the_file_request_and_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    p = _write(tmp_path / "v.json", _vllm(**changes))
    with pytest.raises(ResultFileError, match=match) as info:
        read_result_file(p)
    assert str(info.value).startswith(str(p))


def test_a_bad_sglang_line_is_named_by_its_line(tmp_path: Path) -> None:
    good = json.dumps(_vllm())
    bad = json.dumps(_vllm(input_lens=["q"] * N))
    p = tmp_path / "s.jsonl"
    p.write_text(f"{good}\n\n{bad}\n")
    with pytest.raises(ResultFileError, match=r"s\.jsonl:3: .*request 0: field 'input_lens'"):
        read_result_file(p)


# ---- result files: GuideLLM --------------------------------------------------------------------

_OK_REQUEST = {
    "prompt_tokens": 5,
    "output_tokens": 3,
    "start_time": 1.0,
    "first_token_time": 1.1,
    "end_time": 1.5,
}


def _guidellm(bench: Any) -> dict[str, Any]:
    return {"benchmarks": [bench]}


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"benchmarks": "abc"}, r"field 'benchmarks': expected a list, got 'abc'"),
        (_guidellm([1]), r"benchmark 0: expected an object, got \[1\]"),
        (_guidellm({"args": "x"}), r"benchmark 0: field 'args': expected an object"),
        (
            _guidellm({"args": {"strategy": "sync"}}),
            r"benchmark 0: args: field 'strategy': expected an object",
        ),
        (_guidellm({"requests": [1, 2]}), r"benchmark 0: field 'requests': expected an object"),
        (
            _guidellm({"requests": {"successful": 5}}),
            r"benchmark 0: requests: field 'successful': expected a list, got 5",
        ),
        (
            _guidellm({"requests": {"successful": ["x"]}}),
            r"benchmark 0: request 0: expected an object, got 'x'",
        ),
        (
            _guidellm({"requests": {"successful": [{"prompt_tokens": 1}]}}),
            r"benchmark 0: request 0: field 'start_time': expected a number, got null",
        ),
        (
            _guidellm({"worker": "x", "requests": {"successful": [_OK_REQUEST]}}),
            r"benchmark 0: field 'worker': expected an object",
        ),
        (
            _guidellm(
                {
                    "args": {"strategy": {"type_": "poisson", "rate": "x"}},
                    "requests": {"successful": [_OK_REQUEST]},
                }
            ),
            r"benchmark 0: args: strategy: field 'rate': expected a positive number",
        ),
        (
            _guidellm({"requests": {"successful": [_OK_REQUEST], "errored": 7}}),
            r"benchmark 0: requests: field 'errored': expected a list, got 7",
        ),
        (
            _guidellm({"requests": {"successful": [{**_OK_REQUEST, "start_time": 10.0}]}}),
            r"benchmark 0: request 0: first token -8\.9 s before the request was sent",
        ),
    ],
)
def test_bad_guidellm_reports_name_the_benchmark_and_field(
    tmp_path: Path, doc: dict[str, Any], match: str
) -> None:
    p = _write(tmp_path / "g.json", doc)
    with pytest.raises(ResultFileError, match=match):
        read_result_file(p)


def test_guidellm_runs_without_successes_are_kept_and_empty_outputs_count_as_failed(
    tmp_path: Path,
) -> None:
    empty_output = {**_OK_REQUEST, "output_tokens": 0}
    doc = {
        "benchmarks": [
            {"requests": {"successful": [_OK_REQUEST, empty_output]}},
            {"requests": {"successful": [], "errored": [{}, {}]}},
        ]
    }
    first, second = read_result_file(_write(tmp_path / "g.json", doc))
    assert (len(first.requests), first.num_failed) == (1, 1)
    assert (len(second.requests), second.num_failed) == (0, 2)


# ---- result files: radixsched bench ------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(run: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        node = run
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if isinstance(node, list):
            node[int(key)] = value
        else:
            node[key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_set("requests.0", "x"), r"synchronous: request 0: expected an object, got 'x'"),
        (
            _set("requests.0.token_times", "abc"),
            r"request 0: field 'token_times': expected a list, got 'abc'",
        ),
        (
            _set("requests.0.token_times", [math.nan, 0.1]),
            r"request 0: field 'token_times': expected a finite number",
        ),
        (_set("requests.0.sent_at", 99.0), r"request 0: first token .* before the request"),
        (_set("requests.0.prompt_len", 3.7), r"request 0: field 'prompt_len': expected a whole"),
        (_set("config.bench", "x"), r"synchronous: config: field 'bench': expected an object"),
        (_set("config.bench.seed", "x"), r"config: bench: field 'seed': expected a whole number"),
        (
            _set("config.server.scheduler", "x"),
            r"config: server: field 'scheduler': expected an object",
        ),
        (
            _set("config.server.kv_slots", -1),
            r"config: server: field 'kv_slots': expected a whole number >= 1",
        ),
    ],
)
def test_bad_bench_records_name_the_run_request_and_field(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], match: str
) -> None:
    p = _write(tmp_path / "b.json", _bench_run(mutate))
    with pytest.raises(ResultFileError, match=match):
        read_result_file(p)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"format": "radixsched-bench-sweep", "runs": "x"}, r"field 'runs': expected a list"),
        ({"format": "radixsched-bench-sweep", "runs": [1]}, r"run 0: expected an object, got 1"),
        ({"format": "radixsched-bench-sweep", "runs": []}, r"sweep without runs"),
        (GOOD_DOC, r"a calibration file, not a result file"),
    ],
)
def test_bad_sweep_documents(tmp_path: Path, doc: dict[str, Any], match: str) -> None:
    with pytest.raises(ResultFileError, match=match):
        read_result_file(_write(tmp_path / "s.json", doc))


def test_a_request_without_tokens_or_error_keeps_the_prompts_regenerated(tmp_path: Path) -> None:
    """The ids of the successful requests line up with them, so the replay still regenerates
    the very prompts bench sent (shared prefixes), not request-unique ones."""
    from radixsched.sim.calibrate.replay import _replay_requests

    doc = _bench_run(_set("requests.3.token_times", []))
    (run,) = read_result_file(_write(tmp_path / "b.json", doc))
    assert run.num_failed == 1 and len(run.workload["rids"]) == len(run.requests)
    reqs = _replay_requests(run, 0)
    assert [r.rid for r in reqs] == run.workload["rids"]
    assert [r.prompt_len for r in reqs] == [m.prompt_len for m in run.requests]


def test_a_workload_that_does_not_regenerate_the_prompts_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from radixsched.sim.calibrate.replay import _replay_requests

    spec = "shared-prefix:groups=2,prompts=2"
    (run,) = read_result_file(
        _write(tmp_path / "b.json", _bench_run(_set("config.bench.workload", spec)))
    )
    with caplog.at_level(logging.WARNING):
        reqs = _replay_requests(run, 0)
    assert [r.prompt_len for r in reqs] == [m.prompt_len for m in run.requests]
    assert "does not regenerate the requests bench sent" in caplog.text


# ---- result files: the file itself -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        (
            "deep.json",
            "[" * 100_000 + "]" * 100_000,
            r"deep\.json: invalid JSON: nested too deeply",
        ),
        ("deep.jsonl", "[" * 100_000 + "]" * 100_000, r"deep\.jsonl:1: invalid JSON: nested too"),
        ("big.json", '{"ttfts": [' + "9" * 5000 + "]}", r"big\.json: invalid JSON: Exceeds the"),
        ("big.jsonl", '{"a": ' + "9" * 5000 + "}\n", r"big\.jsonl:1: invalid JSON: Exceeds the"),
        ("list.json", "[1, 2]", r"list\.json: expected a JSON object \(a result document\)"),
        ("bad.json", b"\xff\xfe{}", r"bad\.json: cannot read: not UTF-8 text"),
    ],
)
def test_unparsable_result_files_name_the_file(
    tmp_path: Path, name: str, content: str | bytes, match: str
) -> None:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ResultFileError, match=match):
        read_result_file(p)


def test_a_cut_short_pretty_printed_file_is_named_where_it_ends(tmp_path: Path) -> None:
    text = json.dumps(_vllm(), indent=1)
    p = tmp_path / "cut.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(
        ResultFileError, match=r"cut\.json:\d+: invalid JSON: .*cut short\?"
    ) as info:
        read_result_file(p)
    line = int(str(info.value).removeprefix(str(p)).split(":")[1])
    assert line > 1  # where it ends, not the first line


def test_gzip_and_a_byte_order_mark_are_read_whatever_the_name(tmp_path: Path) -> None:
    (plain,) = read_result_file(VLLM)
    packed = tmp_path / "packed.json"
    packed.write_bytes(gzip.compress(VLLM.read_bytes()))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + VLLM.read_bytes())
    for p in (packed, bom):
        (run,) = read_result_file(p)
        assert run.requests == plain.requests


# ---- radixsched calibrate --------------------------------------------------------------------


def test_output_that_is_a_result_file_is_refused_before_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _write(tmp_path / "results.json", _small_vllm())
    before = p.read_bytes()
    rc, err = _calibrate(capsys, str(p), "--output", str(tmp_path / "." / "results.json"))
    assert rc == 2 and "writing it would destroy the measurements" in err
    assert p.read_bytes() == before


@pytest.mark.parametrize(
    ("output", "match"), [(".", "is a directory"), ("missing/cal.json", "no directory")]
)
def test_an_output_that_cannot_be_written_is_refused_before_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, match: str
) -> None:
    p = _write(tmp_path / "results.json", _small_vllm())
    rc, err = _calibrate(capsys, str(p), "--output", str(tmp_path / output))
    assert rc == 2 and match in err


def test_runs_without_successes_are_named(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = _write(tmp_path / "failed.json", _small_vllm(errors=["boom"] * 4))
    zero = _write(tmp_path / "zero.json", _small_vllm(ttfts=[0.0] * 4))
    rc, err = _calibrate(capsys, str(failed), str(zero), "-o", str(tmp_path / "c.json"))
    assert rc == 2 and "no run in these files has a successful request" in err
    assert f"{failed}: concurrency 4: 4 failed" in err and f"{zero}: concurrency 4: 4 failed" in err

    # Beside a run that succeeded, one without successes is left out, with a warning.
    import radixsched.sim.calibrate.fit as calibrate
    from radixsched.sim.cost.roofline import CONSTANTS

    fitted: list[list[str]] = []

    def fake_fit(replays: list[Any], **_: Any) -> calibrate.FitResult:
        fitted.append([rp.run.path for rp in replays])
        return calibrate.FitResult(dict(CONSTANTS), [], 0, 0.0)

    monkeypatch.setattr(calibrate, "fit", fake_fit)
    good = _write(tmp_path / "good.json", _small_vllm())
    with caplog.at_level(logging.WARNING):
        rc, _ = _calibrate(capsys, str(good), str(failed), "-o", str(tmp_path / "c.json"))
    assert rc == 0 and fitted == [[str(good)]]
    assert f"{failed}: concurrency 4: 4 failed, none succeeded: not fitted on" in caplog.text


def _run_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: dict[str, Any], *flags: str
) -> str:
    p = _write(tmp_path / "r.json", doc)
    rc, err = _calibrate(
        capsys, str(p), "--model", "tiny-random", "-o", str(tmp_path / "c.json"), *flags
    )
    assert rc == 2, err
    assert not (tmp_path / "c.json").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"radixsched: error: {p}: "), err
    return lines[0]


def test_requests_longer_than_the_models_context_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run_cli(capsys, tmp_path, _small_vllm(input_lens=[5000] * 4))
    assert "request 0: 5000 prompt + 43 output tokens do not fit the 4096-token context" in line


def test_requests_the_replay_cannot_serve_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run_cli(capsys, tmp_path, _small_vllm(), "--max-total-tokens", "200")
    assert "of 4 requests were not served in the replay" in line and "KV capacity 200" in line


def test_requests_the_replay_cuts_short_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Room for every prompt, not for every output: the simulator caps them (silently).
    line = _run_cli(capsys, tmp_path, _small_vllm(), "--max-total-tokens", "230")
    assert "the replay generated 115 output tokens, 132 were measured" in line


def test_measured_times_next_to_zero_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _small_vllm(ttfts=[1e-300] * 4)
    doc["itls"] = [[1e-300] * (n - 1) for n in doc["output_lens"]]
    line = _run_cli(capsys, tmp_path, doc, "--max-total-tokens", "8192")  # (a quick replay)
    assert "too small to fit relative errors on" in line


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (
            _set("config.server.scheduler.chunked_prefill_size", "x"),
            "config.server.scheduler: unusable settings",
        ),
        (
            _set("config.server.scheduler.schedule_policy", "nope"),
            "schedule_policy 'nope' unknown to this build",
        ),
        (
            _set("config.bench.workload", "nosuch:x=1"),
            "cannot replay its requests: unknown workload 'nosuch'",
        ),
    ],
)
def test_bench_settings_that_cannot_be_replayed_name_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutate: Callable[[dict[str, Any]], None],
    match: str,
) -> None:
    doc = _bench_run(mutate)
    doc["runs"][0]["requests"] = doc["runs"][0]["requests"][:4]
    assert match in _run_cli(capsys, tmp_path, doc)


# ---- calibration files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({**GOOD_DOC, "constants": {"request_latency_s": 10**400}}, "expected a finite number"),
        ({**GOOD_DOC, "constants": {"mfu": 0}}, r"'mfu': expected a number in \(0, 1\]"),
        ({**GOOD_DOC, "constants": {"mbu": 5.0}}, r"'mbu': expected a number in \(0, 1\]"),
        ({**GOOD_DOC, "constants": {"step_overhead_s": 1e300}}, r"at most 3600 \(seconds\)"),
        ({**GOOD_DOC, "fitted_on": "x"}, "'fitted_on' must be an object"),
        ({**GOOD_DOC, "rows": False}, "'rows' must be a list of objects"),
        ({"format": "radixsched-calibration"}, "no 'version'"),
        ({**GOOD_DOC, "version": 3}, "written by a newer radixsched"),
        ({**GOOD_DOC, "version": True}, "calibration version True"),
        (json.loads(VLLM.read_text()), "a benchmark result, not a calibration file"),
        (_bench_run(), "a benchmark result, not a calibration file"),
        ({"format": "other"}, "not a calibration file \\(format 'other'\\)"),
        ([{"kind": "decode", "batch_size": 1, "num_tokens": 1, "ms": 1e308}], "step time of"),
    ],
)
def test_bad_calibration_files_name_the_file(tmp_path: Path, doc: Any, match: str) -> None:
    p = _write(tmp_path / "c.json", doc)
    with pytest.raises(CalibrationError, match=match) as info:
        read_calibration(p)
    assert str(info.value).startswith(str(p))


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("empty.json", b"", "empty calibration file"),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested too deeply"),
        ("big.json", b"9" * 5000, "invalid JSON: Exceeds the limit"),
        ("big.jsonl", b'{"ms": ' + b"9" * 5000 + b"}\n", "Exceeds the limit"),
        ("bad.json", b"\xff\xfe", r"not UTF-8 text \(byte 0"),
        ("bad.csv", b"kind,batch_size,num_tokens,ms\n\xff,1,1,1\n", "not UTF-8 text"),
        ("packed.json", gzip.compress(json.dumps(GOOD_DOC).encode()), "gzip-compressed"),
        ("results.jsonl", VLLM.read_bytes() + b"\n", "a benchmark result, not a calibration"),
        ("big_ms.csv", b"kind,batch_size,num_tokens,ms\ndecode,1,1,1e308\n", "step time of"),
        (
            "bom.csv",
            b"\xef\xbb\xbfkind,batch_size,num_tokens,ms\ndecode,1,1,1\n",
            "byte-order mark",
        ),
    ],
)
def test_unreadable_calibration_files_name_the_file(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(CalibrationError, match=match) as info:
        read_calibration(p)
    assert str(info.value).startswith(str(p))


def test_a_calibration_document_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD_DOC).encode())
    assert read_calibration(p).constants == {"mfu": 0.4}


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("results.json", VLLM.read_bytes(), "a benchmark result, not a calibration file"),
        ("big_ms.csv", b"kind,batch_size,num_tokens,ms\ndecode,1,1,1e308\n", "step time of"),
        ("bad.json", b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_simulate_with_a_bad_calibration_file_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, match: str
) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    rc = main(
        [
            "simulate",
            "--quiet",
            "--model",
            "tiny-random",
            "--gpu",
            "cpu",
            "--workload",
            "shared-prefix:groups=1,prompts=2,system_len=16,question_len=8,output_len=4",
            "--policy",
            "fcfs",
            "--jobs",
            "1",
            "--calibration",
            str(p),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().startswith(f"radixsched: error: {p}") and match in err


def test_writing_a_calibration_replaces_the_file_whole(tmp_path: Path) -> None:
    p = _write(tmp_path / "c.json", GOOD_DOC)
    with pytest.raises(ValueError):
        write_calibration(p, constants={"mfu": math.nan}, fitted_on={})
    assert json.loads(p.read_text()) == GOOD_DOC  # untouched
    write_calibration(p, constants={"mfu": 0.3}, fitted_on={"model": "m"})
    assert read_calibration(p).constants == {"mfu": 0.3}
    assert [q.name for q in tmp_path.iterdir()] == ["c.json"]  # no temporary left
