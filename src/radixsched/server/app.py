"""The FastAPI app: OpenAI-compatible completions and chat, SGLang's ``/generate``, metrics.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /generate``,
``GET /v1/models`` (and ``/v1/models/{model}``), ``GET /server_info`` (vocab size, context
length, limits, scheduler config), ``GET /health``, ``GET /metrics`` (Prometheus),
``POST /flush_cache``; for SGLang's and vLLM's clients also ``GET /model_info``,
``GET /get_model_info``, ``GET /get_server_info``, ``GET /health_generate`` and
``POST /reset_prefix_cache``. Every GET also answers HEAD; a 405 carries ``Allow``.

Errors always use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` and name
the offending field in ``param``. Validation failures (FastAPI's 422) become 400. A full queue
is 503 with ``Retry-After``. A priority sent to a server started with
``--abort-on-priority-when-disabled`` (and priority scheduling off) is 400 on ``priority``:
SGLang answers 503, but resending cannot succeed, so it is a client error, not overload. An
exception nothing expected is a JSON 500 (``guard.CatchAllMiddleware``); one in the middle of
a stream ends it with an error event and ``[DONE]``.

Before a request reaches a handler (``guard``): its arrival is stamped, its Host and Origin are
checked, its API key, and its body is read within the limit (413). A text prompt longer than the
context could hold (context length x the longest token's characters) is rejected before it is
tokenized; tokenization of long texts runs in a worker thread (the tokenizer releases the GIL);
token-id prompts are checked against the context length, then against the vocabulary with one
vectorised comparison. Nothing a client sends holds the event loop for long.

With ``api_key`` set, every endpoint except ``/health`` requires ``Authorization: Bearer KEY``
(``/metrics`` included: it exposes load and cache statistics; point the scraper's bearer token
at it).

A client that disconnects, streaming or not, aborts its request: its KV slots and cache lock
are released by the scheduler thread at the next step boundary.

This module imports FastAPI: import it only to serve (the CLI does so lazily).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixsched.engine.tokenizer import TextEncodingError
from radixsched.request import FinishReason, Req, SamplingParams
from radixsched.server.detok import IncrementalDetokenizer
from radixsched.server.guard import (
    ARRIVAL_SCOPE_KEY,
    RETRY_AFTER_S,
    AccessPolicy,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    CatchAllMiddleware,
    GuardMiddleware,
    HeadMiddleware,
    RequestLimits,
    error_body,
)
from radixsched.server.loop import (
    STOP_STRING_STATUS,
    BatchRecorder,
    Engine,
    EngineLoop,
    FinishInfo,
    RequestHandle,
    Sink,
    post_to_event_loops,
)
from radixsched.server.metrics import ServerMetrics
from radixsched.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    FlushCacheResponse,
    GenerateRequest,
    GenerateResponse,
    HealthResponse,
    ModelCard,
    ModelInfo,
    ModelList,
    SchedulingFields,
    ServerInfo,
    stop_strings,
)

if TYPE_CHECKING:
    from radixsched.clock import WallClock
    from radixsched.config import SchedulerConfig
    from radixsched.engine.loader import LoadedModel, LoadedTokenizer
    from radixsched.engine.runner import TorchRunner
    from radixsched.engine.tokenizer import ChatTemplate, Tokenizer
    from radixsched.runner import ModelRunner

logger = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
MIN_TEMPERATURE = 1e-5
MIN_TOP_P = 1e-6
# Texts longer than this are tokenized in a worker thread (shorter ones cost less than the hop).
INLINE_TOKENIZE_CHARS = 4096
HEALTH_GENERATE_TIMEOUT_S = 20.0
FLUSH_POLL_S = 0.02

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 503)
}


@dataclass(frozen=True)
class ServedModel:
    """What the HTTP layer needs to know about the model behind the scheduler.

    ``model_path`` / ``tokenizer_path``: what ``/model_info`` reports (SGLang's bench loads a
    tokenizer from ``tokenizer_path``; None where there is no tokenizer directory)."""

    name: str
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    vocab_size: int
    context_len: int
    model_path: str | None = None
    tokenizer_path: str | None = None
    model_type: str | None = None
    architectures: tuple[str, ...] | None = None


def served_model(
    source: LoadedModel | LoadedTokenizer,
    context_len: int,
    *,
    served_model_name: str | None = None,
    tokenizer_path: str | None = None,
) -> ServedModel:
    """The ``ServedModel`` of a loaded model or of its tokenizer alone."""
    return ServedModel(
        name=served_model_name or source.name,
        tokenizer=source.tokenizer,
        chat_template=source.chat_template,
        vocab_size=source.config.vocab_size,
        context_len=context_len,
        model_path=source.name,
        tokenizer_path=tokenizer_path,
        model_type=source.config.architecture.value,
        architectures=(source.config.architecture.hf_class,),
    )


def max_prompt_chars(tokenizer: Tokenizer, vocab_size: int, context_len: int) -> int:
    """Characters a prompt of ``context_len`` tokens can have at most: no token's text is longer
    than the longest vocabulary entry (a byte-level entry has one character per byte, and a
    character is at least a byte)."""
    longest = max((len(t) for i in range(vocab_size) if (t := tokenizer.token_text(i))), default=1)
    return context_len * max(longest, 1)


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    extra = dict(headers or {})
    if status == 503:
        extra.setdefault("Retry-After", str(RETRY_AFTER_S))
    return Response(
        error_body(status, message, param=param, code=code),
        status_code=status,
        media_type="application/json",
        headers=extra,
    )


# ---- validation errors -> 400 -------------------------------------------------------------

_TYPE_LOC_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


def _param_of(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "content", "list[TextPart]", 0, "text")`` ->
    ``"messages[0].content[0].text"``; pydantic's union-member and validator tags are
    dropped."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
            continue
        text = str(p)
        if text in _TYPE_LOC_PARTS or "[" in text or "-" in text:
            continue
        out += ("." if out else "") + text
    return out or None


def _most_specific(errors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of a union's failed members, the one that got furthest into the value (and a real
    constraint over a plain type mismatch): ``"content": [{"text": 5}]`` is about the list
    member's ``text``, not about content not being a string."""

    def key(e: dict[str, Any]) -> tuple[int, bool]:
        return len(e.get("loc", ())), not str(e.get("type", "")).endswith("_type")

    best = errors[0]
    for e in errors[1:]:
        if key(e) > key(best):
            best = e
    return best


