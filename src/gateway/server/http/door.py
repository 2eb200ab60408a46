"""What every HTTP route shares: auth, request context, admission, disconnect watch, errors, SSE.

Route modules (``openai``, ``native``, ``admin``, ``health``) only parse their body
and call the pipeline; ``HttpDoor.handle`` runs each of them the same way, so an
admission slot, the request id and the OpenAI error shape are owned here once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from gateway.observability.request_log import current_record, sane_request_id
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import GatewayError
from gateway.protocol.headers import (
    REQUEST_ID,
    ROUTING_KEY_HEADERS,
    TARGET_WORKER_HEADERS,
    WORKER_ID,
    first_header,
)
from gateway.protocol.ids import random_hex
from gateway.server.admission import Ticket
from gateway.server.http.sse import DONE, StreamEvent, sse_error
from gateway.server.http.util import (
    ClientGone,
    EventStream,
    JSONResponse,
    buffer_body,
    error_response,
    unless_disconnected,
)
from gateway.server.state import GatewayState

log = logging.getLogger(__name__)

# Status for a request whose client left (nginx's convention; nobody reads it).
CLIENT_CLOSED = 499

Auth = Callable[[Mapping[str, str]], str | None]


class HttpDoor:
    """The HTTP front door's one way of running a request, shared by every router."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.max_body = state.config.server.max_body_bytes

    def context(self, request: Request, auth: Auth) -> RequestContext:
        return self.context_from(request.headers, auth)

    def context_from(self, headers: Mapping[str, str], auth: Auth) -> RequestContext:
        """Auth (raises before anything else runs), routing headers and the request id."""
        key_id = auth(headers)
        record = current_record()  # the id the access log and the worker both see
        incoming = record.request_id if record else sane_request_id(headers.get(REQUEST_ID))
        return RequestContext(
            request_id=incoming or random_hex(),
            api_key_id=key_id,
            routing_key=first_header(headers, ROUTING_KEY_HEADERS),
            target_worker=first_header(headers, TARGET_WORKER_HEADERS),
            cache_salt=self.state.auth.key_salt(key_id),
        )

    @staticmethod
    def headers_for(ctx: RequestContext) -> dict[str, str]:
        out = {REQUEST_ID: ctx.request_id}
        if ctx.worker_ids:
            out[WORKER_ID] = ",".join(dict.fromkeys(ctx.worker_ids))
        return out

    async def handle(
        self,
        request: Request,
        run: Callable[[RequestContext], Any],
        *,
        admit: bool | Literal["batch"] = False,
        auth: Auth | None = None,
    ) -> Response:
        """Run a JSON endpoint with ``auth`` (default: an inference key), admission
        (``admit``: one slot before ``run``; ``"batch"``: ``run`` calls ``ctx.reserve(k)``
        with its prompt count before any work), disconnect watch and error mapping.

        The admission slot is held until the answer is complete: for a stream, until it ends."""
        state = self.state
        ctx = RequestContext()
        tickets: list[Ticket] = []

        async def take(weight: int) -> None:
            tickets.append(await state.admission.acquire(ctx.api_key_id, weight))

        async def admitted(ctx: RequestContext) -> Any:
            if admit == "batch":
                ctx.admit = take  # the route reserves one slot per prompt once it knows the count
            elif admit:
                await take(1)
            return await run(ctx)

        result: Any = None
        try:
            ctx = self.context(request, auth or state.auth.inference)
            await buffer_body(request, self.max_body)  # before the disconnect watcher shares `receive`
            result = await unless_disconnected(request, admitted(ctx))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except GatewayError as exc:
            return error_response(exc, self.headers_for(ctx))
        except Exception as exc:  # a bug: one log line (the traceback at debug level), a 500 in the API's shape
            log.error("request %s on %s failed: %s: %s", ctx.request_id, request.url.path, type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            return error_response(GatewayError("internal server error"), self.headers_for(ctx))
        finally:
            for ticket in tickets:
                if isinstance(result, EventStream):
                    result.on_close = ticket.release
                else:
                    ticket.release()
        if isinstance(result, Response):
            result.headers.update(self.headers_for(ctx))
            return result
        return JSONResponse(result, headers=self.headers_for(ctx))

    def sse_stream(self, chunks: AsyncIterator[StreamEvent], ctx: RequestContext) -> EventStream:
        """Each typed event becomes its SSE bytes here, once."""

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    yield b"data: " + chunk.to_json() + b"\n\n"
            except GatewayError as exc:
                log.warning("request %s failed mid-stream: %s", ctx.request_id, exc.message)
                yield sse_error(exc.status, exc.message, exc.type, exc.code)
            yield DONE

        return EventStream(body(), headers=self.headers_for(ctx))
