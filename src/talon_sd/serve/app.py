"""The HTTP layer: OpenAI-compatible routes that translate a request into a scheduler submission and
its events into a response. It holds no model and runs no forward.

    GET  /v1/models              the one served model
    POST /v1/chat/completions    chat messages (the chat template applied); ``stream: true`` = SSE
    POST /v1/completions         raw text or token ids (no template); ``stream: true`` = SSE
    GET  /health                 200 while the worker runs, else 503
    GET  /metrics                Prometheus text (:mod:`talon_sd.serve.metrics`)

Every error is an OpenAI error object ``{"error": {"message", "type", "param", "code"}}``: 400 for a
bad request (FastAPI's 422 validation errors included), 401 for a missing or wrong API key, 404 for
an unknown model or route, 429 when the queue is full, 503 while shutting down, 500 (without a
traceback) for anything unexpected. A streamed request whose status is already sent reports a late
error as one ``data: {"error": ...}`` event before ``data: [DONE]``.

A client that goes away (while queued, streaming or waiting for a whole response) cancels its
request (:meth:`Ticket.cancel`); the worker stops it after its current text chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import TreeConfig
from ..errors import TalonError
from .metrics import ServerMetrics
from .scheduler import Cancelled, Chunk, Failed, FifoScheduler, Finished, QueueFull, ShuttingDown, Started, Ticket
from .schemas import (ChatCompletionRequest, ChatResponder, CompletionRequest, CompletionResponder, OpenAIError,
                      error_from_talon)

LOG = logging.getLogger("talon_sd.serve")
ENDPOINTS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/metrics")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the response


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # the only accepted ``model`` (requests may omit it)
    server_tree: TreeConfig  # the tree requests get unless they set ``talon`` options
    max_model_len: int
    api_key: str | None = None  # when set, /v1/* requires ``Authorization: Bearer <api_key>``


def create_app(scheduler: FifoScheduler, metrics: ServerMetrics, settings: ServerSettings,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The app; its lifespan starts the scheduler's worker and stops it (joined) on shutdown, then calls
    ``on_shutdown`` (e.g. saving what the budget controller learned: uvicorn re-raises SIGINT / SIGTERM
    once it is done, so code after ``uvicorn.run`` would not run)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        stopped = scheduler.stop()
        LOG.info("talon serve: worker %s", "stopped" if stopped else "did not stop in time")
        if on_shutdown is not None and stopped:  # a worker still running may be changing what would be saved
            on_shutdown()

    app = FastAPI(title="talon-sd", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(_CountResponses, metrics=metrics)
    _add_error_handlers(app)
    authorized = [Depends(_api_key_check(settings.api_key))]

    @app.get("/health")
    async def health() -> JSONResponse:
        if scheduler.alive:
            return JSONResponse({"status": "ok", "waiting": scheduler.waiting})
        return JSONResponse({"status": "stopped"}, status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models", dependencies=authorized)
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "talon-sd", "max_model_len": settings.max_model_len}]}

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _complete(request, body, ChatResponder(settings.model_name, body.include_usage))

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _complete(request, body, CompletionResponder(settings.model_name, body.include_usage))

    async def _complete(request: Request, body, responder) -> Response:
        if body.model is not None and body.model != settings.model_name:
            raise OpenAIError(404, f"model: {body.model!r} is not served here (this server serves "
                              f"{settings.model_name!r})", param="model", code="model_not_found")
        engine_request = body.engine_request(settings.server_tree)
        try:
            ticket = scheduler.submit(engine_request)
        except QueueFull as error:
            raise OpenAIError(429, str(error), type="rate_limit_error", code="queue_full") from None
        except ShuttingDown as error:
            raise OpenAIError(503, str(error), type="server_error", code="shutting_down") from None
        events = aiter(ticket)
        async with _cancel_on_disconnect(request, ticket):
            first = await anext(events)  # Started once the worker takes it, or how it ended
            if isinstance(first, Started) and not body.stream:
                last = first
                async for last in events:  # chunks, then the final event
                    pass
                return _ending(last, body, responder, first.prompt_tokens)
        if isinstance(first, Started):
            stream = _event_stream(events, body, responder, first.prompt_tokens)
            return _EventStreamResponse(stream, on_close=ticket.cancel)
        return _ending(first, body, responder, 0)

    return app


def _ending(event, body, responder, prompt_tokens: int) -> Response:
    """The whole response for a request that ended with ``event`` (Finished, Cancelled or Failed)."""
    if isinstance(event, Finished):
        return JSONResponse(responder.response(event.result, prompt_tokens))
    if isinstance(event, Cancelled):
        return JSONResponse(OpenAIError(CLIENT_CLOSED_REQUEST, "the client closed the request").body(),
                            status_code=CLIENT_CLOSED_REQUEST)
    raise _error_of(event.error, body)


def _error_of(error: Exception, body) -> OpenAIError:
    """The OpenAI error for a failed request (a TalonError names the bad field)."""
    if isinstance(error, TalonError):
        return error_from_talon(error, body.prompt_field, body.max_tokens_field)
    if isinstance(error, ShuttingDown):
        return OpenAIError(503, str(error), type="server_error", code="shutting_down")
    LOG.error("generation failed: %r", error)
    return OpenAIError(500, "the engine failed on this request; see the server log", type="server_error")


async def _event_stream(events: AsyncIterator, body, responder, prompt_tokens: int) -> AsyncIterator[str]:
    """Server-sent events: the responder's chunks, then ``data: [DONE]``."""
    for chunk in responder.opening():
        yield _sse(chunk)
    async for event in events:
        if isinstance(event, Chunk):
            yield _sse(responder.chunk(event.text))
        elif isinstance(event, Finished):
            for chunk in responder.closing(event.result, prompt_tokens):
                yield _sse(chunk)
        elif isinstance(event, Failed):
            yield _sse(_error_of(event.error, body).body())
    yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class _EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that calls ``on_close`` however it ends (done, client gone, shutdown)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


