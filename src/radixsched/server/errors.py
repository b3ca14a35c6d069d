"""Errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: ``ApiError`` for
handlers to raise, and the app's exception handlers (FastAPI's 422 becomes 400 naming the field;
Starlette's 404/405 keep their headers, and a 405's ``Allow`` lists HEAD wherever GET is)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixsched.server.guard import RETRY_AFTER_S, error_body
from radixsched.server.protocol import ErrorResponse

# The error answers every endpoint documents in the OpenAPI schema.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 503)
}


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

TYPE_LOC_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


def param_of_loc(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "content", "list[TextPart]", 0, "text")`` ->
    ``"messages[0].content[0].text"``; pydantic's union-member and validator tags are
    dropped."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    param = ""
    for p in parts:
        if isinstance(p, int):
            param += f"[{p}]"
            continue
        text = str(p)
        if text in TYPE_LOC_PARTS or "[" in text or "-" in text:
            continue
        param += ("." if param else "") + text
    return param or None


def most_specific_error(errors: Sequence[dict[str, Any]]) -> dict[str, Any]:
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


def validation_message(err: dict[str, Any]) -> tuple[str, str | None]:
    kind = err.get("type", "")
    param = param_of_loc(err.get("loc", ()))
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


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app answers goes out in OpenAI's shape."""
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, _on_api_error)  # type: ignore[arg-type]


async def _on_validation(request: Request, exc: RequestValidationError) -> Response:
    errors = list(exc.errors())
    if not errors:
        return error_response(400, "invalid request")
    message, param = validation_message(most_specific_error(errors))
    return error_response(400, message, param=param)


async def _on_http(request: Request, exc: StarletteHTTPException) -> Response:
    headers = dict(exc.headers or {})
    allow = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
    if "GET" in allow and "HEAD" not in allow:  # HeadMiddleware serves HEAD for every GET
        headers["Allow"] = ", ".join([*allow, "HEAD"])
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
