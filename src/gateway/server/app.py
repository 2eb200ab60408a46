"""The HTTP front door: OpenAI-compatible and SGLang-native endpoints plus admin.

Handlers only parse, authenticate and frame; the pipeline lives in routing/.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.observability.request_log import current_record, sane_request_id
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.embeddings import EmbeddingRequest
from gateway.protocol.errors import (
    GatewayError,
    ServiceUnavailableError,
)
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.inspect import InspectRequest
from gateway.protocol.responses import ModelCard, ModelList
from gateway.protocol.tokens import DetokenizeRequest, TokenizeRequest
from gateway.routing import chat as chat_route
from gateway.routing import completions as completions_route
from gateway.routing import native as native_route
from gateway.routing.inspect import Inspector
from gateway.routing.request_context import RequestContext
from gateway.server.admin import register_admin_routes
from gateway.server.admission import Ticket
from gateway.server.http_util import (
    ClientGone,
    EventStream,
    JSONResponse,
    buffer_body,
    error_response,
    parse_model,
    read_json,
    unless_disconnected,
)
from gateway.server.observability import install_observability
from gateway.server.openapi import describe_request_bodies
from gateway.server.sse import DONE, sse, sse_error
from gateway.server.state import GatewayState

log = logging.getLogger(__name__)

ROUTING_KEY_HEADERS = ("x-smg-routing-key", "x-routing-key")
TARGET_WORKER_HEADERS = ("x-smg-target-worker", "x-target-worker")

# Status for a request whose client left (nginx's convention; nobody reads it).
CLIENT_CLOSED = 499


def _first_header(request: Request, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = request.headers.get(name)
        if value:
            return value
    return None


def create_app(state: GatewayState, *, manage_lifecycle: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await state.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await state.stop()

    app = FastAPI(title="token-gateway", version="0.1.0", lifespan=lifespan)
    app.state.gateway = state
    max_body = state.config.server.max_body_bytes

    def context(request: Request, auth: Callable[[Mapping[str, str]], str | None]) -> RequestContext:
        key_id = auth(request.headers)
        ctx = RequestContext(
            api_key_id=key_id,
            routing_key=_first_header(request, ROUTING_KEY_HEADERS),
            target_worker=_first_header(request, TARGET_WORKER_HEADERS),
        )
        record = current_record()  # the id the access log and the worker both see
        incoming = record.request_id if record else sane_request_id(request.headers.get("x-request-id"))
        if incoming:
            ctx.request_id = incoming
        return ctx

    def headers_for(ctx: RequestContext) -> dict[str, str]:
        out = {"x-request-id": ctx.request_id}
        if ctx.worker_ids:
            out["x-worker-id"] = ",".join(dict.fromkeys(ctx.worker_ids))
        return out

    async def handle(
        request: Request,
        run: Callable[[RequestContext], Any],
        *,
        admit: bool = False,
        auth: Callable[[Mapping[str, str]], str | None] = state.auth.inference,
    ) -> Response:
        """Run a JSON endpoint with ``auth``, admission (``admit``), disconnect watch and error mapping.

        The admission slot is held until the answer is complete: for a stream, until it ends."""
        ctx = RequestContext()
        tickets: list[Ticket] = []

        async def admitted(ctx: RequestContext) -> Any:
            if admit:
                tickets.append(await state.admission.acquire(ctx.api_key_id))
            return await run(ctx)

        result: Any = None
        try:
            ctx = context(request, auth)
            await buffer_body(request, max_body)  # before the disconnect watcher shares `receive`
            result = await unless_disconnected(request, admitted(ctx))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except GatewayError as exc:
            return error_response(exc, headers_for(ctx))
        finally:
            for ticket in tickets:
                if isinstance(result, EventStream):
                    result.on_close = ticket.release
                else:
                    ticket.release()
        if isinstance(result, Response):
            result.headers.update(headers_for(ctx))
            return result
        return JSONResponse(result, headers=headers_for(ctx))

    def sse_stream(chunks: AsyncIterator[dict[str, Any]], ctx: RequestContext) -> EventStream:
        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    yield sse(chunk)
            except GatewayError as exc:
                log.warning("request %s failed mid-stream: %s", ctx.request_id, exc.message)
                yield sse_error(exc.status, exc.message, exc.type, exc.code)
            yield DONE

        return EventStream(body(), headers=headers_for(ctx))

    # ------------------------------------------------------------ OpenAI
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ChatCompletionRequest, await read_json(request, max_body))
            if req.stream:
                return sse_stream(await chat_route.stream_chat(state.engine, req, ctx), ctx)
            return await chat_route.complete_chat(state.engine, req, ctx)

        return await handle(request, run, admit=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(CompletionRequest, await read_json(request, max_body))
            if req.stream:
                _, chunks = await completions_route.stream_completions(state.engine, req, ctx)
                return sse_stream(chunks, ctx)
            return await completions_route.complete(state.engine, req, ctx)

        return await handle(request, run, admit=True)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(GenerateRequest, await read_json(request, max_body))
            if req.stream:
                return sse_stream(await native_route.stream_generate(state.engine, req, ctx), ctx)
            return await native_route.generate(state.engine, req, ctx)

        return await handle(request, run, admit=True)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(EmbeddingRequest, await read_json(request, max_body))
            return await native_route.embed(state.engine, req, ctx)

        return await handle(request, run, admit=True)

    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(TokenizeRequest, await read_json(request, max_body))
            return await native_route.tokenize(state.engine, req)

        return await handle(request, run)

    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(DetokenizeRequest, await read_json(request, max_body))
            return native_route.detokenize(state.engine, req)

        return await handle(request, run)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            cards = [
                ModelCard(id=e.name, root=e.name, max_model_len=e.max_context_length or None)
                for e in state.catalog.entries()
            ]
            return ModelList(data=cards).to_dict()

        return await handle(request, run)

    # ------------------------------------------------------------ health and admin
    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readiness")
    async def readiness() -> Response:
        available = [w for w in state.registry.all() if w.available]
        if not available or not state.catalog.names():
            exc = ServiceUnavailableError("no available worker")
            return error_response(exc)
        return JSONResponse({"status": "ready", "workers": len(available), "models": state.catalog.names()})

    register_admin_routes(app, state)

    inspector = Inspector(state.engine, state.config.policy)

    @app.post("/admin/inspect")
    async def admin_inspect(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(InspectRequest, await read_json(request, max_body))
            return (await inspector.inspect(req)).to_dict()

        return await handle(request, run)  # inference or admin key: it costs a tokenization

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return error_response(GatewayError(str(exc.detail), status=status, type=kind))

    install_observability(app, state.metrics, access_log=state.config.server.access_log)
    describe_request_bodies(app)
    return app
