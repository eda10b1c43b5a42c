"""The HTTP side of ``mmagent serve``: a Starlette app over a :class:`~mmagent.serve.engine.ChatEngine`.

Routes (each also with a trailing slash, and the two OpenAI ones also without ``/v1``):

* ``POST /v1/chat/completions``: a ``chat.completion``, or with ``"stream": true`` server-sent events of
  ``chat.completion.chunk`` objects ending in ``data: [DONE]``;
* ``GET /v1/models``: the one model served;
* ``GET /health``: ``{"status": "ok", ...}`` with the engine's counters (JSON);
* ``GET /metrics``: the same counters in the Prometheus text format.

Every error is OpenAI's JSON (``{"error": {"message", "type", "code"}}``) with its status: 400 for a request
that cannot be served, 404 for an unknown model or path, 405 for a wrong method, 413 for a body over the
limit, 503 with ``Retry-After`` when the queue is full, 500 for a failure of the server's own. A streaming
request is checked and encoded before the first byte goes out, so its errors have their status too; an
error after that (the model failed) is a last event holding the error JSON, which OpenAI clients raise.
A client that leaves before its turn started frees its place in the queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from mmagent.serve.engine import ChatEngine, Event, Failed, Finished, Job, Started, Text
from mmagent.serve.metrics import prometheus_text
from mmagent.serve.request import ChatRequest, RequestError, ServerBusy, parse_request
from mmagent.serve.response import StreamedText, chunk_json, completion_json, error_json, new_id, usage_json

log = logging.getLogger(__name__)

#: the largest request body by default (media come inline as base64 data URLs)
DEFAULT_MAX_REQUEST_BYTES = 64 * 2 ** 20
#: how often a waiting non-streaming request checks that its client is still there (seconds)
DISCONNECT_POLL_S = 1.0


def error_response(exc: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, ServerBusy) else None
    return JSONResponse(error_json(exc.status, str(exc), exc.kind), status_code=exc.status, headers=headers)


#: a body over the limit is still read (and dropped) up to this many times the limit before the 413 goes out:
#: a server that answers while the client is still sending closes the socket under it, and the client sees a
#: reset connection instead of the 413 (this happened under load); past it, the connection is simply closed
DRAIN_FACTOR = 16


async def _drop_rest(request: Request, budget: int) -> None:
    dropped = 0
    async for chunk in request.stream():
        dropped += len(chunk)
        if dropped > budget:
            return


async def _read_body(request: Request, limit: int) -> bytes:
    too_big = RequestError(f"the request body is over {limit / 2 ** 20:g} MiB (the server's --max-request-mb)", 413)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(f"the Content-Length header {declared!r} is not a number")
        if int(declared) > limit:
            if int(declared) <= DRAIN_FACTOR * limit:
                await _drop_rest(request, DRAIN_FACTOR * limit)
            raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            await _drop_rest(request, DRAIN_FACTOR * limit)
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes, model_name: str) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not JSON ({exc})") from None
    return parse_request(body, model_name)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Chat:
    """``POST /v1/chat/completions``."""

    def __init__(self, engine: ChatEngine, max_request_bytes: int) -> None:
        self.engine = engine
        self.max_request_bytes = max_request_bytes

    async def handle(self, request: Request) -> Response:
        try:
            raw = await _read_body(request, self.max_request_bytes)
            # decoding megabytes of JSON and data URLs would stall every other connection: off the event loop
            req = await anyio.to_thread.run_sync(_parse, raw, self.engine.model_name)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue[Event] = asyncio.Queue()
            job = self.engine.submit(req, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        except RequestError as exc:
            if not isinstance(exc, ServerBusy):
                self.engine.metrics.add("invalid")
            return error_response(exc)
        first = await self._next(events, request, job)
        if first is None:  # the client left while waiting
            return Response(status_code=499)
        if isinstance(first, Failed):
            return error_response(first.error)
        if req.stream:
            return StreamingResponse(self._stream(req, job, events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        while not isinstance(first, (Finished, Failed)):
            first = await self._next(events, request, job)
            if first is None:
                return Response(status_code=499)
        if isinstance(first, Failed):
            return error_response(first.error)
        return JSONResponse(completion_json(first.completion, self.engine.model_name))

    @staticmethod
    async def _next(events: asyncio.Queue[Event], request: Request, job: Job) -> Event | None:
        """The job's next event; None (and the job cancelled) when the client has gone meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    return None

    async def _stream(self, req: ChatRequest, job: Job, events: asyncio.Queue[Event]) -> AsyncIterator[str]:
        rid, created, model, usage = new_id(), int(time.time()), self.engine.model_name, req.include_usage
        text = StreamedText(req.stops)
        done = False
        try:
            yield _sse(chunk_json(rid, model, created, {"role": "assistant", "content": ""}, include_usage=usage))
            while not done:
                ev = await events.get()
                if isinstance(ev, Text):
                    delta = text.update(ev.text)
                    if delta:
                        yield _sse(chunk_json(rid, model, created, {"content": delta}, include_usage=usage))
                elif isinstance(ev, Finished):
                    c = ev.completion
                    rest = text.final(c.content)
                    if rest:
                        yield _sse(chunk_json(rid, model, created, {"content": rest}, include_usage=usage))
                    yield _sse(chunk_json(rid, model, created, {}, c.finish_reason, c.stop_reason,
                                          include_usage=usage))
                    if usage:
                        yield _sse(chunk_json(rid, model, created, None, usage=usage_json(c), include_usage=True))
                    done = True
                elif isinstance(ev, Failed):
                    yield _sse(error_json(ev.error.status, str(ev.error), ev.error.kind))
                    done = True
                elif not isinstance(ev, Started):
                    raise AssertionError(f"unexpected event {ev!r}")
            yield "data: [DONE]\n\n"
        finally:
            if not done:
                job.cancel()


def make_app(engine: ChatEngine, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Starlette:
    """The ASGI app serving ``engine`` (run it with uvicorn: :mod:`mmagent.serve.server`)."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": engine.model_name, "object": "model",
                                                         "owned_by": "mmagent", "created": 0}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", **engine.stats()})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(prometheus_text(engine.stats()), media_type="text/plain; version=0.0.4")

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            message, kind = f"no endpoint {request.url.path}; try POST /v1/chat/completions", "not_found"
        elif status == 405:
            message, kind = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            message, kind = str(getattr(exc, "detail", "") or exc), "invalid_request_error"
        return JSONResponse(error_json(status, message, kind), status_code=status)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return JSONResponse(error_json(500, f"{type(exc).__name__}: {exc}", "server_error"), status_code=500)

    chat = _Chat(engine, max_request_bytes).handle
    routes = []
    for path, endpoint, methods in [("/v1/chat/completions", chat, ["POST"]), ("/chat/completions", chat, ["POST"]),
                                    ("/v1/models", models, ["GET"]), ("/models", models, ["GET"]),
                                    ("/health", health, ["GET"]), ("/metrics", metrics, ["GET"])]:
        routes += [Route(path, endpoint, methods=methods), Route(path + "/", endpoint, methods=methods)]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
