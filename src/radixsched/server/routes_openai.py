"""OpenAI's endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models`` and ``GET /v1/models/{model}``. With ``return_cached_tokens_details`` an
answer (or a stream's last chunk) carries SGLang's ``sglext`` object."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request

from radixsched.server.detok import IncrementalDetokenizer
from radixsched.server.errors import ERROR_RESPONSES
from radixsched.server.loop import FinishInfo, RequestHandle
from radixsched.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    stop_strings,
)
from radixsched.server.replies import (
    DONE,
    error_event,
    event_stream,
    is_error,
    matched_stop,
    openai_finish,
    sglext_of,
    sse_line,
    usage_of,
)
from radixsched.server.state import ServerState, sampling_params, server_state

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {"content": {"text/event-stream": {}}},
}


def _model_card(srv: ServerState) -> ModelCard:
    model = srv.model
    return ModelCard(
        id=model.name,
        created=0,
        root=model.model_path or model.name,
        max_model_len=model.context_len,
        vocab_size=model.vocab_size,
    )


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def models(srv: State) -> ModelList:
    return ModelList(data=[_model_card(srv)])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def model_by_id(model_id: str, srv: State) -> ModelCard:
    srv.check_model(model_id)
    return _model_card(srv)


class _Answer:
    """One admitted OpenAI request's identity and options: builds its chunks and answers."""

    def __init__(
        self,
        srv: ServerState,
        handle: RequestHandle,
        detok: IncrementalDetokenizer,
        obj: str,
        body: CompletionRequest | ChatCompletionRequest,
    ) -> None:
        self.srv = srv
        self.handle = handle
        self.detok = detok
        self.object = obj
        self.created = int(time.time())
        self.include_usage = body.stream_options is not None and body.stream_options.include_usage
        self.with_ext = body.return_cached_tokens_details

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.handle.rid,
            "object": self.object,
            "created": self.created,
            "model": self.srv.model.name,
            "choices": choices,
        }

    def finish_fields(self, fin: FinishInfo | None) -> dict[str, Any]:
        """A choice's ``finish_reason`` (and, once finished, ``matched_stop``)."""
        if fin is None:
            return {"finish_reason": None}
        return {
            "finish_reason": openai_finish(fin, self.detok),
            "matched_stop": matched_stop(fin, self.detok),
        }

    def with_extension(self, out: dict[str, Any], fin: FinishInfo | None) -> dict[str, Any]:
        if fin is not None and self.with_ext:
            out["sglext"] = sglext_of(fin)
        return out

    def usage_chunk(self, fin: FinishInfo) -> dict[str, Any]:
        return {**self.envelope([]), "usage": usage_of(fin)}

    def final(self, choice: dict[str, Any], fin: FinishInfo) -> dict[str, Any]:
        """The non-streaming answer."""
        out = {**self.envelope([choice]), "usage": usage_of(fin)}
        return self.with_extension(out, fin)


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    response_model_exclude_unset=True,
    responses=STREAM_RESPONSES,
)
async def completions(body: CompletionRequest, request: Request, srv: State) -> Any:
    srv.check_model(body.model)
    srv.check_priority(body.priority)
    if isinstance(body.prompt, str):
        ids = await srv.encode(body.prompt, "prompt")
    else:
        ids = np.asarray(body.prompt, dtype=np.int64)
    max_new = srv.budget(
        len(ids), body.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, "prompt", "max_tokens"
    )
    if not isinstance(body.prompt, str):
        srv.check_ids(ids, "prompt")
    rid = f"cmpl-{uuid.uuid4().hex}"
    req = srv.make_req(rid, ids, sampling_params(body, max_new), body)
    detok = IncrementalDetokenizer(srv.model.tokenizer, stop_strings(body.stop))
    handle = await srv.admit(req, "prompt", srv.arrival(request))
    answer = _Answer(srv, handle, detok, "text_completion", body)
    if body.stream:
        return event_stream(_completion_events(answer), rid)
    _, fin = await srv.collect(request, handle, detok)
    return answer.final(_completion_choice(answer, detok.text, fin), fin)


def _completion_choice(answer: _Answer, text: str, fin: FinishInfo | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, **answer.finish_fields(fin)}


async def _completion_events(answer: _Answer) -> AsyncIterator[str]:
    def chunk(text: str, fin: FinishInfo | None) -> dict[str, Any]:
        return answer.with_extension(answer.envelope([_completion_choice(answer, text, fin)]), fin)

    async for _ids, text, fin in answer.srv.stream(answer.handle, answer.detok):
        if fin is None:
            yield sse_line(chunk(text, None))
            continue
        if is_error(fin):
            yield sse_line(error_event(fin))
            break
        yield sse_line(chunk(text, fin))
        if answer.include_usage:
            yield sse_line(answer.usage_chunk(fin))
    yield DONE


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    response_model_exclude_unset=True,
    responses=STREAM_RESPONSES,
)
async def chat_completions(body: ChatCompletionRequest, request: Request, srv: State) -> Any:
    srv.check_model(body.model)
    srv.check_priority(body.priority)
    ids = await srv.render_chat(body.messages)
    max_new = srv.budget(
        len(ids),
        body.requested_max_tokens,
        srv.chat_default_budget,
        "messages",
        body.max_tokens_field,
    )
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    req = srv.make_req(rid, ids, sampling_params(body, max_new), body)
    detok = IncrementalDetokenizer(srv.model.tokenizer, stop_strings(body.stop))
    handle = await srv.admit(req, "messages", srv.arrival(request))
    answer = _Answer(srv, handle, detok, "chat.completion", body)
    if body.stream:
        answer.object = "chat.completion.chunk"
        return event_stream(_chat_events(answer), rid)
    _, fin = await srv.collect(request, handle, detok)
    message = {"role": "assistant", "content": detok.text}
    choice = {"index": 0, "message": message, "logprobs": None, **answer.finish_fields(fin)}
    return answer.final(choice, fin)


async def _chat_events(answer: _Answer) -> AsyncIterator[str]:
    def chunk(delta: dict[str, str], fin: FinishInfo | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, **answer.finish_fields(fin)}
        return answer.with_extension(answer.envelope([choice]), fin)

    yield sse_line(chunk({"role": "assistant", "content": ""}, None))
    async for _ids, text, fin in answer.srv.stream(answer.handle, answer.detok):
        if fin is None:
            if text:
                yield sse_line(chunk({"content": text}, None))
            continue
        if is_error(fin):
            yield sse_line(error_event(fin))
            break
        if text:
            yield sse_line(chunk({"content": text}, None))
        yield sse_line(chunk({}, fin))
        if answer.include_usage:
            yield sse_line(answer.usage_chunk(fin))
    yield DONE
