"""The one place that turns worker failures into client-facing errors."""

from __future__ import annotations

import grpc
from grpc import aio

from gateway.protocol.errors import (
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
    NoWorkerError,
    ServiceUnavailableError,
    WorkerError,
)

_CLIENT_FAULTS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION}


def map_rpc_error(exc: aio.AioRpcError | None, worker_id: str, message: str | None = None) -> GatewayError:
    """A worker's gRPC failure as the error the client sees.

    The worker's own words are kept for client faults (they explain what to fix);
    for worker faults the client learns which worker and which code.
    """
    if exc is None:
        return WorkerError(f"worker {worker_id}: {message or 'failed'}")
    code = exc.code()
    detail = exc.details() or code.name
    if code in _CLIENT_FAULTS:
        return InvalidRequestError(detail, code="invalid_request")
    where = f"worker {worker_id}: {code.name}: {detail}"
    if code is grpc.StatusCode.NOT_FOUND:
        return NotFoundError(where)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return GatewayTimeoutError(where, code="worker_timeout")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ServiceUnavailableError(where, code="worker_overloaded", retry_after=1.0)
    return WorkerError(where, code=f"worker_{code.name.lower()}")


def no_worker_error(message: str) -> GatewayError:
    return NoWorkerError(message)


def worker_stalled_error(worker_id: str, seconds: float) -> GatewayError:
    return GatewayTimeoutError(f"worker {worker_id} sent nothing for {seconds:g} s", code="worker_timeout")
