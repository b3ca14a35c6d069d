"""Admin endpoints: ``GET /health`` (the engine is alive), ``GET /health_generate`` (SGLang's
deep check: one token through the whole engine) and ``GET /metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from radixsched.request import Req, SamplingParams
from radixsched.server.errors import ERROR_RESPONSES, ApiError
from radixsched.server.protocol import HealthResponse
from radixsched.server.replies import is_error
from radixsched.server.state import ServerState, server_state

HEALTH_GENERATE_TIMEOUT_S = 20.0

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


def _health_answer(ok: bool) -> JSONResponse:
    return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)


@router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def health(srv: State) -> JSONResponse:
    return _health_answer(srv.engine.alive and srv.engine.healthy)


@router.get(
    "/health_generate", response_model=HealthResponse, responses={503: {"model": HealthResponse}}
)
async def health_generate(request: Request, srv: State) -> JSONResponse:
    """SGLang's deep health check: one token through the whole engine."""
    engine = srv.engine
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
        return not is_error(delta.finish)

    try:
        ok = await asyncio.wait_for(one_token(), HEALTH_GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        ok = False
    finally:
        if not handle.finished:
            engine.abort(handle.rid)
    return _health_answer(ok)


@router.get("/metrics", response_class=Response, responses=ERROR_RESPONSES)
async def prometheus_metrics(srv: State) -> Response:
    try:
        body = await srv.engine.render_metrics()
    except RuntimeError as e:  # the engine is gone
        raise ApiError(503, str(e)) from e
    return Response(body, media_type=CONTENT_TYPE_LATEST)
