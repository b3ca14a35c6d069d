"""``radixsched simulate`` run in-process through ``radixsched.cli.main``: outputs (--json with
the issue's keys, --csv, a self-contained --report) and user errors (one line on stderr, exit
status 2, no traceback, nothing simulated)."""

from __future__ import annotations

import csv
import io
import json
import math
import platform
import re
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.main import main
from radixsched.policies import POLICIES

SMALL = "shared-prefix:groups=4,prompts=4,system_len=256,question_len=32,output_len=16"

STATS_KEYS = {"mean", "std", "p50", "p90", "p95", "p99", "max"}
THROUGHPUT_KEYS = {"requests_per_s", "input_tokens_per_s", "output_tokens_per_s"}
# The issue's result schema: key -> type (dict values are checked separately).
RESULT_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "policy": str,
    "hit_rate": float,
    "optimal_hit_rate": float,
    "prefill_tokens_computed": int,
    "num_requests": int,
    "ttft_s": dict,
    "tpot_s": dict,
    "itl_s": dict,
    "e2e_s": dict,
    "queue_wait_s": dict,
    "throughput": dict,
    "makespan_s": float,
    "retractions": int,
    "preemptions": int,
    "wall_s": float,
}


def _strict_json(text: str) -> Any:
    def reject(name: str) -> Any:
        raise AssertionError(f"non-finite number {name} in JSON output")

    return json.loads(text, parse_constant=reject)


def _simulate(*args: str) -> int:
    return main(["simulate", "--quiet", *args])


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single stderr line of a failed run; nothing on stdout (nothing simulated)."""
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert out == "", out
    return lines[0]


# ---- outputs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    paths = {"json": d / "out.json", "csv": d / "out.csv", "report": d / "report.html"}
    rc = _simulate(
        "--workload",
        SMALL,
        "--policy",
        "fcfs,lpm",
        "--request-rate",
        "20",
        "--json",
        str(paths["json"]),
        "--csv",
        str(paths["csv"]),
        "--report",
        str(paths["report"]),
    )
    assert rc == 0
    return paths


def test_json_has_the_issue_keys(outputs: dict[str, Path]) -> None:
    doc = _strict_json(outputs["json"].read_text(encoding="utf-8"))
    assert {"workload", "config", "results"} <= doc.keys()
    assert isinstance(doc["workload"], dict) and isinstance(doc["config"], dict)
    results = doc["results"]
    assert [r["policy"] for r in results] == ["fcfs", "lpm"]
    for r in results:
        missing = RESULT_SCHEMA.keys() - r.keys()
        assert not missing, missing
        for key, typ in RESULT_SCHEMA.items():
            # JSON has one number type: an integral float may come back as an int.
            ok = isinstance(r[key], typ) or (typ is float and isinstance(r[key], int))
            assert ok and not isinstance(r[key], bool), (key, r[key])
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s"):
            stats = r[key]
            assert stats.keys() >= STATS_KEYS, key
            assert all(isinstance(stats[k], int | float) for k in STATS_KEYS)
            assert 0 <= stats["p50"] <= stats["p90"] <= stats["p95"] <= stats["p99"], key
            assert stats["p99"] <= stats["max"] and stats["mean"] <= stats["max"]
            assert 0 <= stats["std"] <= stats["max"]
        assert r["throughput"].keys() >= THROUGHPUT_KEYS
        assert all(r["throughput"][k] > 0 for k in THROUGHPUT_KEYS)
        assert r["num_requests"] == 16
        assert 0 <= r["hit_rate"] <= r["optimal_hit_rate"] + 1e-12 <= 1 + 1e-12
        assert r["optimal_hit_rate"] == pytest.approx(doc["workload"]["optimal_hit_rate"])
        assert r["makespan_s"] > 0 and r["wall_s"] > 0
        assert r["retractions"] >= 0 and r["preemptions"] >= 0
        assert r["prefill_tokens_computed"] > 0
        assert r["ttft_s"]["p50"] > 0 and r["e2e_s"]["max"] <= r["makespan_s"] + 1e-9


def test_csv_has_one_row_per_policy(outputs: dict[str, Path]) -> None:
    with outputs["csv"].open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["policy"] for row in rows] == ["fcfs", "lpm"]
    doc = _strict_json(outputs["json"].read_text(encoding="utf-8"))
    for row, res in zip(rows, doc["results"], strict=True):
        assert float(row["hit_rate"]) == pytest.approx(res["hit_rate"])
        assert int(row["num_requests"]) == res["num_requests"]


def test_report_is_a_self_contained_html_file(outputs: dict[str, Path]) -> None:
    from radixsched.results.charts import plotly_js

    html = outputs["report"].read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "fcfs" in html and "lpm" in html
    # plotly.js is inlined whole (its source names URLs it never fetches for these charts);
    # the page around it names none.
    lib = f'<script type="text/javascript">{plotly_js()}</script>'
    assert html.count(lib) == 1
    html = html.replace(lib, "")
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    # No external assets of any kind: every src/href is inline or a fragment.
    for attr in re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", html, re.IGNORECASE):
        assert attr.startswith(("#", "data:")), attr
    assert not re.search(r"@import|url\(\s*['\"]?(?!data:|#)", html), "external CSS reference"


def test_policy_all_runs_every_registered_policy(tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    assert _simulate("--workload", SMALL, "--policy", "all", "--json", str(out)) == 0
    doc = _strict_json(out.read_text(encoding="utf-8"))
    assert [r["policy"] for r in doc["results"]] == list(POLICIES)
    for r in doc["results"]:
        assert r["num_requests"] == 16 and math.isfinite(r["hit_rate"])


def test_the_json_records_the_platform_last_in_its_metadata(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert _simulate("--workload", SMALL, "--policy", "lpm", "--json", str(out)) == 0
    meta = _strict_json(out.read_text(encoding="utf-8"))["meta"]
    assert list(meta) == ["version", "created", "command", "python", "platform"]
    assert meta["platform"] == platform.platform(terse=True)


def test_table_and_recommendation_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert _simulate("--workload", SMALL, "--policy", "fcfs,lpm") == 0
    out = capsys.readouterr().out
    assert "fcfs" in out and "lpm" in out
    assert "optimal hit rate" in out
    assert "Recommended: " in out or "perform alike" in out


def _count_refresh_threads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The progress display's redraw timers started from now on (recorded, never run)."""
    started: list[object] = []
    monkeypatch.setattr("rich.live._RefreshThread.start", lambda self: started.append(self))
    return started