def _validation_message(err: dict[str, Any]) -> tuple[str, str | None]:
    kind = err.get("type", "")
    param = _param_of(err.get("loc", ()))
    if kind == "json_invalid":
        ctx = err.get("ctx") or {}
        return f"malformed JSON body: {ctx.get('error', err.get('msg', ''))}", None
    if kind == "missing" and param is None:
        return "a JSON request body is required", None
    if kind == "string_unicode":
        msg = "contains a lone surrogate, which is not valid Unicode"
    else:
        msg = str(err.get("msg", "invalid value"))
    return (f"{param}: {msg}" if param else msg), param


# ---- request preparation -----------------------------------------------------------------------


class _SamplingSource(Protocol):
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop_token_ids: list[int] | None
    ignore_eos: bool


def _sampling(src: _SamplingSource, max_new_tokens: int) -> SamplingParams:
    # Like SGLang: a temperature below 1e-5 means greedy (dividing logits by it overflows), and
    # top_p is floored where float32 still represents it (a denormal top_p rounds to 0 there,
    # which would drop every token).
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        stop_token_ids=tuple(src.stop_token_ids or ()),
        ignore_eos=src.ignore_eos,
        temperature=src.temperature if src.temperature >= MIN_TEMPERATURE else 0.0,
        top_k=max(src.top_k, 0),
        top_p=max(src.top_p, MIN_TOP_P),
        seed=src.seed,
    )


TokenIds = npt.NDArray[np.int64]


