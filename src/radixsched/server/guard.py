"""What every HTTP request passes before it reaches an endpoint: pure ASGI middleware and the
policies it enforces. Standard library only (the CLI imports the policies without FastAPI).

Outermost first:

* ``CatchAllMiddleware``: an exception nothing else handled is logged and answered with a JSON
  500 in OpenAI's error shape (a response already complete is left alone, so the connection
  stays usable; only a response cut in the middle closes it);
* ``GuardMiddleware``: stamps the request's arrival on the scheduler's clock (latency metrics
  start here, as SGLang's do, so HTTP handling, tokenization and the wait for the current step
  are counted); rejects a Host header the server does not answer to (DNS rebinding: 400) and a
  foreign ``Origin`` on a state-changing method (cross-site requests: 403);
* ``ApiKeyMiddleware``: ``Authorization: Bearer KEY`` on every path but ``/health`` (401);
* ``BodyLimitMiddleware``: reads the whole body before the app runs; over the limit it is
  drained (so the client reads the answer instead of a reset connection) and answered with 413;
* ``HeadMiddleware``: HEAD is routed as GET (every GET endpoint answers HEAD, as load balancers
  probe; the server sends the headers only).

Every rejection is ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ARRIVAL_SCOPE_KEY = "radixsched.arrival"
RETRY_AFTER_S = 1

DEFAULT_MAX_COMPLETION_TOKENS = 2048
MIN_BODY_LIMIT = 1 << 20
BODY_BYTES_PER_CONTEXT_TOKEN = 32
# A rejected body is read and discarded up to this many bytes, then the connection is closed.
MAX_DRAIN_BYTES = 64 << 20

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HOST_CHECK_EXEMPT = frozenset({"/health"})  # probes address the server by any name
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})


# ---- error bodies --------------------------------------------------------------------------------


def error_kind(status: int) -> str:
    if status >= 500:
        return "server_error"
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    return "invalid_request_error"


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> bytes:
    """OpenAI's error shape. ASCII-escaped, so that no text (not even a lone surrogate) can
    make rendering the error fail."""
    payload = {
        "error": {"message": message, "type": error_kind(status), "param": param, "code": code}
    }
    return json.dumps(payload, ensure_ascii=True).encode("ascii")


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    body = error_body(status, message, code=code)
    extra = list(headers)
    if status == 503:
        extra.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


# ---- policies ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on what one request may ask of the server.

    ``max_request_bytes``: the body limit (None: ``BODY_BYTES_PER_CONTEXT_TOKEN`` per context
    token, at least ``MIN_BODY_LIMIT``; a prompt of a full context fits with room to spare).
    ``max_completion_tokens``: the budget of a chat request that sends no ``max_tokens`` (None:
    up to the end of the context, OpenAI's behaviour)."""

    max_request_bytes: int | None = None
    max_completion_tokens: int | None = DEFAULT_MAX_COMPLETION_TOKENS

    def __post_init__(self) -> None:
        if self.max_request_bytes is not None and self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if self.max_completion_tokens is not None and self.max_completion_tokens < 1:
            raise ValueError(
                f"max_completion_tokens must be >= 1 or None, got {self.max_completion_tokens}"
            )

    def body_limit(self, context_len: int) -> int:
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return max(MIN_BODY_LIMIT, BODY_BYTES_PER_CONTEXT_TOKEN * context_len)


@dataclass(frozen=True)
class AccessPolicy:
    """Which Host headers and Origins the server accepts.

    Hosts: the loopback names when bound to a loopback address; the bound address (and, for a
    name, what it resolves to) otherwise; for a wildcard bind (0.0.0.0, ::) the loopback names,
    the machine's host names and any IP literal that is an address of this machine. Plus
    ``allowed_hosts``: exact names, ``.example.com`` for a domain and its subdomains, ``*`` for
    any. Origins (checked on state-changing methods only, when a browser sends one): those whose
    host is accepted, plus ``allowed_origins`` (exact ``scheme://host[:port]``, or ``*``)."""

    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def host_allowed(self, host: str) -> bool:
        """``host``: a Host header value (name or address, port optional)."""
        return self._name_allowed(_host_name(host))

    def origin_allowed(self, origin: str) -> bool:
        normalized = origin.strip().rstrip("/").lower()
        exact = {o.rstrip("/").lower() for o in self.allowed_origins}
        if "*" in exact or normalized in exact:
            return True
        try:
            parts = urlsplit(normalized)
            name = parts.hostname
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not name:
            return False
        return self._name_allowed(name.rstrip("."))

    def _name_allowed(self, name: str) -> bool:
        if not name:
            return False
        extra = [h.lower() for h in self.allowed_hosts]
        if "*" in extra or name in extra:
            return True
        if any(h.startswith(".") and (name == h[1:] or name.endswith(h)) for h in extra):
            return True
        if name in self._names:
            return True
        return self._wildcard() and _is_local_address(name)

    def _wildcard(self) -> bool:
        return self.bind_host.strip("[]") in WILDCARD_BINDS

    @functools.cached_property
    def _names(self) -> frozenset[str]:
        bind = self.bind_host.strip("[]").lower()
        if self._wildcard():
            own = {socket.gethostname(), socket.getfqdn()}
            return frozenset(LOOPBACK_NAMES | {n.lower().rstrip(".") for n in own if n})
        names = {bind}
        if _is_ip(bind):
            if ipaddress.ip_address(bind).is_loopback:
                names |= LOOPBACK_NAMES
        else:
            if bind == "localhost":
                names |= LOOPBACK_NAMES
            with contextlib.suppress(OSError):
                names |= {str(info[4][0]).lower() for info in socket.getaddrinfo(bind, None)}
        return frozenset(names)


