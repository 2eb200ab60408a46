"""The worker seam's own terms: call codes, the call error, the end of a stream and a refused call."""

from __future__ import annotations

import pytest

from gateway.pipeline.retry import DEFAULT_RETRY_CODES, RetryConfig
from gateway.workers.transport import (
    END_OF_STREAM,
    RETRYABLE_CODES,
    CallCode,
    EndOfStream,
    RefusedCall,
    WorkerCallError,
)


def test_codes_off_the_wire_and_unknown_numbers() -> None:
    assert CallCode.from_number(14) is CallCode.UNAVAILABLE
    assert CallCode.from_number(0) is CallCode.OK
    assert CallCode.from_number(99) is CallCode.UNKNOWN
    assert CallCode.from_number(-1) is CallCode.UNKNOWN


@pytest.mark.parametrize(
    ("code", "retryable", "rejected"),
    [
        (CallCode.UNAVAILABLE, True, False),
        (CallCode.CANCELLED, True, False),
        (CallCode.INVALID_ARGUMENT, False, True),
        (CallCode.OUT_OF_RANGE, False, True),
        (CallCode.NOT_FOUND, False, False),
        (CallCode.DEADLINE_EXCEEDED, False, False),
    ],
)
def test_the_call_error_says_whether_to_retry_and_whose_fault(code: CallCode, retryable: bool, rejected: bool) -> None:
    err = WorkerCallError(code, "the worker's words")
    assert (err.code, err.message) == (code, "the worker's words")
    assert err.retryable is retryable and err.rejected is rejected
    assert str(err) == f"{code.name}: the worker's words"
    assert str(WorkerCallError(code)) == code.name


def test_retry_codes_keep_their_names_and_map_onto_the_codes() -> None:
    assert DEFAULT_RETRY_CODES == ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNKNOWN", "CANCELLED"]
    assert [CallCode[name] for name in DEFAULT_RETRY_CODES] == list(RETRYABLE_CODES)
    only = RetryConfig(retry_codes=["UNAVAILABLE"])
    assert only.retryable(CallCode.UNAVAILABLE) and not only.retryable(CallCode.INTERNAL)
    assert not only.retryable(None)


def test_the_end_of_a_stream_is_one_marker() -> None:
    assert isinstance(END_OF_STREAM, EndOfStream) and repr(END_OF_STREAM) == "END_OF_STREAM"
    assert not isinstance(END_OF_STREAM, BaseException)


async def test_a_refused_call_raises_its_reason_at_the_first_read_and_cannot_be_cancelled() -> None:
    why = WorkerCallError(CallCode.UNIMPLEMENTED, "takes text only")
    call = RefusedCall(why)
    with pytest.raises(WorkerCallError) as caught:
        await call.read()
    assert (caught.value.code, caught.value.message) == (why.code, why.message) and call.cancel() is False
    # a new error each read: the call does not hold the one raised (nor, through its
    # traceback, the reader's frame)
    assert caught.value is not why and why.__traceback__ is None
