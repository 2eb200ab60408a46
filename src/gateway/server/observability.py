"""HTTP side of observability: per-request record, metrics, access log, ``/metrics``.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which buffers
streaming bodies through a task group) wraps every request: it settles the
request id (a sane incoming ``X-Request-Id`` or a fresh one), times the request
and its first streamed event, and when the last byte is sent records the
outcome under bounded labels and writes the access-log line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.observability.metrics import CONTENT_TYPE_LATEST, NO_MODEL, GatewayMetrics
from gateway.observability.request_log import (
    RequestRecord,
    bind_record,
    log_access,
    sane_request_id,
    unbind_record,
)
from gateway.protocol.errors import GatewayError
from gateway.protocol.headers import REQUEST_ID
from gateway.protocol.ids import random_hex

_REQUEST_ID = REQUEST_ID.encode()  # ASGI header names are bytes

UNMATCHED = "other"  # endpoint label for paths no route matched (404s): keeps labels bounded
QUIET_PATHS = frozenset({"/metrics", "/health", "/readiness"})  # scraped often: no access line


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(method=scope["method"], path=scope["path"])
        incoming = None
        for name, value in scope.get("headers", ()):
            if name == _REQUEST_ID:
                incoming = sane_request_id(value.decode("latin-1"))
                break
        record.request_id = incoming or random_hex()
        streaming = False

        async def send_wrapper(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = message.get("headers", [])
                named = False
                for k, v in headers:  # one pass: is the id there, is it a stream
                    k = k.lower()
                    if k == _REQUEST_ID:
                        named = True
                    elif k == b"content-type" and v.startswith(b"text/event-stream"):
                        streaming = True
                if not named:
                    message = {**message, "headers": [*headers, (_REQUEST_ID, record.request_id.encode())]}
            elif streaming and record.ttft_s is None and message.get("body"):
                record.ttft_s = time.perf_counter() - record.started
            await send(message)

        token = bind_record(record)
        tracing = self.metrics.tracing
        span = None
        if tracing is not None and record.path not in QUIET_PATHS:
            traceparent = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"traceparent"), None)
            span = tracing.start_request(
                f"{record.method} {record.path}", traceparent,
                {"http.request.method": record.method, "url.path": record.path, "gateway.request_id": record.request_id},
            )
        self.metrics.in_flight_add(1)
        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            if not record.status:
                record.status = 500
            raise
        finally:
            self.metrics.in_flight_add(-1)
            latency = time.perf_counter() - record.started
            route = scope.get("route")
            record.endpoint = getattr(route, "path", None) or UNMATCHED
            observe_request(self.metrics, record, latency)
            if self.access_log and record.path not in QUIET_PATHS:
                log_access(record, latency)
            if span is not None:
                tracing.end_request(  # type: ignore[union-attr]
                    span, name=f"{record.method} {record.endpoint}", status=record.status or 499,
                    attributes={"http.route": record.endpoint, "gen_ai.request.model": record.model},
                )
            unbind_record(token)



def observe_request(m: GatewayMetrics, record: RequestRecord, latency: float) -> None:
    """Count one finished request (HTTP or gRPC) under bounded labels."""
    status = str(record.status or 499)  # no response started: the client left first
    m.recorder(m.requests, record.endpoint, record.model or NO_MODEL, status).inc()
    m.recorder(m.latency, record.endpoint).observe(latency)
    if record.ttft_s is not None:
        m.recorder(m.ttft, record.endpoint).observe(record.ttft_s)


def install_observability(
    app: FastAPI, metrics: GatewayMetrics, *, access_log: bool = True,
    guard: Callable[[Mapping[str, str]], None] | None = None,
) -> None:
    """Add the middleware and ``GET /metrics`` (Prometheus text format) to ``app``;
    ``guard`` checks a scrape's headers (the series name workers and their addresses)."""
    app.add_middleware(ObservabilityMiddleware, metrics=metrics, access_log=access_log)

    async def scrape(request: Request) -> Response:
        if guard is not None:
            try:
                guard(request.headers)
            except GatewayError as exc:
                return Response(orjson.dumps(exc.to_dict()), status_code=exc.status, media_type="application/json")
        body = metrics.render()
        if metrics.federate is not None:  # one of serve --processes N: answer for the whole set
            body = await metrics.federate(body)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", scrape, methods=["GET"], include_in_schema=False)
