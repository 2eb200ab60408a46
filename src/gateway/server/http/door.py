"""What every HTTP route shares: auth, the request context and its response headers.

The inference routes run on ``server.http.inference``'s path, which owns admission,
the disconnect watch and SSE; the FastAPI routes that answer a small JSON body
(``/v1/models``, parse) run through ``HttpDoor.handle``. Both build the request context
and the response headers here, and answer errors with ``util.error_response``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

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
    priority_header,
)
from gateway.protocol.ids import random_hex
from gateway.server.http.util import ClientGone, JSONResponse, error_response
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
        self.max_values = state.config.server.max_body_values  # JSON values a body may hold (``util.check_values``)

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
            priority=priority_header(headers),
        )

    @staticmethod
    def headers_for(ctx: RequestContext) -> dict[str, str]:
        out = {REQUEST_ID: ctx.request_id}
        if ctx.worker_ids:
            out[WORKER_ID] = ",".join(dict.fromkeys(ctx.worker_ids))
        return out

    async def handle(self, request: Request, run: Callable[[RequestContext], Any], *, auth: Auth | None = None) -> Response:
        """Run a small JSON route with ``auth`` (default: an inference key) and the error
        mapping. Its body, if any, is read by ``run`` (``util.read_json``)."""
        ctx = RequestContext()
        try:
            ctx = self.context(request, auth or self.state.auth.inference)
            result = await run(ctx)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except GatewayError as exc:
            return error_response(exc, self.headers_for(ctx))
        except Exception as exc:  # a bug: one log line (the traceback at debug level), a 500 in the API's shape
            log.error("request %s on %s failed: %s: %s", ctx.request_id, request.url.path, type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            return error_response(GatewayError("internal server error"), self.headers_for(ctx))
        if isinstance(result, Response):
            result.headers.update(self.headers_for(ctx))
            return result
        return JSONResponse(result, headers=self.headers_for(ctx))
