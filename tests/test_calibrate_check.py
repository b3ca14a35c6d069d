"""``radixsched calibrate --check FILE|default``: measured runs predicted with constants fixed
beforehand, nothing fitted. A file's constants predict the runs it was fitted on exactly as
the fit reported them; a file that cannot be used is one error line, exit 2, before any run
is read."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import pytest

from radixsched.cli.main import main

RECORDED = Path(__file__).parent / "data" / "calibration" / "live_tiny_random"
SWEEP = RECORDED / "sweep0.json.gz"


def _rows(out: str) -> dict[str, str]:
    """The per-run lines of the error table, by run name."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("("):
            break
        rows[line[:16].strip()] = line[16:]
    return rows


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A calibration fitted on one recorded sweep, and the table the fit printed."""
    cal = tmp_path_factory.mktemp("check") / "cal.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["calibrate", str(SWEEP), "--gpu", "cpu", "-o", str(cal), "--no-holdout"])
    assert rc == 0
    return cal, buf.getvalue()


def test_a_file_predicts_its_own_runs_as_the_fit_reported(
    fitted: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cal, fit_out = fitted
    assert main(["calibrate", str(SWEEP), "--gpu", "cpu", "--check", str(cal)]) == 0
    out = capsys.readouterr().out
    assert _rows(out) == _rows(fit_out) and len(_rows(out)) == 5
    assert f"constants of {cal}, not fitted to these runs" in out
    assert "mean absolute error over 5 runs: TTFT" in out
    assert not cal.with_name("calibration.json").exists()  # --check writes nothing


def test_the_defaults_predict_worse_than_the_fit(
    fitted: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cal, _ = fitted

    def e2e(check: str) -> float:
        assert main(["calibrate", str(SWEEP), "--gpu", "cpu", "--check", check]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        return float(last.split("E2E ")[1].rstrip("%"))

    assert e2e("default") > 2 * e2e(str(cal))


def test_a_file_fitted_on_another_model_is_warned_about(
    fitted: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = json.loads(fitted[0].read_text())
    doc["fitted_on"]["model"] = "llama-3.1-8b"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        assert (
            main(["calibrate", str(SWEEP), "--gpu", "cpu", "--check", str(other), "--quiet"]) == 0
        )
    assert "was fitted on model 'llama-3.1-8b'" in caplog.text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--check {path}: cannot read calibration file"),
        ("kind,batch_size,num_tokens,ms\nprefill,1,16,2.0\n", "a step-time table, not fitted"),
    ],
)
def test_an_unusable_file_is_one_line_before_any_run_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "table.csv"
    if content is not None:
        path.write_text(content)
    missing_results = tmp_path / "no-such-results.json"  # never read: the flag fails first
    assert main(["calibrate", str(missing_results), "--gpu", "cpu", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(path=path) in err