class _Server:
    """The handlers' shared state (one per app)."""

    def __init__(
        self, engine: Engine, model: ServedModel, limits: RequestLimits, access: AccessPolicy
    ) -> None:
        self.engine = engine
        self.model = model
        self.limits = limits
        self.access = access
        self.config: SchedulerConfig = engine.info.config
        self.body_limit = limits.body_limit(model.context_len)
        self.max_prompt_chars = max_prompt_chars(
            model.tokenizer, model.vocab_size, model.context_len
        )

    # ---- validation against the model ------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.model.name:
            raise ApiError(
                404,
                f"model {name!r} does not exist; this server serves {self.model.name!r}",
                param="model",
                code="model_not_found",
            )

    def check_priority(self, priority: int | None) -> None:
        cfg = self.config
        if (
            priority is not None
            and not cfg.enable_priority_scheduling
            and cfg.abort_on_priority_when_disabled
        ):
            raise ApiError(
                400,
                "this server does not schedule by priority; send the request without 'priority'",
                param="priority",
            )

    def check_ids(self, ids: TokenIds, field: str) -> None:
        """Every id inside the vocabulary (one vectorised pass; call after the length check)."""
        vocab = self.model.vocab_size
        bad = np.flatnonzero((ids < 0) | (ids >= vocab))
        if bad.size:
            raise ApiError(
                400,
                f"{field}: token id {int(ids[bad[0]])} is outside the vocabulary [0, {vocab})",
                param=field,
            )

    def check_chars(self, n_chars: int, field: str) -> None:
        limit = self.max_prompt_chars
        if n_chars > limit:
            raise ApiError(
                400,
                f"{field}: the prompt has {n_chars} characters; a prompt that fits the context "
                f"of {self.model.context_len} tokens has at most {limit}",
                param=field,
            )

    async def encode(self, text: str, field: str, *, add_special_tokens: bool = True) -> TokenIds:
        """Token ids of a text prompt: the character bound first, then the tokenizer (in a
        worker thread for long texts)."""
        self.check_chars(len(text), field)
        tok = self.model.tokenizer
        try:
            if len(text) <= INLINE_TOKENIZE_CHARS:
                ids = tok.encode(text, add_special_tokens=add_special_tokens)
            else:
                ids = await asyncio.to_thread(
                    tok.encode, text, add_special_tokens=add_special_tokens
                )
        except TextEncodingError as e:
            raise ApiError(400, f"{field}: {e}", param=field) from e
        return np.asarray(ids, dtype=np.int64)

    async def render_chat(self, messages: Sequence[ChatMessage]) -> TokenIds:
        texts = [m.text() for m in messages]
        self.check_chars(sum(len(t) for t in texts), "messages")
        rows = [{"role": m.role, "content": t} for m, t in zip(messages, texts, strict=True)]
        try:
            rendered = self.model.chat_template.render(rows, add_generation_prompt=True)
        except Exception as e:  # a template may reject a conversation (e.g. role order)
            raise ApiError(
                400, f"messages: cannot apply the chat template: {e}", param="messages"
            ) from e
        return await self.encode(rendered, "messages", add_special_tokens=False)

    def budget(
        self, n_prompt: int, requested: int | None, default: int, prompt_field: str, max_field: str
    ) -> int:
        """max_new_tokens for a prompt of ``n_prompt`` tokens, or 400 naming the field."""
        ctx = self.model.context_len
        if n_prompt == 0:
            raise ApiError(400, f"{prompt_field}: the prompt is empty", param=prompt_field)
        if n_prompt >= ctx:
            raise ApiError(
                400,
                f"{prompt_field}: the prompt has {n_prompt} tokens; the context length is {ctx}",
                param=prompt_field,
            )
        if requested is None:
            return max(1, min(default, ctx - n_prompt))
        if n_prompt + requested > ctx:
            raise ApiError(
                400,
                f"{max_field}: {n_prompt} prompt tokens + {requested} new tokens exceed the "
                f"context length {ctx}",
                param=max_field,
            )
        return requested

    @property
    def chat_default_budget(self) -> int:
        cap = self.limits.max_completion_tokens
        return self.model.context_len if cap is None else cap

    def make_req(
        self, rid: str, ids: TokenIds, sampling: SamplingParams, fields: SchedulingFields
    ) -> Req:
        return Req(
            rid=rid,
            prompt_ids=ids.astype(np.int32),
            sampling=sampling,
            priority=fields.priority,
            routing_key=fields.routing_key,
            extra_key=fields.extra_key,
            cache_salt=fields.cache_salt,
        )

    # ---- running one request -------------------------------------------------------------------
    @staticmethod
    def arrival(request: Request) -> float | None:
        value = request.scope.get(ARRIVAL_SCOPE_KEY)
        return float(value) if value is not None else None

    async def admit(self, req: Req, prompt_field: str, arrival: float | None) -> RequestHandle:
        handle = self.engine.submit(req, arrival)
        res = await handle.admission()
        if not res.accepted:
            status = res.status_code or 500
            param = prompt_field if status == 400 else None
            if res.message.startswith("duplicate request id"):
                param = "rid"
            raise ApiError(status, res.message, param=param)
        return handle

    async def collect(
        self, request: Request, handle: RequestHandle, detok: IncrementalDetokenizer
    ) -> tuple[list[int], FinishInfo]:
        """Run a non-streaming request to the end: its output ids and how it finished. Raises
        ``ApiError`` 499 when the client went away first (the request is aborted) and the
        request's own error when it was aborted."""
        result = await self._collect(request, handle, detok)
        if result is None:
            raise ApiError(499, "client disconnected")
        if _is_error(result[1]):
            raise _abort_error(result[1])
        return result

    async def _collect(
        self, request: Request, handle: RequestHandle, detok: IncrementalDetokenizer
    ) -> tuple[list[int], FinishInfo] | None:
        """``collect`` without the error mapping; None when the client went away first."""

        async def consume() -> tuple[list[int], FinishInfo]:
            ids: list[int] = []
            while True:
                delta = await handle.next_delta()
                ids.extend(delta.token_ids)
                detok.push(delta.token_ids)
                if detok.stopped and delta.finish is None:
                    self.engine.stop_request(handle.rid)
                if delta.finish is not None:
                    detok.finish()
                    return ids, delta.finish

        work = asyncio.ensure_future(consume())
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            return None
        finally:
            for task in (work, gone):
                if not task.done():
                    task.cancel()
            # Gone, or failed (the detokenizer raised): the request must not run on.
            if not handle.finished:
                self.engine.abort(handle.rid)

    async def stream(
        self, handle: RequestHandle, detok: IncrementalDetokenizer
    ) -> AsyncIterator[tuple[list[int], str, FinishInfo | None]]:
        """(new ids, new text, finish) per delta. Closing the generator early (the client
        disconnected and Starlette cancelled the response) aborts the request."""
        try:
            while True:
                delta = await handle.next_delta()
                text = detok.push(delta.token_ids)
                if detok.stopped and delta.finish is None:
                    self.engine.stop_request(handle.rid)
                if delta.finish is not None:
                    text += detok.finish()
                    yield delta.token_ids, text, delta.finish
                    return
                if text or delta.token_ids:
                    yield delta.token_ids, text, None
        finally:
            if not handle.finished:
                self.engine.abort(handle.rid)

    async def flush(self, timeout: float | None) -> int:
        """Empty the prefix cache once nothing runs or waits (within ``timeout`` seconds; None:
        now or never): the tokens freed, or 400."""

        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            try:
                freed = await self.engine.flush_cache()
            except RuntimeError as e:
                raise ApiError(503, str(e)) from e
            if freed is not None:
                return freed
            if time.monotonic() >= deadline:
                raise ApiError(
                    400, "cache not flushed: requests are running or waiting; retry when idle"
                )
            await asyncio.sleep(FLUSH_POLL_S)


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def _openai_finish(fin: FinishInfo, detok: IncrementalDetokenizer) -> str:
    if detok.stopped or fin.reason is FinishReason.STOP:
        return "stop"
    if fin.reason is FinishReason.LENGTH:
        return "length"
    return "stop"  # only a stop-string abort gets here (others are errors)


