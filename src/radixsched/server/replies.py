"""The pieces of an answer that the OpenAI and SGLang routers share: finish reasons in each
API's words, usage and cached-token details, and server-sent event streams (a stream whose
producer fails ends with an error event and ``[DONE]``)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from radixsched.request import FinishReason
from radixsched.server.detok import IncrementalDetokenizer
from radixsched.server.errors import ApiError
from radixsched.server.guard import error_body
from radixsched.server.loop import STOP_STRING_STATUS, FinishInfo

logger = logging.getLogger(__name__)


def openai_finish(fin: FinishInfo, detok: IncrementalDetokenizer) -> str:
    # A stop-string abort is a "stop" too (other aborts are errors, never a finish reason).
    return "length" if fin.reason is FinishReason.LENGTH and not detok.stopped else "stop"


def matched_stop(fin: FinishInfo, detok: IncrementalDetokenizer) -> int | str | None:
    """SGLang's ``matched_stop``: the stop string or stop token id that ended the request."""
    if detok.stopped:
        return detok.matched_stop
    if fin.reason is FinishReason.STOP:
        return fin.matched_token
    return None


def is_error(fin: FinishInfo) -> bool:
    return fin.reason is FinishReason.ABORT and fin.status_code != STOP_STRING_STATUS


def usage_of(fin: FinishInfo) -> dict[str, Any]:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def cached_details(cached: int, host: int) -> dict[str, int]:
    return {"device": cached - host, "host": host}


def sglext_of(fin: FinishInfo) -> dict[str, Any]:
    """SGLang's extension object, as ``sglang.bench_serving --cache-report`` reads it."""
    return {"cached_tokens_details": cached_details(fin.cached_tokens, fin.host_cached_tokens)}


def sglang_finish(fin: FinishInfo, detok: IncrementalDetokenizer) -> dict[str, Any]:
    if detok.stopped:
        return {"type": "stop", "matched": detok.matched_stop}
    if fin.reason is FinishReason.STOP:
        return {"type": "stop", "matched": fin.matched_token}
    if fin.reason is FinishReason.LENGTH:
        return {"type": "length", "length": fin.completion_tokens}
    return {"type": "abort", "message": fin.message, "status_code": fin.status_code}


def sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


def error_event(fin: FinishInfo) -> dict[str, Any]:
    return {
        "error": {
            "message": fin.message or "request aborted",
            "type": "server_error" if (fin.status_code or 500) >= 500 else "invalid_request_error",
            "param": None,
            "code": fin.status_code,
        }
    }


def abort_error(fin: FinishInfo) -> ApiError:
    return ApiError(fin.status_code or 500, fin.message or "request aborted")


async def _ending_with_error_event(events: AsyncIterator[str], rid: str) -> AsyncIterator[str]:
    """A stream whose producer failed ends with an error event and ``[DONE]`` (the status line
    went out already); the producer's own cleanup has aborted the request."""
    try:
        async for chunk in events:
            yield chunk
    except Exception as e:
        logger.exception("stream of %s failed", rid)
        payload = json.loads(error_body(500, f"internal server error: {type(e).__name__}: {e}"))
        yield sse_line(payload)
        yield DONE


def event_stream(events: AsyncIterator[str], rid: str) -> StreamingResponse:
    return StreamingResponse(_ending_with_error_event(events, rid), media_type="text/event-stream")
