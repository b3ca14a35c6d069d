"""The handlers' shared state: one ``ServerState`` per app (``app.state.server``), reached by
every router through the ``server_state`` dependency. It checks a request against the model
(name, prompt size, token ids, budget), admits it to the engine and runs it to the end or as a
stream; a request whose client goes away is aborted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
from fastapi import Request

from radixsched.engine.tokenizer import TextEncodingError
from radixsched.request import Req, SamplingParams
from radixsched.server.detok import IncrementalDetokenizer
from radixsched.server.errors import ApiError
from radixsched.server.guard import ARRIVAL_SCOPE_KEY, AccessPolicy, RequestLimits
from radixsched.server.loop import Engine, FinishInfo, RequestHandle
from radixsched.server.model import ServedModel, max_prompt_chars
from radixsched.server.protocol import ChatMessage, SchedulingFields
from radixsched.server.replies import abort_error, is_error

if TYPE_CHECKING:
    from radixsched.config import SchedulerConfig

MIN_TEMPERATURE = 1e-5
MIN_TOP_P = 1e-6
# Texts longer than this are tokenized in a worker thread (shorter ones cost less than the hop).
INLINE_TOKENIZE_CHARS = 4096
FLUSH_POLL_S = 0.02


class SamplingSource(Protocol):
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop_token_ids: list[int] | None
    ignore_eos: bool


def sampling_params(src: SamplingSource, max_new_tokens: int) -> SamplingParams:
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


class ServerState:
    """The handlers' shared state (one per app: ``app.state.server``)."""

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
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            result = work.result() if work.done() else None
        finally:
            for task in (work, gone):
                if not task.done():
                    task.cancel()
            # Gone, or failed (the detokenizer raised): the request must not run on.
            if not handle.finished:
                self.engine.abort(handle.rid)
        if result is None:
            raise ApiError(499, "client disconnected")
        if is_error(result[1]):
            raise abort_error(result[1])
        return result

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


async def wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def server_state(request: Request) -> ServerState:
    """The app's ``ServerState`` (a FastAPI dependency of every handler)."""
    state: ServerState = request.app.state.server
    return state
