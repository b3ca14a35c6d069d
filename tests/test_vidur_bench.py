"""bench/vidur_bench.py's trace conversion: both simulators get the same lengths, nothing else.
No Vidur and no timing here."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def vb() -> Any:
    spec = importlib.util.spec_from_file_location("vidur_bench", ROOT / "bench" / "vidur_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


TRACE = (
    '{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [0, 1]}\n'
    "\n"
    '{"timestamp": 1500, "input_length": 7, "output_length": 1, "hash_ids": [0, 2]}\n'
    '{"timestamp": 2001, "input_length": 512, "output_length": 33, "hash_ids": [3]}\n'
)


def test_both_traces_carry_the_same_lengths_and_arrivals(vb: Any, tmp_path: Path) -> None:
    src = tmp_path / "trace.jsonl"
    src.write_text(TRACE)
    reqs = vb.read_lengths(src)
    assert reqs == [vb.Lengths(0, 40, 6), vb.Lengths(1500, 7, 1), vb.Lengths(2001, 512, 33)]

    ours = [
        json.loads(line)
        for line in vb.write_ours(reqs, tmp_path / "o.jsonl").read_text().splitlines()
    ]
    assert ours == [
        {"input_length": 40, "output_length": 6, "timestamp": 0},
        {"input_length": 7, "output_length": 1, "timestamp": 1500},
        {"input_length": 512, "output_length": 33, "timestamp": 2001},
    ]  # no hash_ids: nothing shared

    with vb.write_vidur(reqs, tmp_path / "v.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [
        (r["Date"], float(r["Time"]), int(r["PromptTokenCount"]), int(r["CompletionTokenCount"]))
        for r in rows
    ] == [
        (vb.VIDUR_DATE, 0.0, 40, 6),
        (vb.VIDUR_DATE, 1.5, 7, 1),
        (vb.VIDUR_DATE, 2.001, 512, 33),
    ]  # Vidur's trace replay reads seconds


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}', "'input_length'"),
        ('{"timestamp": -1, "input_length": 3, "output_length": 1}', "'timestamp'"),
        ('{"timestamp": 0, "input_length": 3}', "'output_length'"),
        ("[1, 2]", "'input_length'"),
        ("{oops", "not JSON"),
    ],
)
def test_a_bad_line_is_named(vb: Any, tmp_path: Path, line: str, needle: str) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1}\n' + line + "\n")
    with pytest.raises(vb.TraceError, match=f"bad.jsonl:2: .*{needle}"):
        vb.read_lengths(src)


def test_without_vidur_one_line_and_exit_2(
    vb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = ROOT / "tests" / "data" / "mooncake_sample.jsonl"
    rc = vb.main(["--vidur-python", str(tmp_path / "no-python"), "--trace", str(sample)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "pip install vidur" in err
