"""The one place that turns worker failures into client-facing errors."""

from __future__ import annotations

from gateway.protocol.errors import (
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
    NoWorkerError,
    ServiceUnavailableError,
    WorkerError,
)
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import CallCode, WorkerCallError

_CLIENT_FAULTS = {CallCode.INVALID_ARGUMENT, CallCode.OUT_OF_RANGE, CallCode.FAILED_PRECONDITION}


def map_rpc_error(exc: WorkerCallError | None, worker_id: str, message: str | None = None) -> GatewayError:
    """A worker's failed call as the error the client sees.

    The worker's own words are kept for client faults (they explain what to fix);
    for worker faults the client learns which worker and which code.
    """
    if exc is None:
        return WorkerError(f"worker {worker_id}: {message or 'failed'}")
    code = exc.code
    detail = exc.message or code.name
    if code in _CLIENT_FAULTS:
        return InvalidRequestError(detail, code="invalid_request")
    where = f"worker {worker_id}: {code.name}: {detail}"
    if code is CallCode.NOT_FOUND:
        return NotFoundError(where)
    if code is CallCode.DEADLINE_EXCEEDED:
        return GatewayTimeoutError(where, code="worker_timeout")
    if isinstance(exc, ReplyTooLarge):  # the worker's fault, not its load
        return WorkerError(where, code="worker_reply_too_large")
    if code is CallCode.RESOURCE_EXHAUSTED:
        return ServiceUnavailableError(where, code="worker_overloaded", retry_after=1.0)
    return WorkerError(where, code=f"worker_{code.name.lower()}")


def no_worker_error(message: str) -> GatewayError:
    return NoWorkerError(message)


def worker_stalled_error(worker_id: str, seconds: float) -> GatewayError:
    return GatewayTimeoutError(f"worker {worker_id} sent nothing for {seconds:g} s", code="worker_timeout")