def _matched_stop(fin: FinishInfo, detok: IncrementalDetokenizer) -> int | str | None:
    """SGLang's ``matched_stop``: the stop string or stop token id that ended the request."""
    if detok.stopped:
        return detok.matched_stop
    if fin.reason is FinishReason.STOP:
        return fin.matched_token
    return None


def _is_error(fin: FinishInfo) -> bool:
    return fin.reason is FinishReason.ABORT and fin.status_code != STOP_STRING_STATUS


def _usage(fin: FinishInfo) -> dict[str, Any]:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def _cached_details(cached: int, host: int) -> dict[str, int]:
    return {"device": cached - host, "host": host}


def _sglext(fin: FinishInfo) -> dict[str, Any]:
    """SGLang's extension object, as ``sglang.bench_serving --cache-report`` reads it."""
    return {"cached_tokens_details": _cached_details(fin.cached_tokens, fin.host_cached_tokens)}


def _sglang_finish(fin: FinishInfo, detok: IncrementalDetokenizer) -> dict[str, Any]:
    if detok.stopped:
        return {"type": "stop", "matched": detok.matched_stop}
    if fin.reason is FinishReason.STOP:
        return {"type": "stop", "matched": fin.matched_token}
    if fin.reason is FinishReason.LENGTH:
        return {"type": "length", "length": fin.completion_tokens}
    return {"type": "abort", "message": fin.message, "status_code": fin.status_code}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


def _error_payload(fin: FinishInfo) -> dict[str, Any]:
    return {
        "error": {
            "message": fin.message or "request aborted",
            "type": "server_error" if (fin.status_code or 500) >= 500 else "invalid_request_error",
            "param": None,
            "code": fin.status_code,
        }
    }


def _abort_error(fin: FinishInfo) -> ApiError:
    return ApiError(fin.status_code or 500, fin.message or "request aborted")


async def _guarded(events: AsyncIterator[str], rid: str) -> AsyncIterator[str]:
    """A stream whose producer failed ends with an error event and ``[DONE]`` (the status line
    went out already); the producer's own cleanup has aborted the request."""
    try:
        async for chunk in events:
            yield chunk
    except Exception as e:
        logger.exception("stream of %s failed", rid)
        payload = json.loads(error_body(500, f"internal server error: {type(e).__name__}: {e}"))
        yield _sse(payload)
        yield DONE


