"""Bad input to ``radixsched simulate`` (flags, ``--config`` files, ``--model`` config.json
files, workload specs and traces, output paths): one error line naming the flag, or the file
and line or field, exit status 2 and nothing run; never a traceback, a silently wrong run or
an overwritten input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.main import main
from radixsched.results.table import fmt_int, fmt_rate, fmt_seconds
from radixsched.sim.cost.hardware import ModelSpec

SMALL = "shared-prefix:groups=2,prompts=2,system_len=32,question_len=8,output_len=4"
# A model config.json small enough to simulate in milliseconds.
TINY_MODEL: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


def _simulate(*args: str) -> int:
    workload = [] if "--workload" in args else ["--workload", SMALL]
    policy = [] if "--policy" in args else ["--policy", "fcfs"]
    return main(["simulate", "--quiet", "--jobs", "1", *workload, *policy, *args])


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of a run refused before anything ran."""
    assert _simulate(*args) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("radixsched: error: ")
    return lines[0]


def _write_jsonl(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


# ---- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        # Extreme cost-model values: overflowed step times and a table of 300-digit numbers.
        ["--step-overhead-ms", "1e300"],
        ["--sched-per-req-ms", "1e300"],
        ["--prefill-eff-tokens", "1e300"],
        ["--mfu", "1e-300"],
        ["--mbu", "1e-300"],
        # Tracebacks (int(inf), int(nan)), or a bad value silently unused.
        ["--enable-hierarchical-cache", "--hicache-size", "inf"],
        ["--enable-hierarchical-cache", "--hicache-size", "nan"],
        ["--hicache-size", "-1"],
        ["--hicache-page-size", "0"],
        # Scheduler settings no check bounded: tracebacks mid-run or silently odd runs.
        ["--seed", "-1"],
        ["--schedule-conservativeness", "nan"],
        ["--init-new-token-ratio", "-1"],
        ["--min-new-token-ratio-factor", "nan"],
        ["--new-token-ratio-decay-steps", "0"],
        ["--retract-decode-steps", "-1"],
        ["--clip-max-new-tokens", "-1"],
        ["--prefill-max-requests", "0"],
        ["--max-running-requests", "0"],
        ["--max-prefix-match-queue", "-1"],
        ["--in-batch-prefix-check-threshold", "-1"],
        ["--priority-scheduling-preemption-threshold", "-1"],
        ["--lpm-max-wait-s", "nan"],
        ["--lpm-max-wait-tokens", "-1"],
        ["--prefill-delayer-max-delay-ms", "nan"],
        ["--prefill-delayer-token-usage-low-watermark", "nan"],
        ["--disaggregation", "--disaggregation-link-bandwidth-gb-s", "1e-300"],
        ["--disaggregation", "--disaggregation-link-latency-ms", "1e300"],
    ],
)
def test_out_of_range_flags_name_the_flag(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    flag = args[-2]  # the flag given the bad value
    assert f"error: {flag}: must be " in _error(capsys, *args)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-total-tokens", "1000000000000000"], "more than this machine's"),
        (["--dp", "10000000"], "lower max_total_tokens or dp"),
        (["--disaggregation", "--decode-max-total-tokens", "10000000000000"], "page tables"),
    ],
)
def test_kv_pools_larger_than_memory_are_refused(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an allocation error (traceback) or a machine driven out of memory.
    assert needle in _error(capsys, *args)


@pytest.mark.parametrize(
    "args",
    [
        ["--prefill-instances", "2"],
        ["--decode-instances", "3"],
        ["--decode-gpu", "H200"],
        ["--decode-router", "least-load"],
        ["--disaggregation-link", "nvlink"],
        ["--disaggregation-bootstrap-ms", "2"],
    ],
)
def test_split_deployment_flags_without_disaggregation_are_refused(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: parsed, then ignored (one replica ran as if they had not been given).
    assert f"{args[0]} applies to --disaggregation only" in _error(capsys, *args)


def test_a_request_rate_that_spreads_arrivals_past_the_clock_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: arrivals 1e300 s apart ran, and every latency after the first read 0.
    line = _error(capsys, "--request-rate", "1e-300")
    assert "poisson 1e-300 req/s" in line and "raise the request rate" in line


def test_argparse_type_errors_say_what_the_value_should_be(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _simulate("--step-overhead-ms", "abc") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--step-overhead-ms: expected a number (or none), got 'abc'" in last
    assert "_parse_optional" not in last


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "fcfs,lpm,fcfs"], "error: --policy: fcfs given twice"),
        (["--workload", ""], "error: --workload: expected a workload spec"),
        (["--workload", " "], "error: --workload: expected a workload spec"),
        (["--json", ""], "error: --json: expected a file path"),
    ],
)
def test_duplicate_policies_and_empty_values(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: fcfs ran twice (results keyed by name collided), the empty workload ran the
    # 2,048-request default, an empty --json path was "a directory".
    assert needle in _error(capsys, *args)


# ---- workload specs and traces -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("shared-prefix:groups=1000000000", "over 10,000,000 requests"),
        ("tree-of-thought:depth=60,trees=1", "over 10,000,000 requests"),
        ("shared-prefix:system_len=100000000000", "param 'system_len': must be <= 16,777,216"),
        ("shared-prefix:vocab=3000000000", "param 'vocab': must be <= 2,147,483,648"),
        ("mooncake:path=x.jsonl,block_size=99999999999", "param 'block_size'"),
        ("shared-prefix:groups=2,prompts=2,groups=3", "param 'groups' is given twice"),
        ("multi-turn:conversations=2,turns=2,think_time_s=1e300", "shorten think_time_s"),
    ],
)
def test_generator_params_that_cannot_be_built(
    spec: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a hang, an allocation traceback, a silently dropped param, lost time precision.
    assert needle in _error(capsys, "--workload", spec)


JSONL = '{"input_length": 4, "output_length": 1%s}'
MOONCAKE = '{"timestamp": %s, "input_length": %s, "output_length": 1, "hash_ids": [1]}'


@pytest.mark.parametrize(
    ("kind", "lines", "needle"),
    [
        ("jsonl", [JSONL % ', "timestamp": 0', JSONL % f', "timestamp": 1{"0" * 400}'],
         "field 'timestamp': expected a non-negative number below 1e308"),
        ("jsonl", [JSONL % ', "timestamp": 0', JSONL % ', "timestamp": 1e20'],
         "field 'timestamp': 1e+20 is 1e+17 s after the first request"),
        ("jsonl", [JSONL % ', "arrival_time": 0', JSONL % ', "arrival_time": 1e12'],
         "field 'arrival_time': 1e+12 is 1e+12 s after the first request"),
        ("jsonl", [JSONL % "", JSONL % f', "priority": 1{"0" * 30}'],
         "field 'priority': expected a signed 64-bit integer"),
        ("jsonl", [JSONL % "", '{"input_length": 100000000000, "output_length": 1}'],
         "field 'input_length': expected at most 16,777,216 tokens"),
        ("mooncake", [MOONCAKE % (0, 4), MOONCAKE % (0, 100000000000)],
         "field 'input_length': expected at most 16,777,216 tokens"),
        ("mooncake", [MOONCAKE % (0, 4), MOONCAKE % ("1e20", 4)],
         "field 'timestamp': 1e+20 is 1e+17 s after the first request"),
    ],
)  # fmt: skip
def test_bad_trace_lines_name_file_and_line(
    kind: str, lines: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an OverflowError traceback (a 400-digit integer), arrivals 1e17 s apart run with
    # every later latency lost to rounding, a priority out of range rejecting every request
    # (exit 1, no line named), a 400 GB prompt allocation (traceback).
    trace = _write_jsonl(tmp_path / "trace.jsonl", lines)
    error = _error(capsys, "--workload", f"{kind}:{trace}")
    assert f"{trace}:2: " in error and needle in error
    assert len(error) < 300  # a 400-digit number is not printed whole


# ---- --config files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tp: 1\nnum_requests: 4\ntp: 2\n", ":3:1: invalid YAML: key 'tp' is given twice"),
        ("request_rate: 1\nrequest-rate: 2\n", "setting 'request_rate' is given twice"),
        ("json: 5\n", ": json: expected a file path, got 5"),
        ("quiet: maybe\n", ": quiet: expected true or false"),
        ("seed: -1\n", ": seed: must be an integer >= 0"),
        ("step_overhead_ms: .inf\n", ": step_overhead_ms: must be a finite number"),
        ("policy: [fcfs, fcfs]\n", ": policy: fcfs given twice"),
        ("policy: {fcfs: 1}\n", ": policy: expected policy names"),
        ("schedule_policy: [fcfs, lpm]\n", ": schedule_policy: expected one policy name"),
    ],
)
def test_bad_config_files_name_the_file(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the last of two values silently won, a traceback (json: 5), a truthy 'maybe',
    # a traceback mid-run (seed: -1), policies run twice.
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    args = ["simulate", "--jobs", "1", "--workload", SMALL, "--config", str(cfg)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"error: {cfg}" in err and needle in err


def test_a_config_setting_only_the_run_checks_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: an unknown retraction_policy from a file (argparse never saw it) ran silently.
    cfg = tmp_path / "run.yaml"
    cfg.write_text("retraction_policy: lenght\n")
    line = _error(capsys, "--config", str(cfg))
    assert "unknown retraction_policy 'lenght' (did you mean 'length'?)" in line


def test_a_bad_flag_beside_a_config_file_is_blamed_on_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("num_requests: 4\n")
    line = _error(capsys, "--config", str(cfg), "--mfu", "1e-300")
    assert line.startswith("radixsched: error: --mfu: ") and str(cfg) not in line


# ---- --model config.json ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"head_dim": 0}, "field 'head_dim': must be >= 1"),
        ({"hidden_size": 2, "num_attention_heads": 4}, "not divisible by num_attention_heads"),
        ({"hidden_size": 66}, "hidden_size 66 is not divisible by num_attention_heads 4"),
        ({"num_key_value_heads": 0}, "field 'num_key_value_heads': must be >= 1"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 4"),
        ({"num_hidden_layers": 2.5}, "field 'num_hidden_layers': expected a count, got 2.5"),
        ({"num_hidden_layers": math.inf}, "field 'num_hidden_layers': expected a count"),
        ({"num_hidden_layers": math.nan}, "field 'num_hidden_layers': expected a count"),
        ({"intermediate_size": 0}, "field 'intermediate_size': must be >= 1"),
        ({"vocab_size": 1}, "field 'vocab_size': must be >= 2"),
        ({"max_position_embeddings": 0}, "field 'max_position_embeddings': must be >= 2"),
        ({"tie_word_embeddings": "false"}, "field 'tie_word_embeddings': expected true or false"),
        ({"torch_dtype": "int4"}, "field 'torch_dtype': unknown dtype 'int4'"),
        ({"num_local_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 9},
         "first_k_dense_replace 9 exceeds num_hidden_layers 2"),
        ({"num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 0},
         "field 'moe_intermediate_size': must be >= 1"),
    ],
)  # fmt: skip
def test_bad_model_configs_name_the_file_and_field(
    change: dict[str, Any], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: ZeroDivisionError tracebacks, a silently floored head_dim, kv heads 0 read as
    # "all", 2.5 layers read as 2, "false" read as true, int4 read as bf16, a context of 0
    # that failed every request (exit 1), errors without the file.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_MODEL, **change}))
    line = _error(capsys, "--model", str(path))
    assert f"error: {path}: " in line and needle in line


def test_a_non_utf8_model_config_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    assert f"error: {path}: not UTF-8 text" in _error(capsys, "--model", str(path))


def test_a_moe_model_whose_tokens_use_every_expert_runs(tmp_path: Path) -> None:
    # Before: ZeroDivisionError (expert parameters divided by experts - experts_per_token).
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_MODEL, "num_local_experts": 2, "num_experts_per_tok": 2}))
    assert _simulate("--model", str(path), "--gpu", "cpu") == 0
    spec = ModelSpec("m", 2, 64, 4, 4, 16, 128, 1000, 2, 1e6, 1e6, 4096, 2, 2)
    assert spec.expert_params == 0.0 and spec.shared_params == 1e6


# ---- output paths -----------------------------------------------------------------------------


def test_outputs_never_overwrite_an_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write_jsonl(tmp_path / "trace.jsonl", ['{"input_length": 4, "output_length": 1}'])
    cfg = tmp_path / "run.yaml"
    cfg.write_text("num_requests: 1\n")
    model = tmp_path / "model" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(TINY_MODEL))
    before = {p: p.read_bytes() for p in (trace, cfg, model)}
    spec = f"jsonl:{trace}"
    cases = [
        (["--workload", spec, "--json", str(trace)], "is the --workload trace"),
        (["--workload", spec, "--csv", str(tmp_path / "." / "trace.jsonl")], "--workload trace"),
        (["--config", str(cfg), "--report", str(cfg)], "is the --config file"),
        (
            ["--model", str(model.parent), "--max-total-tokens", "10000", "--json", str(model)],
            "is the --model config",
        ),
    ]
    for args, needle in cases:
        line = _error(capsys, *args)
        assert needle in line and "refusing to overwrite an input" in line
    assert {p: p.read_bytes() for p in before} == before


def test_two_outputs_may_not_share_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    line = _error(capsys, "--json", str(out), "--csv", str(out))
    assert f"--csv {out}: is also the file of --json" in line and not out.exists()


# ---- the table's formatters ---------------------------------------------------------------------


def test_formatters_keep_extreme_values_short() -> None:
    # Before: fmt_seconds(1e300) wrote 400 characters, fmt_rate(1e-300) 300 zeros, and NaN
    # raised ValueError (math.floor(nan)).
    for x in (1e300, -1e300, 1e-300, 1e-12, math.inf, math.nan):
        for fmt in (fmt_seconds, fmt_rate, fmt_int):
            assert len(fmt(x)) <= 12, (fmt, x)
    assert fmt_seconds(1e300) == "1.00e+300 s" and fmt_rate(1e-300) == "1.00e-300"
    assert fmt_rate(math.nan) == "nan" and fmt_int(math.inf) == "inf"
    # Ordinary values read as before.
    assert [fmt_seconds(x) for x in (2e-5, 0.0123, 1617.3)] == ["20.0 µs", "12.3 ms", "1,617 s"]
    assert [fmt_rate(x) for x in (0.5, 4245.3)] == ["0.500", "4,245"]