def _host_name(host: str) -> str:
    """The name of a Host header value: ``[::1]:80`` -> ``::1``, ``Example.com.:8000`` ->
    ``example.com``."""
    value = host.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else ""
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _is_local_address(name: str) -> bool:
    """Whether ``name`` is an IP literal of one of this machine's interfaces (it can be bound)."""
    if not _is_ip(name):
        return False
    addr = ipaddress.ip_address(name)
    if addr.is_unspecified or addr.is_multicast:
        return False
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((name, 0))
    except OSError:
        return False
    return True


# ---- middleware -------------------------------------------------------------------------------------


class CatchAllMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = complete = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, complete
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:
            logger.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if complete:
                return
            if started:
                raise  # a response cut in the middle: the server has to drop the connection
            await send_error(send, 500, f"internal server error: {type(e).__name__}: {e}")


class GuardMiddleware:
    def __init__(self, app: ASGIApp, policy: AccessPolicy, now: Callable[[], float]) -> None:
        self.app = app
        self.policy = policy
        self.now = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[ARRIVAL_SCOPE_KEY] = self.now()
        host = header(scope, b"host")
        if (
            host is not None
            and scope.get("path") not in HOST_CHECK_EXEMPT
            and not self.policy.host_allowed(host)
        ):
            await send_error(
                send,
                400,
                f"Host {host!r} is not a name this server answers to (start it with "
                "--allowed-hosts to add one)",
                code="invalid_host",
            )
            return
        origin = header(scope, b"origin")
        if (
            origin is not None
            and scope.get("method") not in SAFE_METHODS
            and not self.policy.origin_allowed(origin)
        ):
            await send_error(
                send,
                403,
                f"cross-site request from origin {origin!r} refused (start the server with "
                "--allowed-origins to allow a web client)",
                code="forbidden_origin",
            )
            return
        await self.app(scope, receive, send)


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, exempt: Sequence[str] = ("/health",)) -> None:
        if not api_key:
            raise ValueError("the API key is empty: an empty key would disable authentication")
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        auth = (header(scope, b"authorization") or "").encode("latin-1")
        if hmac.compare_digest(auth, self.expected):
            await self.app(scope, receive, send)
            return
        await send_error(
            send,
            401,
            "missing or invalid API key (send Authorization: Bearer KEY)",
            code="invalid_api_key",
            headers=[(b"www-authenticate", b"Bearer")],
        )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            expects_continue = (header(scope, b"expect") or "").lower() == "100-continue"
            # A client waiting for "100 Continue" has not sent the body: answer at once.
            drained = expects_continue or await _drain(receive, declared)
            await self._reject(send, declared, drained)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before the body was complete: nobody to answer
            chunk = bytes(message.get("body", b""))
            total += len(chunk)
            more = bool(message.get("more_body", False))
            if total > self.limit:
                drained = not more or await _drain(receive, MAX_DRAIN_BYTES)
                await self._reject(send, None, drained)
                return
            chunks.append(chunk)
            if not more:
                break
        replay: Message | None = {
            "type": "http.request",
            "body": b"".join(chunks),
            "more_body": False,
        }

        async def replay_receive() -> Message:
            nonlocal replay
            if replay is not None:
                message, replay = replay, None
                return message
            return await receive()

        await self.app(scope, replay_receive, send)

    async def _reject(self, send: Send, declared: int | None, drained: bool) -> None:
        size = f"of {declared} bytes " if declared is not None else ""
        await send_error(
            send,
            413,
            f"the request body {size}exceeds the limit of {self.limit} bytes "
            "(the server's --max-request-bytes)",
            code="request_too_large",
            headers=[] if drained else [(b"connection", b"close")],
        )


class HeadMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "HEAD":
            # A copy: the server still sees HEAD in its own scope and drops the body.
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


async def _drain(receive: Receive, declared: int) -> bool:
    """Read and discard the rest of a rejected body; True when it was read to its end."""
    if declared > MAX_DRAIN_BYTES:
        return False
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if seen > MAX_DRAIN_BYTES:
            return False


__all__ = [
    "ARRIVAL_SCOPE_KEY",
    "DEFAULT_MAX_COMPLETION_TOKENS",
    "AccessPolicy",
    "ApiKeyMiddleware",
    "BodyLimitMiddleware",
    "CatchAllMiddleware",
    "GuardMiddleware",
    "HeadMiddleware",
    "RequestLimits",
    "error_body",
    "error_kind",
    "send_error",
]
