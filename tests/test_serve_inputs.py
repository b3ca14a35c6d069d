"""Bad inputs of ``serve`` (and the model loader, and ``SamplingParams``): one error line naming
the flag or file, exit status 2, before the engine starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from radixsched.request import SamplingParams

SERVE = ["serve", "--model", "tiny-random"]


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln]


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting an engine (process or thread) or the HTTP server fails the test: every case
    must stop before."""
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from radixsched.server import app, process

    def start(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the server was started")

    monkeypatch.setattr(process, "EngineProcess", start)
    monkeypatch.setattr(process, "build_engine_loop", start)
    monkeypatch.setattr(app, "run_server", start)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--threads", "99999"], "--threads must be between 1 and the"),
        (["--threads", "0"], "--threads must be between 1 and the"),
        (["--init-new-token-ratio", "nan"], "--init-new-token-ratio: must be a number >= 0, got nan"),
        (["--min-new-token-ratio-factor", "nan"], "--min-new-token-ratio-factor: must be a num"),
        (["--schedule-conservativeness", "-1"], "--schedule-conservativeness: must be a number"),
        (["--page-size", "0"], "--page-size: page_size must be >= 1, got 0"),
        (["--max-running-requests", "0"], "--max-running-requests: must be an integer >= 1"),
        (["--seed", "-1"], "--seed: must be an integer >= 0, got -1"),
        (["--device", "bogus"], "--device bogus: expected cpu, cuda or cuda:N"),
        (["--dtype", "int3"], "--dtype: unknown dtype 'int3'"),
        (["--kv-cache-mb", "nan"], "--kv-cache-mb must be a finite number > 0, got nan"),
        (["--context-len", "0"], "--context-len must be >= 1, got 0"),
        (["--port", "99999"], "--port must be between 0 and 65535, got 99999"),
    ],
)  # fmt: skip
def test_serve_flags_fail_before_the_engine_starts(
    no_engine: None, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    from radixsched.cli.main import main

    assert main([*SERVE, *args]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert needle in line


def test_serve_reports_every_bad_flag_at_once(
    no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    assert main([*SERVE, "--threads", "99999", "--init-new-token-ratio", "nan"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 2 and all(ln.startswith("radixsched: error: --") for ln in lines)


def test_generate_and_serve_share_the_checks() -> None:
    from radixsched import cli_common, cli_generate, cli_serve

    for name in ("threads_error", "torch_device", "scheduler_config", "model_error"):
        assert getattr(cli_generate, name) is getattr(cli_common, name)
        assert getattr(cli_serve, name) is getattr(cli_common, name)


# ---- model files ----------------------------------------------------------------------------


def model_dir(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(config, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("[]", "config.json: expected a JSON object, got list"),
        ("{}", "config.json: empty JSON object"),
        ("{bad", "config.json: not valid JSON"),
        ('{"model_type": "llama"}', "config.json: missing"),
    ],
)
def test_a_bad_config_json_is_named_with_what_is_wrong(
    tmp_path: Path, config: str, needle: str
) -> None:
    pytest.importorskip("torch")
    from radixsched.engine.loader import load_model, load_tokenizer

    folder = model_dir(tmp_path, config)
    for load in (load_tokenizer, load_model):
        with pytest.raises(ValueError) as info:
            load(str(folder))
        assert str(info.value).startswith(str(folder / "config.json"))
        assert needle in str(info.value)
        assert "no config.json" not in str(info.value)


@pytest.mark.parametrize("data", [b"", b"\xff\xfe", b"GGUF\x03\x00\x00\x00garbage"])
def test_a_corrupt_gguf_is_named(tmp_path: Path, data: bytes) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from radixsched.engine.loader import load_model, load_tokenizer

    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    for load in (load_tokenizer, load_model):
        with pytest.raises(ValueError, match="not a valid GGUF model file") as info:
            load(str(path))
        assert str(info.value).startswith(f"{path}: ")


def test_serve_model_errors_name_the_file(
    no_engine: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gguf")
    from radixsched.cli.main import main

    folder = model_dir(tmp_path, "[]")
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"\xff\xfe")
    for model, file in ((folder, folder / "config.json"), (gguf, gguf)):
        assert main(["serve", "--model", str(model)]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert f"--model {file}: " in line


# ---- SamplingParams --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": -1.0},
        {"top_p": math.nan},
        {"top_p": math.inf},
    ],
)
def test_sampling_params_reject_non_finite_values(kw: dict[str, float]) -> None:
    (name,) = kw
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kw)  # type: ignore[arg-type]
