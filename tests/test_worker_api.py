"""The endpoints sglang-router and SGLang's clients read from a worker: ``/server_info``'s
model fields (``model_path``, ``served_model_name``), ``/v1/models`` naming the same model,
``/get_load``, and a ``/model_info`` ``tokenizer_path`` that HF ``AutoTokenizer`` loads offline
for every built-in kind of model."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from radixsched.config import SchedulerConfig
from radixsched.engine.build import tokenizer_dir, torch_runner
from radixsched.engine.loader import LoadedModel, load_model, load_tokenizer
from radixsched.server.app import ServerThread, create_app
from radixsched.server.build import engine_for_model, engine_for_runner
from radixsched.server.model import served_model

MODEL = "tiny-random"
SERVED = "my-model"
TEXTS = ["hello world", "héllo\n\t ü 日本 \x00\x7f", "a  b  ", ""]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(MODEL)


@pytest.fixture(scope="module")
def server(loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    engine, served = engine_for_model(
        loaded, SchedulerConfig(), kv_slots=2048, context_len=256, served_model_name=SERVED
    )
    with ServerThread(create_app(engine, served)) as st:
        yield st


def test_server_info_names_the_model_as_sglang_router_reads_it(server: ServerThread) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        info = c.get("/server_info").json()
        assert info["model_path"] == MODEL and info["served_model_name"] == SERVED
        assert info["model"] == SERVED
        assert info["max_total_num_tokens"] == info["kv_slots"] == 2048
        assert info["tp_size"] == 1 and info["dp_size"] == 1 and info["version"]
        models = c.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == [SERVED] and models[0]["root"] == MODEL
        assert c.get(f"/v1/models/{SERVED}").json()["root"] == MODEL
        body = {"model": SERVED, "prompt": "hi", "max_tokens": 2}
        assert c.post("/v1/completions", json=body).status_code == 200
        wrong = c.post("/v1/completions", json={**body, "model": MODEL})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"


@pytest.fixture
def slow_server(loaded: LoadedModel) -> Iterator[ServerThread]:
    """A server whose forward passes take at least 20 ms each: a request of 120 new tokens
    then runs for over two seconds, however fast or loaded the machine is."""
    runner = torch_runner(loaded, SchedulerConfig(), 2048, context_len=256, seed=0)
    forward = runner.forward

    def slow_forward(batch: object) -> object:
        time.sleep(0.02)
        return forward(batch)  # type: ignore[arg-type]

    runner.forward = slow_forward  # type: ignore[method-assign,assignment]
    engine = engine_for_runner(runner, SchedulerConfig(), kv_slots=2048, context_len=256)
    served = served_model(loaded, runner.max_context_len)
    with ServerThread(create_app(engine, served)) as st:
        yield st


def test_get_load_has_sglangs_shape_and_counts_running_requests(slow_server: ServerThread) -> None:
    with httpx.Client(base_url=slow_server.url, timeout=30) as c:
        idle = c.get("/get_load")
        assert idle.status_code == 200
        assert idle.json() == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        ]
        body: dict[str, object] = {"input_ids": list(range(1, 101))}
        body |= {"sampling_params": {"max_new_tokens": 120}}
        body |= {"stream": True}
        seen: list[dict[str, int]] = []
        with c.stream("POST", "/generate", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and not seen:
                    seen = c.get("/get_load").json()
        assert seen and seen[0]["num_reqs"] >= 1 and seen[0]["num_tokens"] >= 100


def _auto_tokenizer(path: str) -> object:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def _same_ids(path: str, model: str) -> None:
    ours = load_tokenizer(model).tokenizer
    theirs = _auto_tokenizer(path)
    for text in TEXTS:
        ids = theirs.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        assert ids == ours.encode(text, add_special_tokens=False), text


def test_random_models_publish_a_tokenizer_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path))
    path = tokenizer_dir(MODEL)
    assert path is not None and Path(path).is_relative_to(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in Path(path).iterdir()}
    _same_ids(path, MODEL)
    assert tokenizer_dir(MODEL) == path  # written once, then reused
    tok = _auto_tokenizer(path)
    assert (tok.bos_token_id, tok.eos_token_id) == (256, 257)  # type: ignore[attr-defined]


def test_a_gguf_file_publishes_its_embedded_tokenizer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, loaded: LoadedModel
) -> None:
    pytest.importorskip("gguf")
    from test_engine_model import write_toy_gguf

    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path / "cache"))
    gguf_path = tmp_path / "toy.gguf"
    write_toy_gguf(gguf_path, loaded)
    path = tokenizer_dir(str(gguf_path))
    assert path is not None and Path(path).is_relative_to(tmp_path / "cache")
    _same_ids(path, str(gguf_path))
    config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    assert config["bos_token"] and config["eos_token"]


def test_a_model_folder_with_tokenizer_json_is_its_own_tokenizer_path(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_dir(str(tmp_path), load_tokenizer(MODEL).tokenizer) == str(tmp_path.resolve())


def test_model_info_reports_the_published_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``radixsched serve --model tiny-random``: the tokenizer_path GuideLLM reads loads."""
    import subprocess
    import sys

    from served import wait_healthy

    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path))
    port = _free_port()
    cmd = [sys.executable, "-m", "radixsched", "serve", "--model", MODEL, "--port", str(port)]
    cmd += ["--single-process", "--kv-slots", "1024", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        info = httpx.get(url + "/model_info").json()
        assert info["tokenizer_path"] == httpx.get(url + "/server_info").json()["tokenizer_path"]
        _same_ids(info["tokenizer_path"], MODEL)
    finally:
        proc.terminate()
        proc.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unwritable_cache_folder_serves_without_a_tokenizer_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(blocker / "cache"))  # under a file
    assert tokenizer_dir(MODEL) is None
