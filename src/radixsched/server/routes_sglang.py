"""SGLang's native endpoints: ``POST /generate``, ``GET /server_info`` (and its older name
``/get_server_info``), ``GET /model_info`` (``/get_model_info``), ``GET /get_load``,
``POST /flush_cache``, and vLLM's ``POST /reset_prefix_cache``. sglang-router registers a
worker from ``/health``, ``/server_info`` and ``/model_info``, and polls ``/get_load``."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request

from radixsched import __version__
from radixsched.request import Req
from radixsched.server.detok import IncrementalDetokenizer
from radixsched.server.errors import ERROR_RESPONSES, ApiError
from radixsched.server.loop import FinishInfo
from radixsched.server.metrics import PREFIX, parse_counter
from radixsched.server.protocol import (
    FlushCacheResponse,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    ServerInfo,
    WorkerLoad,
    stop_strings,
)
from radixsched.server.replies import (
    DONE,
    cached_details,
    error_event,
    event_stream,
    is_error,
    sglang_finish,
    sse_line,
)
from radixsched.server.state import ServerState, sampling_params, server_state

DEFAULT_GENERATE_MAX_NEW_TOKENS = 128  # SGLang's default for /generate

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


def _get_at(paths: tuple[str, ...], endpoint: Callable[..., Any], model: type[Any]) -> None:
    """Answer GET at each of ``paths`` (SGLang's names for one endpoint, new and old)."""
    for path in paths:
        router.add_api_route(
            path,
            endpoint,
            methods=["GET"],
            response_model=model,
            responses=ERROR_RESPONSES,
            name=path.strip("/"),
        )


def server_info(srv: State) -> ServerInfo:
    info = srv.engine.info
    model = srv.model
    return ServerInfo(
        model=model.name,
        model_path=model.model_path or model.name,
        served_model_name=model.name,
        tokenizer_path=model.tokenizer_path,
        max_total_num_tokens=info.kv_slots,
        version=__version__,
        vocab_size=model.vocab_size,
        context_len=model.context_len,
        kv_slots=info.kv_slots,
        max_running_requests=info.max_running_requests,
        max_request_bytes=srv.body_limit,
        max_prompt_chars=srv.max_prompt_chars,
        max_completion_tokens=srv.limits.max_completion_tokens,
        allowed_hosts=list(srv.access.allowed_hosts),
        allowed_origins=list(srv.access.allowed_origins),
        scheduler=dataclasses.asdict(srv.config),
    )


_get_at(("/server_info", "/get_server_info"), server_info, ServerInfo)


def model_info(srv: State) -> ModelInfo:
    model = srv.model
    return ModelInfo(
        model_path=model.model_path or model.name,
        tokenizer_path=model.tokenizer_path,
        model_type=model.model_type,
        architectures=list(model.architectures) if model.architectures else None,
    )


_get_at(("/model_info", "/get_model_info"), model_info, ModelInfo)


@router.get("/get_load", response_model=list[WorkerLoad], responses=ERROR_RESPONSES)
async def get_load(srv: State) -> list[WorkerLoad]:
    """SGLang's load report, as sglang-router's load-based policies poll it: read from the
    engine's own gauges (the same numbers ``/metrics`` shows)."""
    try:
        text = (await srv.engine.render_metrics()).decode()
    except RuntimeError as e:  # the engine is gone
        raise ApiError(503, str(e)) from e
    running = int(parse_counter(text, f"{PREFIX}_num_running_requests"))
    waiting = int(parse_counter(text, f"{PREFIX}_num_waiting_requests"))
    used = round(parse_counter(text, f"{PREFIX}_kv_usage") * srv.engine.info.kv_slots)
    load = WorkerLoad(
        dp_rank=0, num_reqs=running + waiting, num_waiting_reqs=waiting, num_tokens=used
    )
    return [load]


@router.post("/flush_cache", response_model=FlushCacheResponse, responses=ERROR_RESPONSES)
async def flush_cache(
    srv: State,
    timeout: float | None = Query(
        default=None,
        ge=0,
        le=3600,
        description="seconds to wait for running requests to finish (SGLang's parameter)",
    ),
) -> FlushCacheResponse:
    freed = await srv.flush(timeout)
    return FlushCacheResponse(message="cache flushed", freed_tokens=freed)


@router.post("/reset_prefix_cache", response_model=FlushCacheResponse, responses=ERROR_RESPONSES)
async def reset_prefix_cache(srv: State) -> FlushCacheResponse:
    """vLLM's name for ``/flush_cache`` (vLLM answers with an empty 200)."""
    freed = await srv.flush(None)
    return FlushCacheResponse(message="cache flushed", freed_tokens=freed)


def _meta_info(
    req: Req,
    n_prompt: int,
    out_ids: list[int],
    fin: FinishInfo | None,
    detok: IncrementalDetokenizer,
) -> dict[str, Any]:
    """SGLang's ``meta_info`` of a ``/generate`` answer (or of one streamed chunk)."""
    cached = req.cached_tokens if fin is None else fin.cached_tokens
    host = req.host_cached_tokens if fin is None else fin.host_cached_tokens
    return {
        "id": req.rid,
        "prompt_tokens": n_prompt,
        "completion_tokens": len(out_ids),
        "cached_tokens": cached,
        "cached_tokens_details": cached_details(cached, host),
        "finish_reason": None if fin is None else sglang_finish(fin, detok),
        "e2e_latency": 0.0 if fin is None else fin.e2e_latency_s,
    }


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}}},
)
async def generate(body: GenerateRequest, request: Request, srv: State) -> Any:
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
    req = srv.make_req(rid, ids, sampling_params(sp, max_new), body)
    detok = IncrementalDetokenizer(srv.model.tokenizer, stop_strings(sp.stop))
    handle = await srv.admit(req, field, srv.arrival(request))

    if body.stream:

        async def events() -> AsyncIterator[str]:
            out_ids: list[int] = []
            async for new_ids, _text, fin in srv.stream(handle, detok):
                out_ids.extend(new_ids)
                if fin is not None and is_error(fin):
                    yield sse_line(error_event(fin))
                    break
                meta = _meta_info(req, len(ids), out_ids, fin, detok)
                yield sse_line({"text": detok.text, "output_ids": out_ids, "meta_info": meta})
            yield DONE

        return event_stream(events(), rid)

    out_ids, fin = await srv.collect(request, handle, detok)
    meta = _meta_info(req, len(ids), out_ids, fin, detok)
    return {"text": detok.text, "output_ids": out_ids, "meta_info": meta}