def _event_stream(events: AsyncIterator[str], rid: str) -> StreamingResponse:
    return StreamingResponse(_guarded(events, rid), media_type="text/event-stream")


# ---- the app ---------------------------------------------------------------------------------


def create_app(
    engine: Engine,
    model: ServedModel,
    *,
    api_key: str | None = None,
    limits: RequestLimits | None = None,
    access: AccessPolicy | None = None,
    manage_engine: bool = True,
) -> FastAPI:
    """The app over a (not yet started) ``EngineLoop``. With ``manage_engine`` the app's
    lifespan starts the loop and stops it on shutdown. ``api_key=""`` is refused (it would
    silently turn authentication off); ``access`` says which Host headers and Origins are
    accepted (default: a server bound to 127.0.0.1)."""
    if api_key is not None and not api_key:
        raise ValueError("the API key is empty: an empty key would disable authentication")
    limits = limits if limits is not None else RequestLimits()
    access = access if access is not None else AccessPolicy()
    srv = _Server(engine, model, limits, access)
    if isinstance(engine, EngineLoop) and engine.metrics is None:
        engine.metrics = ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await asyncio.to_thread(engine.stop)

    app = FastAPI(
        title="radixsched",
        version="0.1.0",
        description="OpenAI-compatible and SGLang-native generation over the radixsched scheduler",
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.served_model = model

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> Response:
        errors = list(exc.errors())
        if not errors:
            return error_response(400, "invalid request")
        message, param = _validation_message(_most_specific(errors))
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        allow = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        if "GET" in allow and "HEAD" not in allow:  # HeadMiddleware serves HEAD for every GET
            headers["Allow"] = ", ".join([*allow, "HEAD"])
        return error_response(exc.status_code, str(exc.detail), headers=headers)

    @app.exception_handler(ApiError)
    async def _on_api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code)

    # ---- plain endpoints --------------------------------------------------------------------
    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        ok = engine.alive and engine.healthy
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    @app.get(
        "/health_generate",
        response_model=HealthResponse,
        responses={503: {"model": HealthResponse}},
    )
    async def health_generate(request: Request) -> JSONResponse:
        """SGLang's deep health check: one token through the whole engine."""
        req = Req(
            rid=f"health-{uuid.uuid4().hex}",
            prompt_ids=np.zeros(1, dtype=np.int32),
            sampling=SamplingParams(max_new_tokens=1),
        )
        handle = engine.submit(req, srv.arrival(request))

        async def one_token() -> bool:
            if not (await handle.admission()).accepted:
                return False
            while (delta := await handle.next_delta()).finish is None:
                pass
            return not _is_error(delta.finish)

        try:
            ok = await asyncio.wait_for(one_token(), HEALTH_GENERATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            ok = False
        finally:
            if not handle.finished:
                engine.abort(handle.rid)
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    def model_card() -> ModelCard:
        return ModelCard(
            id=model.name,
            created=0,
            max_model_len=model.context_len,
            vocab_size=model.vocab_size,
        )

    @app.get("/v1/models", response_model=ModelList, responses=_ERROR_RESPONSES)
    async def models() -> ModelList:
        return ModelList(data=[model_card()])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERROR_RESPONSES)
    async def model_by_id(model_id: str) -> ModelCard:
        srv.check_model(model_id)
        return model_card()

    def server_info_body() -> ServerInfo:
        info = engine.info
        return ServerInfo(
            model=model.name,
            vocab_size=model.vocab_size,
            context_len=model.context_len,
            kv_slots=info.kv_slots,
            max_running_requests=info.max_running_requests,
            max_request_bytes=srv.body_limit,
            max_prompt_chars=srv.max_prompt_chars,
            max_completion_tokens=limits.max_completion_tokens,
            allowed_hosts=list(access.allowed_hosts),
            allowed_origins=list(access.allowed_origins),
            scheduler=dataclasses.asdict(srv.config),
        )

    for path in ("/server_info", "/get_server_info"):  # the second is SGLang's older name
        app.add_api_route(
            path,
            server_info_body,
            methods=["GET"],
            response_model=ServerInfo,
            responses=_ERROR_RESPONSES,
            name=path.strip("/"),
        )

    def model_info_body() -> ModelInfo:
        return ModelInfo(
            model_path=model.model_path or model.name,
            tokenizer_path=model.tokenizer_path,
            model_type=model.model_type,
            architectures=list(model.architectures) if model.architectures else None,
        )

    for path in ("/model_info", "/get_model_info"):  # SGLang's names, new and old
        app.add_api_route(
            path,
            model_info_body,
            methods=["GET"],
            response_model=ModelInfo,
            responses=_ERROR_RESPONSES,
            name=path.strip("/"),
        )

    @app.get("/metrics", response_class=Response, responses=_ERROR_RESPONSES)
    async def prometheus_metrics() -> Response:
        try:
            body = await engine.render_metrics()
        except RuntimeError as e:  # the engine is gone
            raise ApiError(503, str(e)) from e
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/flush_cache", response_model=FlushCacheResponse, responses=_ERROR_RESPONSES)
    async def flush_cache(
        timeout: float | None = Query(
            default=None,
            ge=0,
            le=3600,
            description="seconds to wait for running requests to finish (SGLang's parameter)",
        ),
    ) -> FlushCacheResponse:
        freed = await srv.flush(timeout)
        return FlushCacheResponse(message="cache flushed", freed_tokens=freed)

    @app.post("/reset_prefix_cache", response_model=FlushCacheResponse, responses=_ERROR_RESPONSES)
    async def reset_prefix_cache() -> FlushCacheResponse:
        """vLLM's name for ``/flush_cache`` (vLLM answers with an empty 200)."""
        freed = await srv.flush(None)
        return FlushCacheResponse(message="cache flushed", freed_tokens=freed)

    # ---- /v1/completions ---------------------------------------------------------------------
    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        response_model_exclude_unset=True,
        responses={**_ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    )
    async def completions(body: CompletionRequest, request: Request) -> Any:
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
        req = srv.make_req(rid, ids, _sampling(body, max_new), body)
        detok = IncrementalDetokenizer(model.tokenizer, stop_strings(body.stop))
        handle = await srv.admit(req, "prompt", srv.arrival(request))
        created = int(time.time())
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        with_ext = body.return_cached_tokens_details

        def choice(text: str, fin: FinishInfo | None) -> dict[str, Any]:
            out: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
            out["finish_reason"] = None if fin is None else _openai_finish(fin, detok)
            if fin is not None:
                out["matched_stop"] = _matched_stop(fin, detok)
            return out

        if body.stream:

            async def events() -> AsyncIterator[str]:
                def chunk(text: str, fin: FinishInfo | None) -> dict[str, Any]:
                    out: dict[str, Any] = {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": model.name,
                        "choices": [choice(text, fin)],
                    }
                    if fin is not None and with_ext:
                        out["sglext"] = _sglext(fin)
                    return out

                async for _ids, text, fin in srv.stream(handle, detok):
                    if fin is None:
                        yield _sse(chunk(text, None))
                        continue
                    if _is_error(fin):
                        yield _sse(_error_payload(fin))
                        break
                    yield _sse(chunk(text, fin))
                    if include_usage:
                        final = {**chunk("", None), "choices": [], "usage": _usage(fin)}
                        yield _sse(final)
                yield DONE

            return _event_stream(events(), rid)

        _, fin = await srv.collect(request, handle, detok)
        out = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model.name,
            "choices": [choice(detok.text, fin)],
            "usage": _usage(fin),
        }
        if with_ext:
            out["sglext"] = _sglext(fin)
        return out

    # ---- /v1/chat/completions ----------------------------------------------------------------
    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        response_model_exclude_unset=True,
        responses={**_ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
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
        req = srv.make_req(rid, ids, _sampling(body, max_new), body)
        detok = IncrementalDetokenizer(model.tokenizer, stop_strings(body.stop))
        handle = await srv.admit(req, "messages", srv.arrival(request))
        created = int(time.time())
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        with_ext = body.return_cached_tokens_details

        if body.stream:

            async def events() -> AsyncIterator[str]:
                def chunk(delta: dict[str, str], fin: FinishInfo | None) -> dict[str, Any]:
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
                    choice["finish_reason"] = None if fin is None else _openai_finish(fin, detok)
                    out: dict[str, Any] = {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model.name,
                        "choices": [choice],
                    }
                    if fin is not None:
                        choice["matched_stop"] = _matched_stop(fin, detok)
                        if with_ext:
                            out["sglext"] = _sglext(fin)
                    return out

                yield _sse(chunk({"role": "assistant", "content": ""}, None))
                async for _ids, text, fin in srv.stream(handle, detok):
                    if fin is None:
                        if text:
                            yield _sse(chunk({"content": text}, None))
                        continue
                    if _is_error(fin):
                        yield _sse(_error_payload(fin))
                        break
                    if text:
                        yield _sse(chunk({"content": text}, None))
                    yield _sse(chunk({}, fin))
                    if include_usage:
                        final = {**chunk({}, None), "choices": [], "usage": _usage(fin)}
                        yield _sse(final)
                yield DONE

            return _event_stream(events(), rid)

        _, fin = await srv.collect(request, handle, detok)
        out = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": detok.text},
                    "logprobs": None,
                    "finish_reason": _openai_finish(fin, detok),
                    "matched_stop": _matched_stop(fin, detok),
                }
            ],
            "usage": _usage(fin),
        }
        if with_ext:
            out["sglext"] = _sglext(fin)
        return out

    # ---- /generate -------------------------------------------------------------------------------
    @app.post(
        "/generate",
        response_model=GenerateResponse,
        responses={**_ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
    )
    async def generate(body: GenerateRequest, request: Request) -> Any:
        srv.check_priority(body.priority)
        sp = body.sampling_params
        if body.input_ids is not None:
            ids = np.asarray(body.input_ids, dtype=np.int64)
            field = "input_ids"
        else:
            field = "text"
            ids = await srv.encode(body.text or "", field)
        max_new = srv.budget(
            len(ids),
            sp.max_new_tokens,
            DEFAULT_GENERATE_MAX_NEW_TOKENS,
            field,
            "sampling_params.max_new_tokens",
        )
        if body.input_ids is not None:
            srv.check_ids(ids, field)
        rid = body.rid if body.rid is not None else uuid.uuid4().hex
        req = srv.make_req(rid, ids, _sampling(sp, max_new), body)
        detok = IncrementalDetokenizer(model.tokenizer, stop_strings(sp.stop))
        handle = await srv.admit(req, field, srv.arrival(request))

        def meta(out_ids: list[int], fin: FinishInfo | None) -> dict[str, Any]:
            cached = req.cached_tokens if fin is None else fin.cached_tokens
            host = req.host_cached_tokens if fin is None else fin.host_cached_tokens
            return {
                "id": rid,
                "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids),
                "cached_tokens": cached,
                "cached_tokens_details": _cached_details(cached, host),
                "finish_reason": None if fin is None else _sglang_finish(fin, detok),
                "e2e_latency": 0.0 if fin is None else fin.e2e_latency_s,
            }

        if body.stream:

            async def events() -> AsyncIterator[str]:
                out_ids: list[int] = []
                async for new_ids, _text, fin in srv.stream(handle, detok):
                    out_ids.extend(new_ids)
                    if fin is not None and _is_error(fin):
                        yield _sse(_error_payload(fin))
                        break
                    payload = {
                        "text": detok.text,
                        "output_ids": out_ids,
                        "meta_info": meta(out_ids, fin),
                    }
                    yield _sse(payload)
                yield DONE

            return _event_stream(events(), rid)

        out_ids, fin = await srv.collect(request, handle, detok)
        return {"text": detok.text, "output_ids": out_ids, "meta_info": meta(out_ids, fin)}

    # Added innermost first: the catch-all ends up outermost, then the arrival stamp with the
    # Host and Origin checks, the API key, the body limit, HEAD-as-GET.
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=srv.body_limit)
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(GuardMiddleware, policy=access, now=engine.now)
    app.add_middleware(CatchAllMiddleware)
    return app