@contextlib.asynccontextmanager
async def _cancel_on_disconnect(request: Request, ticket: Ticket):
    """Cancel ``ticket`` if the client disconnects while the body of this block runs, or if it raises
    (the handler task cancelled at shutdown, say)."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                ticket.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    except BaseException:
        ticket.cancel()
        raise
    finally:
        watcher.cancel()


def _api_key_check(api_key: str | None):
    """A dependency that refuses requests without ``Authorization: Bearer <api_key>`` (none: open)."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                              code="invalid_api_key")

    return check


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(error).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return JSONResponse(OpenAIError(error.status_code, str(error.detail), code=code).body(),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        LOG.error("unexpected error on %s: %r", request.url.path, error)
        return JSONResponse(OpenAIError(500, "internal server error; see the server log", type="server_error").body(),
                            status_code=500)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def _validation_error(error: RequestValidationError) -> OpenAIError:
    """The first pydantic error as ``"<param>: <message>"`` (never echoing the input: it may be NaN)."""
    errors = error.errors()
    if not errors:
        return OpenAIError(400, "invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return OpenAIError(400, f"the body is not valid JSON: {reason}".rstrip(": "))
    param = ""
    for part in list(first.get("loc", ()))[1:]:  # drop "body"
        if isinstance(part, int):
            param += f"[{part}]"
        elif part.isidentifier() and part.lower() not in _TYPE_TAGS:
            param += f".{part}" if param else part
        else:
            break  # a union member's tag such as "list[str]": the field name is complete
    message = str(first.get("msg", "invalid value"))
    if not param:
        return OpenAIError(400, f"the body must be a JSON object with the request fields: {message}")
    return OpenAIError(400, f"{param}: {message}", param=param)


class _CountResponses:
    """ASGI middleware: counts every HTTP response by endpoint and status code."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        started = False

        async def counting_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.observe_response(endpoint, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.metrics.observe_response(endpoint, 500)
            raise
