"""gRPC plumbing (server/grpc/util.py): gateway errors as gRPC statuses with the OpenAI
fields in trailing metadata, the call context from metadata, admission per method, the
call's metrics record, and the client's deadline bounding worker calls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from gateway.observability.metrics import GatewayMetrics
from gateway.pipeline.deadline import request_deadline
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    PermissionDeniedError,
    QueueFullError,
    WorkerError,
)
from gateway.server.admission import Admission, AdmissionConfig
from gateway.server.grpc.util import (
    CallContextReader,
    abort_with,
    admitted,
    call_scope,
    client_deadline,
    error_metadata,
    reply_metadata,
    status_code,
)
from gateway.server.security import Authenticator, SecurityConfig


class _Context:
    """The parts of ``grpc.aio.ServicerContext`` the helpers use."""

    def __init__(self, metadata: Sequence[tuple[str, str]] = (), remaining: float | None = None) -> None:
        self.metadata = tuple(metadata)
        self.remaining = remaining
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return self.remaining

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.RpcError(details)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InvalidRequestError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (AuthenticationError("who"), grpc.StatusCode.UNAUTHENTICATED),
        (PermissionDeniedError("no"), grpc.StatusCode.PERMISSION_DENIED),
        (QueueFullError("busy"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (WorkerError("down"), grpc.StatusCode.UNAVAILABLE),
        (GatewayError("teapot", status=418), grpc.StatusCode.INVALID_ARGUMENT),
        (GatewayError("bug"), grpc.StatusCode.INTERNAL),
    ],
)
def test_statuses_mean_what_the_http_status_means(exc: GatewayError, code: grpc.StatusCode) -> None:
    assert status_code(exc) == code


async def test_errors_carry_the_openai_fields_in_trailing_metadata() -> None:
    exc = QueueFullError("busy", retry_after=0.3, param="x")
    meta = dict(error_metadata(exc))
    assert meta["x-http-status"] == "429" and meta["x-error-code"] == "queue_full" and meta["retry-after"] == "1"
    assert dict(error_metadata(InvalidRequestError("bad", param="prompt\u00e9"))).get("x-error-param") is None  # not ASCII
    ctx = _Context()
    with pytest.raises(grpc.RpcError):
        await abort_with(ctx, exc)  # type: ignore[arg-type]
    assert ctx.aborted == (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy") and ctx.trailing == error_metadata(exc)


def test_the_call_context_from_metadata() -> None:
    auth = Authenticator(["k1"], SecurityConfig(admin_api_key="adm", cache_salt_per_key=True))
    reader = CallContextReader(auth)
    meta = [("authorization", "Bearer k1"), ("x-smg-routing-key", "sess"), ("x-request-id", "rid-1"),
            ("traceparent", "00-abc-def-01"), ("x-priority", "3")]
    ctx = reader.context(_Context(meta))  # type: ignore[arg-type]
    assert (ctx.routing_key, ctx.request_id, ctx.traceparent, ctx.priority) == ("sess", "rid-1", "00-abc-def-01", 3)
    assert ctx.cache_salt == f"key:{ctx.api_key_id}"
    with pytest.raises(PermissionDeniedError):
        reader.context(_Context(meta), "admin")  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError):
        reader.context(_Context([("x-request-id", "r")]))  # type: ignore[arg-type]
    long_id = reader.context(_Context([("authorization", "Bearer k1"), ("x-request-id", "x" * 200)]))  # type: ignore[arg-type]
    assert long_id.request_id != "x" * 200


async def test_admission_per_method() -> None:
    admission = Admission(AdmissionConfig(max_concurrent_requests=4))
    ctx = RequestContext()
    async with admitted(admission, ctx, "HealthCheck"):
        assert admission.in_flight == 0  # metadata calls do not queue
    async with admitted(admission, ctx, "/sglang.runtime.v1.SglangScheduler/Generate"):
        assert admission.in_flight == 1  # the pass-through: one slot, taken at once
    batch = RequestContext()
    async with admitted(admission, batch, "Completion"):
        assert admission.in_flight == 0 and batch.admit is not None  # reserved once the batch size is known
        await batch.reserve(3)
        assert admission.in_flight == 3
    assert admission.in_flight == 0


async def test_a_call_is_counted_with_its_http_equivalent_status() -> None:
    metrics, admission = GatewayMetrics(), Admission()
    async with call_scope(metrics, admission, RequestContext(), "Tokenize", access_log=False) as record:
        record.model = "m"
    with pytest.raises(InvalidRequestError):
        async with call_scope(metrics, admission, RequestContext(), "Tokenize", access_log=False):
            raise InvalidRequestError("bad")
    with pytest.raises(asyncio.CancelledError):
        async with call_scope(metrics, admission, RequestContext(), "Generate", access_log=False):
            raise asyncio.CancelledError
    value = metrics.registry.get_sample_value
    assert value("token_gateway_requests_total", {"endpoint": "grpc Tokenize", "model": "m", "status": "200"}) == 1
    assert value("token_gateway_requests_total", {"endpoint": "grpc Tokenize", "model": "none", "status": "400"}) == 1
    assert value("token_gateway_requests_total", {"endpoint": "grpc Generate", "model": "none", "status": "499"}) == 1


def test_reply_metadata_and_the_client_deadline() -> None:
    ctx = RequestContext(request_id="r", worker_ids=["w1", "w1", "w2"])
    assert reply_metadata(ctx) == (("x-request-id", "r"), ("x-worker-id", "w1,w2"))
    with client_deadline(_Context(remaining=None)):  # type: ignore[arg-type]
        assert request_deadline.get() is None
    with client_deadline(_Context(remaining=5.0)):  # type: ignore[arg-type]
        assert request_deadline.get() is not None
    assert request_deadline.get() is None