# ---- building an engine -----------------------------------------------------------------------


def build_engine(
    model_name: str,
    config: SchedulerConfig,
    *,
    kv_slots: int | None = None,
    kv_cache_mb: float = 256.0,
    context_len: int | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    seed: int = 0,
    served_model_name: str | None = None,
) -> tuple[EngineLoop, ServedModel]:
    """Load a model (``radixsched.engine.loader.load_model`` names or paths) and put it under
    an (unstarted) engine loop; see ``engine_for_model``."""
    from radixsched.engine.loader import load_model

    loaded = load_model(model_name, device=device, dtype=dtype, seed=seed)
    return engine_for_model(
        loaded,
        config,
        kv_slots=kv_slots,
        kv_cache_mb=kv_cache_mb,
        context_len=context_len,
        seed=seed,
        served_model_name=served_model_name,
        tokenizer_path=tokenizer_dir(model_name),
    )


def tokenizer_dir(model_name: str) -> str | None:
    """The directory holding ``tokenizer.json`` for a model name or path (None: random models
    and GGUF files, whose tokenizer lives in memory only)."""
    from radixsched.engine.smollm2 import SMOLLM2_NAMES, converted_dir

    if model_name in SMOLLM2_NAMES:
        path = converted_dir()
    else:
        path = Path(model_name).expanduser()
    if not (path / "tokenizer.json").is_file():
        return None
    return str(path.resolve())


