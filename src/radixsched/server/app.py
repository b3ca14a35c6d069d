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

The endpoints live in three routers (``routes_openai``, ``routes_sglang``, ``routes_admin``)
over one shared ``state.ServerState``; ``create_app`` assembles them with the middleware.
This module imports FastAPI: import it only to serve (the CLI does so lazily).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from radixsched.server import routes_admin, routes_openai, routes_sglang
from radixsched.server.errors import install_error_handlers
from radixsched.server.guard import (
    AccessPolicy,
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    CatchAllMiddleware,
    GuardMiddleware,
    HeadMiddleware,
    RequestLimits,
)
from radixsched.server.loop import Engine, EngineLoop
from radixsched.server.metrics import ServerMetrics
from radixsched.server.model import ServedModel
from radixsched.server.state import ServerState


def create_app(
    engine: Engine,
    model: ServedModel,
    *,
    api_key: str | None = None,
    limits: RequestLimits | None = None,
    access: AccessPolicy | None = None,
) -> FastAPI:
    """The app over a (not yet started) ``EngineLoop``: the app's lifespan starts the loop
    and stops it on shutdown. ``api_key=""`` is refused (it would
    silently turn authentication off); ``access`` says which Host headers and Origins are
    accepted (default: a server bound to 127.0.0.1)."""
    if api_key is not None and not api_key:
        raise ValueError("the API key is empty: an empty key would disable authentication")
    limits = limits if limits is not None else RequestLimits()
    access = access if access is not None else AccessPolicy()
    srv = ServerState(engine, model, limits, access)
    if isinstance(engine, EngineLoop) and engine.metrics is None:
        engine.metrics = ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)

    app = FastAPI(
        title="radixsched",
        version="0.1.0",
        description="OpenAI-compatible and SGLang-native generation over the radixsched scheduler",
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.served_model = model
    app.state.server = srv
    install_error_handlers(app)
    # The routers' routes go into the app's own table (not ``include_router``, which newer
    # FastAPI keeps as one opaque entry): ``app.routes`` lists every endpoint.
    for routes in (routes_admin, routes_openai, routes_sglang):
        app.router.routes.extend(routes.router.routes)
    # Added innermost first: the catch-all ends up outermost, then the arrival stamp with the
    # Host and Origin checks, the API key, the body limit, HEAD-as-GET.
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=srv.body_limit)
    if api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(GuardMiddleware, policy=access, now=engine.now)
    app.add_middleware(CatchAllMiddleware)
    return app


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


__all__ = ["GracefulServer", "ServerThread", "create_app", "run_server"]
