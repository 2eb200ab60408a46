"""gRPC plumbing shared by the two gRPC services: auth, request context, error status.

The HTTP front door's rules, in gRPC's terms: the same API keys (``authorization:
Bearer KEY`` metadata), the same routing headers (as metadata keys), and each
``GatewayError`` turned into the gRPC status code that means the same thing as its
HTTP status, with the OpenAI error fields in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Literal, Protocol

import grpc
from grpc import aio

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import RequestRecord, bind_record, log_access, unbind_record
from gateway.pipeline.deadline import request_deadline
from gateway.pipeline.request_context import RequestContext
from gateway.protocol import headers
from gateway.protocol.errors import GatewayError
from gateway.server.admission import Admission, Ticket
from gateway.server.observability import observe_request


class KeyCheck(Protocol):
    def inference(self, headers: Mapping[str, str]) -> str | None: ...
    def admin_call(self, headers: Mapping[str, str]) -> str | None: ...
    def inspector(self, headers: Mapping[str, str]) -> str | None: ...
    def key_salt(self, key: str | None) -> str | None: ...


# The role a call needs, as the HTTP routes demand it: "inference" (any key), "admin"
# (the admin key: cache flush), "inspect" (--inspect-access).
Role = Literal["inference", "admin", "inspect"]


# HTTP status of a GatewayError -> the gRPC code with the same meaning.
_STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(exc: GatewayError) -> grpc.StatusCode:
    code = _STATUS_CODES.get(exc.status)
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= exc.status < 500 else grpc.StatusCode.INTERNAL


def error_metadata(exc: GatewayError) -> tuple[tuple[str, str], ...]:
    """The OpenAI error fields as trailing metadata (ASCII-safe values only)."""
    out: list[tuple[str, str]] = [(headers.ERROR_TYPE, exc.type), (headers.HTTP_STATUS, str(exc.status))]
    if exc.code:
        out.append((headers.ERROR_CODE, str(exc.code)))
    if exc.param:
        out.append((headers.ERROR_PARAM, exc.param))
    if exc.retry_after is not None:
        out.append((headers.RETRY_AFTER, str(max(1, round(exc.retry_after)))))
    return tuple((k, v) for k, v in out if v.isascii() and v.isprintable())


async def abort_with(context: aio.ServicerContext, exc: GatewayError) -> None:
    """End the RPC with ``exc`` as its status (raises, as ``context.abort`` does)."""
    context.set_trailing_metadata(error_metadata(exc))
    await context.abort(status_code(exc), exc.message)


def _metadata(context: aio.ServicerContext) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            out.setdefault(key.lower(), value)
    return out


class CallContextReader:
    """A gRPC call's ``RequestContext`` from its metadata: the HTTP front door's key
    check (``server.security.Authenticator``), routing headers and request id."""

    def __init__(self, keys: KeyCheck) -> None:
        self.keys = keys

    def context(self, context: aio.ServicerContext, role: Role = "inference") -> RequestContext:
        """The request's context from its metadata; raises AuthenticationError (or
        PermissionDeniedError: an inference key on an admin call)."""
        meta = _metadata(context)
        check = {"inference": self.keys.inference, "admin": self.keys.admin_call, "inspect": self.keys.inspector}[role]
        ctx = RequestContext(
            api_key_id=check(meta),
            routing_key=headers.first_header(meta, headers.ROUTING_KEY_HEADERS),
            target_worker=headers.first_header(meta, headers.TARGET_WORKER_HEADERS),
            priority=headers.priority_header(meta),
        )
        ctx.traceparent = meta.get("traceparent")
        ctx.cache_salt = self.keys.key_salt(ctx.api_key_id)
        incoming = meta.get(headers.REQUEST_ID)
        if incoming and len(incoming) <= 128 and incoming.isprintable():
            ctx.request_id = incoming
        return ctx


# Calls that make a worker generate or embed, or cost a tokenization, take an admission
# slot, as their HTTP counterparts do; metadata calls do not queue.
ADMITTED_METHODS = frozenset(
    {"ChatCompletion", "Completion", "StreamChatCompletion", "StreamCompletion", "Generate", "Embed",
     "Tokenize", "Detokenize", "InspectPrefix", "CreateResponse", "StreamResponse"}
)


# Of those, the gateway API's calls that may carry a batch reserve one slot per prompt
# once the request is parsed (``RequestContext.reserve``), as the HTTP routes do.
BATCH_METHODS = frozenset(
    {"Completion", "StreamCompletion", "Generate", "Embed", "ChatCompletion", "StreamChatCompletion",
     "CreateResponse", "StreamResponse"}  # a response reserves its slot once it knows if it runs in the background
)


@contextlib.asynccontextmanager
async def admitted(admission: Admission, ctx: RequestContext, method: str) -> AsyncIterator[None]:
    """Hold an admission slot for the whole call (a stream: until it ends) when
    ``method`` generates; raises the admission errors (429/408/503 in gRPC terms)."""
    service, _, name = method.rpartition("/")
    if name not in ADMITTED_METHODS:
        yield
        return
    if service or name not in BATCH_METHODS:  # the pass-through's calls carry one prompt each
        async with admission.admit(ctx.api_key_id, 1, ctx.priority or 0):
            yield
        return
    tickets: list[Ticket] = []

    async def take(weight: int) -> None:
        tickets.append(await admission.acquire(ctx.api_key_id, weight, ctx.priority or 0))

    ctx.admit = take
    try:
        yield
    finally:
        ctx.admit = None  # a call refused before it reserved (e.g. from its prompt's length) leaves no ctx -> take -> ctx cycle
        for ticket in tickets:
            ticket.release()


@contextlib.asynccontextmanager
async def call_scope(
    metrics: GatewayMetrics, admission: Admission, ctx: RequestContext, method: str, *, access_log: bool
) -> AsyncIterator[RequestRecord]:
    """One gRPC call as the HTTP middleware sees a request: admitted, counted in
    /metrics under ``grpc METHOD`` with its HTTP-equivalent status, and access-logged."""
    record = RequestRecord(method="GRPC", path=method, request_id=ctx.request_id, endpoint=f"grpc {method}")
    token = bind_record(record)
    tracing = metrics.tracing
    span = None if tracing is None else tracing.start_request(
        record.endpoint, ctx.traceparent, {"rpc.system": "grpc", "rpc.method": method, "gateway.request_id": ctx.request_id}
    )
    try:
        async with admitted(admission, ctx, method):
            yield record
        record.status = 200
    except GatewayError as exc:
        record.status = exc.status
        raise
    except (asyncio.CancelledError, GeneratorExit):
        record.status = 499  # the client cancelled or its deadline passed
        raise
    except BaseException:
        record.status = 500
        raise
    finally:
        latency = time.perf_counter() - record.started
        observe_request(metrics, record, latency)
        if access_log:
            log_access(record, latency)
        if span is not None:
            tracing.end_request(span, status=record.status or 499, attributes={"gen_ai.request.model": record.model})  # type: ignore[union-attr]
        unbind_record(token)


def reply_metadata(ctx: RequestContext) -> tuple[tuple[str, str], ...]:
    out = [(headers.REQUEST_ID, ctx.request_id)]
    if ctx.worker_ids:
        out.append((headers.WORKER_ID, ",".join(dict.fromkeys(ctx.worker_ids))))
    return tuple((k, v) for k, v in out if v.isascii() and v.isprintable())


@contextlib.contextmanager
def client_deadline(context: aio.ServicerContext) -> Iterator[None]:
    """Let the client's gRPC deadline bound the worker calls made for this request."""
    remaining = context.time_remaining()
    if remaining is None:
        yield
        return
    token = request_deadline.set(time.monotonic() + remaining)
    try:
        yield
    finally:
        try:
            request_deadline.reset(token)
        except ValueError:  # a streaming handler finalized from another task's context
            pass