def engine_for_model(
    loaded: LoadedModel,
    config: SchedulerConfig,
    *,
    kv_slots: int | None = None,
    kv_cache_mb: float = 256.0,
    context_len: int | None = None,
    seed: int = 0,
    served_model_name: str | None = None,
    tokenizer_path: str | None = None,
) -> tuple[EngineLoop, ServedModel]:
    """A ``TorchRunner`` over a fresh KV pool under a wall-clock ``Scheduler``, in an
    (unstarted) loop. Several engines may share one loaded model (the weights are read-only).

    KV pool: ``kv_slots`` tokens, else as many as fit in ``kv_cache_mb`` (at most
    ``MAX_DEFAULT_KV_SLOTS``)."""
    if kv_slots is None:
        kv_slots = default_kv_slots(loaded, kv_cache_mb)
    runner = torch_runner(loaded, config, kv_slots, context_len=context_len, seed=seed)
    engine = engine_for_runner(
        runner, config, kv_slots=kv_slots, context_len=runner.max_context_len
    )
    served = served_model(
        loaded,
        runner.max_context_len,
        served_model_name=served_model_name,
        tokenizer_path=tokenizer_path,
    )
    return engine, served


MAX_DEFAULT_KV_SLOTS = 1 << 17


def default_kv_slots(loaded: LoadedModel, kv_cache_mb: float) -> int:
    """KV pool tokens that fit in ``kv_cache_mb``, at most ``MAX_DEFAULT_KV_SLOTS``."""
    from radixsched.engine.runner import TorchRunner

    return min(
        TorchRunner.kv_slots_for_bytes(loaded, int(kv_cache_mb * 2**20)), MAX_DEFAULT_KV_SLOTS
    )


