"""Worker failures as client errors (pipeline/errors.py): client faults keep the worker's
words, worker faults name the worker and the code, and each maps to its HTTP status."""

from __future__ import annotations

import pytest

from gateway.pipeline.errors import map_rpc_error, no_worker_error, worker_stalled_error
from gateway.protocol.errors import (
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
    NoWorkerError,
    ServiceUnavailableError,
    WorkerError,
)
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import CallCode, WorkerCallError


@pytest.mark.parametrize("code", [CallCode.INVALID_ARGUMENT, CallCode.OUT_OF_RANGE, CallCode.FAILED_PRECONDITION])
def test_client_faults_are_400_with_the_worker_explanation_only(code: CallCode) -> None:
    err = map_rpc_error(WorkerCallError(code, "max_new_tokens too large"), "w1")
    assert isinstance(err, InvalidRequestError) and err.status == 400
    assert err.message == "max_new_tokens too large" and err.code == "invalid_request"
    assert "w1" not in err.message  # the client is not told which worker refused


@pytest.mark.parametrize(
    ("code", "kind", "status", "client_code"),
    [
        (CallCode.NOT_FOUND, NotFoundError, 404, "not_found"),
        (CallCode.DEADLINE_EXCEEDED, GatewayTimeoutError, 504, "worker_timeout"),
        (CallCode.RESOURCE_EXHAUSTED, ServiceUnavailableError, 503, "worker_overloaded"),
        (CallCode.INTERNAL, WorkerError, 502, "worker_internal"),
        (CallCode.UNAVAILABLE, WorkerError, 502, "worker_unavailable"),
    ],
)
def test_worker_faults_name_the_worker_and_the_code(code: CallCode, kind: type, status: int, client_code: str) -> None:
    err = map_rpc_error(WorkerCallError(code, "boom"), "w1")
    assert isinstance(err, kind) and err.status == status and err.code == client_code
    assert err.message == f"worker w1: {code.name}: boom"


def test_overload_asks_the_client_to_retry_and_an_empty_message_says_the_code() -> None:
    err = map_rpc_error(WorkerCallError(CallCode.RESOURCE_EXHAUSTED), "w2")
    assert err.retry_after == 1.0 and err.message == "worker w2: RESOURCE_EXHAUSTED: RESOURCE_EXHAUSTED"


def test_a_failure_without_a_call_error_and_the_other_shapes() -> None:
    assert map_rpc_error(None, "w3").message == "worker w3: failed"
    assert map_rpc_error(None, "w3", "stream ended early").message == "worker w3: stream ended early"
    assert isinstance(no_worker_error("none healthy"), NoWorkerError)
    stalled = worker_stalled_error("w4", 2.5)
    assert isinstance(stalled, GatewayTimeoutError) and stalled.code == "worker_timeout"
    assert stalled.message == "worker w4 sent nothing for 2.5 s"


def test_a_reply_past_its_bound_is_the_workers_fault_not_its_load() -> None:
    err = map_rpc_error(ReplyTooLarge(5000, 100), "w3")
    assert isinstance(err, WorkerError) and err.status == 502 and err.code == "worker_reply_too_large"
    assert "w3" in err.message and "5000 bytes vs. 100" in err.message
