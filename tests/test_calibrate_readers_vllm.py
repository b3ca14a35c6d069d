"""vLLM's bench result files, each layout named: the older ``benchmarks/benchmark_serving.py``
(tests/data/bench_tools/vllm-benchmark_serving-0118413, written by the real script against
radixsched serve), ``vllm bench serve`` (vllm-0.33.0), and damaged or aggregates-only copies."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.cli.main import main
from radixsched.sim.calibrate.measured import ResultFileError, read_result_file
from radixsched.sim.calibrate.readers.vllm_bench import LAYOUTS, layout_of

TOOLS = Path(__file__).parent / "data" / "bench_tools"
OLD = TOOLS / "vllm-benchmark_serving-0118413"
SERVE = TOOLS / "vllm-0.33.0"
SYNTHETIC = Path(__file__).parent / "data" / "calibration" / "vllm_benchmark_serving.json"
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def _doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _printed(rate: int) -> dict[str, str]:
    """The summary the script printed: its label -> its value."""
    text = (OLD / f"rate{rate}.printed.txt").read_text()
    return {m[1]: m[2] for m in re.finditer(r"^([A-Z][^:\n]*):\s+(\S+)\s*$", text, re.M)}


@pytest.mark.parametrize("rate", [4, 16])
def test_benchmark_serving_2024_results_match_what_the_script_printed(rate: int) -> None:
    path = OLD / f"rate{rate}.json"
    (run,) = read_result_file(path)
    doc, printed = _doc(path), _printed(rate)
    assert layout_of(doc) is LAYOUTS[2]
    assert (run.source, run.name, run.request_rate, run.max_concurrency) == (
        "vllm",
        f"rate {rate}.0",
        rate,
        None,
    )
    assert run.model == "tiny-random" and run.num_failed == 0
    assert len(run.requests) == doc["completed"] == int(printed["Successful requests"]) == 20
    assert sum(m.prompt_len for m in run.requests) == int(printed["Total input tokens"]) == 3840
    assert [m.output_len for m in run.requests] == doc["output_lens"]
    assert sum(doc["output_lens"]) == int(printed["Total generated tokens"])
    ttft_ms = np.mean([m.ttft_s for m in run.requests]) * 1e3
    assert ttft_ms == pytest.approx(doc["mean_ttft_ms"], rel=1e-9)
    assert f"{ttft_ms:.2f}" == printed["Mean TTFT (ms)"]
    # The end of a request: its last chunk with text (the file has no latency per request).
    for m, ttft, gaps in zip(run.requests, doc["ttfts"], doc["itls"], strict=True):
        assert m.ttft_s == ttft and m.e2e_s == pytest.approx(ttft + sum(gaps))
    # The script's TPOT ends at the stream's [DONE], a little after the last chunk with text.
    tpot = np.mean([(m.e2e_s - m.ttft_s) / (m.output_len - 1) for m in run.requests]) * 1e3
    assert 0.95 * doc["mean_tpot_ms"] <= tpot <= doc["mean_tpot_ms"]
    assert all(m.sent_at is None for m in run.requests)  # no send times in this layout
    assert run.prefixes is None
    assert "vLLM benchmark_serving.py result (2024 layout)" in (run.structure_note or "")
    assert "--random-prefix-len" in (run.structure_note or "")


def test_the_2024_output_lens_are_the_clients_retokenized_text() -> None:
    """What the README says of the fixture: the byte tokenizer counts UTF-8 bytes."""
    doc = _doc(OLD / "rate4.json")
    assert [len(t.encode()) for t in doc["generated_texts"]] == doc["output_lens"]


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (OLD / "rate4.json", "vLLM benchmark_serving.py result (2024 layout)"),
        (SYNTHETIC, "vLLM benchmark_serving.py result (2025 layout)"),
        (SERVE / "rate4.json", "vllm bench serve result"),
    ],
)
def test_each_layout_is_detected_and_named(path: Path, name: str) -> None:
    lay = layout_of(_doc(path))
    assert lay is not None and lay.name == name


def _without(*keys: str) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        for k in keys:
            doc.pop(k, None)

    return edit


def _bad_ttft(doc: dict[str, Any]) -> None:
    doc["ttfts"][3] = "x"


def _short_itls(doc: dict[str, Any]) -> None:
    doc["itls"] = doc["itls"][:5]


AGGREGATES = r"only aggregates \(completed, mean_ttft_ms, mean_itl_ms\), no per-request "
NO_LISTS = AGGREGATES + r"input_lens, output_lens, ttfts, itls: "


@pytest.mark.parametrize(
    ("src", "edit", "match"),
    [
        (
            OLD / "rate4.json",
            _bad_ttft,
            r": vLLM benchmark_serving\.py result \(2024 layout\): rate 4\.0: request 3: "
            r"field 'ttfts': expected a number, got 'x'$",
        ),
        (
            OLD / "rate4.json",
            _short_itls,
            r": vLLM benchmark_serving\.py result \(2024 layout\): rate 4\.0: per-request lists "
            r"of different lengths \(input_lens 20, output_lens 20, ttfts 20, itls 5, errors 20\)$",
        ),
        (
            OLD / "rate4.json",
            _without("best_of", "use_beam_search"),
            r": vLLM bench result of unknown layout \(fields backend, completed, date, duration, "
            r"errors, generated_texts, input_lens, itls, mean_itl_ms, mean_tpot_ms, "
            r"mean_ttft_ms, median_itl_ms, \.\.\.\); supported: benchmark_serving\.py 2024 "
            r"\(best_of\), 2025 \(burstiness\), vllm bench serve \(endpoint_type\), written with "
            r"--save-result --save-detailed$",
        ),
        (
            OLD / "rate4.json",
            _without(*LISTS),
            r": vLLM benchmark_serving\.py result \(2024 layout\): "
            + NO_LISTS
            + r"which this client always writes: the file was cut or edited$",
        ),
        (
            SERVE / "rate4.json",  # what vllm bench serve writes without --save-detailed
            _without(*LISTS, "start_times"),
            r": vllm bench serve result: "
            + NO_LISTS
            + r"rerun with --save-result --save-detailed$",
        ),
    ],
)
def test_damaged_or_aggregates_only_files_say_what_and_which_layout(
    tmp_path: Path, src: Path, edit: Any, match: str
) -> None:
    doc = _doc(src)
    edit(doc)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultFileError, match=match) as err:
        read_result_file(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_a_2025_file_without_its_lists_asks_for_save_detailed(tmp_path: Path) -> None:
    doc = _doc(SYNTHETIC)
    _without(*LISTS)(doc)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    match = r"\(2025 layout\): only aggregates \(completed\), no per-request input_lens, "
    with pytest.raises(
        ResultFileError, match=match + r".*rerun with --save-result --save-detailed$"
    ):
        read_result_file(path)


def test_calibrate_refuses_a_damaged_copy_in_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc(OLD / "rate16.json")
    _bad_ttft(doc)
    path = tmp_path / "rate16.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "cal.json"
    rc = main(["calibrate", str(OLD / "rate4.json"), str(path), "--gpu", "cpu", "-o", str(out)])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"radixsched: error: {path}: ")
    assert "(2024 layout): rate 16.0: request 3: field 'ttfts'" in err[0]


def test_calibrate_on_benchmark_serving_results_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "cal.json"
    files = [str(OLD / "rate4.json"), str(OLD / "rate16.json")]
    with caplog.at_level(logging.WARNING):
        rc = main(
            [
                *("calibrate", *files, "--gpu", "cpu", "-o", str(out), "--iterations", "1"),
                *("--no-holdout", "--max-total-tokens", "65536"),
            ]
        )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "rate 4.0" in printed and "rate 16.0" in printed
    doc = json.loads(out.read_text())
    assert doc["fitted_on"]["model"] == "tiny-random"
    assert [r["source"] for r in doc["fitted_on"]["runs"]] == ["vllm", "vllm"]
    notes = [r.getMessage() for r in caplog.records if "--random-prefix-len" in r.getMessage()]
    assert len(notes) == 2 and all("(2024 layout)" in n for n in notes)  # one per file


def test_a_single_sglang_line_under_a_json_name_is_still_sglangs(tmp_path: Path) -> None:
    line = (TOOLS / "sglang-0.5.23" / "random.jsonl").read_text().splitlines()[0]
    path = tmp_path / "sglang.json"
    path.write_text(line)
    (run,) = read_result_file(path)
    assert run.source == "sglang" and run.path == f"{path}:1"