def torch_runner(
    loaded: LoadedModel,
    config: SchedulerConfig,
    kv_slots: int,
    *,
    context_len: int | None,
    seed: int,
) -> TorchRunner:
    """The model's runner over a pool for ``kv_slots`` scheduler slots: the allocator hands out
    slots 1 .. (kv_slots // page + 1) * page - 1 (page 0 reserved)."""
    from radixsched.engine.runner import TorchRunner

    page = config.page_size
    pool = (kv_slots // page + 1) * page - 1
    return TorchRunner(loaded, pool, seed=seed, max_context_len=context_len)


def engine_for_runner(
    runner: ModelRunner,
    config: SchedulerConfig,
    *,
    kv_slots: int,
    context_len: int,
    clock: WallClock | None = None,
    sink: Sink = post_to_event_loops,
    on_unhealthy: Callable[[], None] | None = None,
) -> EngineLoop:
    """A wall-clock ``Scheduler`` over ``runner`` in an (unstarted) ``EngineLoop`` whose posts
    go to ``sink`` (default: the event loops of the requests' handles)."""
    from radixsched.clock import WallClock
    from radixsched.scheduler import Scheduler

    clock = clock if clock is not None else WallClock()
    recorder = BatchRecorder(runner)  # the scheduler is built on it: nothing is rewired later
    sched = Scheduler(config, recorder, kv_slots=kv_slots, clock=clock, context_len=context_len)
    return EngineLoop(
        sched, metrics=ServerMetrics(), clock=clock, sink=sink, on_unhealthy=on_unhealthy
    )


# ---- running it ---------------------------------------------------------------------------------


class ServerThread:
    """Run an app with uvicorn on a loopback port in a background thread (tests, benchmarks).

    The socket is bound before the thread starts, so ``url`` is valid immediately and no other
    process can take the port in between."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
        self.server = GracefulServer(config)
        self._thread = threading.Thread(target=self._serve, name="radixsched-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()
        if self._thread.is_alive():
            raise RuntimeError("uvicorn did not stop")

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serving(app: Any) -> Iterator[ServerThread]:
    with ServerThread(app) as st:
        yield st


def run_server(app: Any, host: str, port: int, *, log_level: str = "info") -> None:
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5
    )
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        GracefulServer(config).run()


class GracefulServer(uvicorn.Server):
    """uvicorn, but on shutdown the engine loop is stopped first: requests still in flight are
    answered with 503 (instead of uvicorn waiting for generations that may take minutes),
    then connections drain and the app's lifespan shutdown runs."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        engine = getattr(getattr(self.config.app, "state", None), "engine", None)
        if engine is not None:
            await asyncio.to_thread(engine.stop)
        await super().shutdown(sockets)


__all__ = [
    "AccessPolicy",
    "ApiError",
    "GracefulServer",
    "RequestLimits",
    "ServedModel",
    "ServerThread",
    "build_engine",
    "create_app",
    "engine_for_model",
    "engine_for_runner",
    "run_server",
    "served_model",
    "serving",
    "tokenizer_dir",
]