def test_progress_into_a_file_is_written_once_without_a_timer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _count_refresh_threads(monkeypatch)
    assert main(["simulate", "--workload", SMALL, "--policy", "fcfs,lpm", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("fcfs", "lpm"):  # the display's final state, once
        assert len(re.findall(rf"^{name} .* 16/16 requests", out, flags=re.M)) == 1
    assert started == []  # a redraw timer would only take the GIL from the run


def test_progress_on_a_terminal_redraws_on_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(
        "radixsched.cli.simulate.rich_console",
        lambda width: Console(file=screen, force_terminal=True, width=width),
    )
    started = _count_refresh_threads(monkeypatch)
    assert main(["simulate", "--workload", SMALL, "--policy", "fcfs", "--jobs", "1"]) == 0
    assert len(started) == 1 and "16/16 requests" in screen.getvalue()


def test_scheduler_flags_reach_the_scheduler(tmp_path: Path) -> None:
    out = tmp_path / "flags.json"
    rc = _simulate(
        "--workload",
        SMALL,
        "--policy",
        "lpm",
        "--page-size",
        "16",
        "--chunked-prefill-size",
        "128",
        "--max-total-tokens",
        "4000",
        "--seed",
        "3",
        "--json",
        str(out),
    )
    assert rc == 0
    doc = _strict_json(out.read_text(encoding="utf-8"))
    assert doc["config"]["scheduler"]["page_size"] == 16
    assert doc["config"]["scheduler"]["chunked_prefill_size"] == 128
    assert doc["config"]["scheduler"]["seed"] == 3
    assert doc["config"]["kv_capacity_tokens"] == 4000


def test_same_command_same_json_but_wall_time(tmp_path: Path) -> None:
    docs = []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        assert _simulate("--workload", SMALL, "--policy", "random,lpm", "--json", str(out)) == 0
        doc = _strict_json(out.read_text(encoding="utf-8"))
        assert doc["meta"]["version"] and doc["meta"]["created"]
        doc.pop("meta")  # says when it ran
        for r in doc["results"]:
            r.pop("wall_s")
            r.pop("requests_per_wall_s", None)
        docs.append(doc)
    assert docs[0] == docs[1]


# ---- user errors ----------------------------------------------------------------------------------


def test_malformed_jsonl_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"input_length": 10, "output_length": 2}\n'
        '{"input_length": 12, "output_length": 2}\n'
        '{"input_length": "ten", "output_length": 2}\n',
        encoding="utf-8",
    )
    out = tmp_path / "never.json"
    assert _simulate("--workload", f"jsonl:{trace}", "--json", str(out)) == 2
    line = _error_line(capsys)
    assert str(trace) in line and ":3" in line and "input_length" in line
    assert not out.exists()


def test_malformed_mooncake_line_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "moon.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": 600, "output_length": 2}\n',
        encoding="utf-8",
    )
    assert _simulate("--workload", f"mooncake:{trace}") == 2
    line = _error_line(capsys)
    assert str(trace) in line and ":2" in line and "hash_ids" in line


def test_invalid_json_line_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "broken.jsonl"
    trace.write_text('{"input_length": 10, "output_length": 2}\n{"input_length": 1\n')
    assert _simulate("--workload", f"jsonl:{trace}") == 2
    line = _error_line(capsys)
    assert str(trace) in line and ":2" in line


@pytest.mark.parametrize("kind", ["jsonl", "mooncake"])
def test_missing_file_is_one_line(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "trace.jsonl"
    assert _simulate("--workload", f"{kind}:{missing}") == 2
    assert str(missing) in _error_line(capsys)


def test_unknown_policy_lists_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert _simulate("--workload", SMALL, "--policy", "fcfs,fastest") == 2
    line = _error_line(capsys)
    assert "fastest" in line
    for name in POLICIES:
        assert name in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--request-rate", "fast"], "--request-rate"),
        (["--request-rate", "0"], "--request-rate"),
        (["--workload", "sharegpt:x.json"], "sharegpt"),
        (["--workload", "shared-prefix:groups=0"], "groups"),
        (["--workload", "shared-prefix:flavour=1"], "flavour"),
        (["--num-requests", "0"], "--num-requests"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _simulate(*(["--workload", SMALL] if "--workload" not in args else []), *args) == 2
    assert needle in _error_line(capsys)


def test_an_emoji_code_in_a_path_is_printed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rich would print ":fire:" as an emoji; the header names the trace as its path reads.
    folder = tmp_path / "a:fire:b"
    folder.mkdir()
    trace = folder / "t.jsonl"
    trace.write_text('{"input_length": 8, "output_length": 2}\n' * 2)
    assert _simulate("--workload", f"jsonl:{trace}", "--policy", "fcfs") == 0
    out = capsys.readouterr().out
    assert "a:fire:b" in out and "\N{FIRE}" not in out
