"""What the gateway needs from a connection to one worker, engine-neutral.

``WorkerTransport`` names the calls; ``WorkerCallError`` and ``END_OF_STREAM`` are
how every implementation reports a failed call and the end of a Generate stream.
The SGLang gRPC client (``workers/client.py``: grpc.aio, and the gateway's own
HTTP/2 reader in ``workers/h2``) is one implementation and the in-memory fake of the
tests is another; each translates its own failures into these at its edge, so
dispatch, the lease, retries and stall handling above ``workers/`` never see an
engine's or a library's exception types (as httpx's ``_transports/base.py`` keeps
HTTP libraries out of its client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from enum import IntEnum
from typing import Final, Protocol

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.address import WorkerAddress


class CallCode(IntEnum):
    """Why a worker call failed: the canonical status set (names and numbers as gRPC's,
    the vocabulary every engine's API maps onto; ``--retry-codes`` names them)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @classmethod
    def from_number(cls, number: int) -> CallCode:
        """A status number off the wire; one this set does not know is UNKNOWN (a dict
        read: every call's trailers carry one, and ``cls(number)`` runs the enum's
        lookup in two Python calls)."""
        return _BY_NUMBER.get(number, CallCode.UNKNOWN)


_BY_NUMBER: Final = {code.value: code for code in CallCode}


# Codes that say "this worker could not take the request", not "the request is bad".
# CANCELLED is the worker's side cancelling (a server going down resets its streams):
# the gateway's own cancels surface as asyncio.CancelledError, never as this code.
RETRYABLE_CODES: Final = (
    CallCode.UNAVAILABLE, CallCode.RESOURCE_EXHAUSTED, CallCode.ABORTED,
    CallCode.INTERNAL, CallCode.UNKNOWN, CallCode.CANCELLED,
)
# The worker refused the request itself: it is healthy, the request is bad.
REJECTED_CODES: Final = frozenset((CallCode.INVALID_ARGUMENT, CallCode.OUT_OF_RANGE))


class WorkerCallError(Exception):
    """A call to a worker failed: the status ``code`` and the worker's ``message``."""

    __slots__ = ("code", "message")

    def __init__(self, code: CallCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        """Whether, by default, another worker may be tried (``RetryConfig`` decides)."""
        return self.code in RETRYABLE_CODES

    @property
    def rejected(self) -> bool:
        """The worker refused the request as bad (no fault of the worker's)."""
        return self.code in REJECTED_CODES


class EndOfStream:
    """The type of :data:`END_OF_STREAM` (one instance; compare with ``is``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END_OF_STREAM"


END_OF_STREAM: Final = EndOfStream()


class GenerateCall(Protocol):
    """One open Generate stream: read messages until ``END_OF_STREAM``, or cancel it.

    ``read()`` raises :class:`WorkerCallError` when the call fails; ``cancel()`` makes
    a pending ``read()`` raise ``asyncio.CancelledError``."""

    async def read(self) -> pb.GenerateResponse | EndOfStream: ...

    def cancel(self) -> bool: ...

    def ready(self) -> bool:
        """``read()`` would return (or raise) without waiting; False when the transport
        cannot tell. The relay hands the tokens that arrived together over in one batch."""
        ...


class RefusedCall:
    """The Generate call of a request a worker cannot serve: its first read raises why
    (a new error each time: one kept here would hold, through its traceback, the frame
    that holds this call, a cycle)."""

    __slots__ = ("_error",)

    def __init__(self, error: WorkerCallError) -> None:
        self._error = error

    async def read(self) -> pb.GenerateResponse | EndOfStream:
        raise WorkerCallError(self._error.code, self._error.message)

    def cancel(self) -> bool:
        return False

    def ready(self) -> bool:
        return False  # its one read fails before any relay asks


class WorkerTransport(Protocol):
    """The calls the gateway makes on one worker; each raises :class:`WorkerCallError`."""

    @property
    def url(self) -> str: ...

    @property
    def kind(self) -> str:
        """``engine/transport`` (``sglang/grpc``, ``sglang/http``): what GET /workers shows."""
        ...

    @property
    def address(self) -> WorkerAddress: ...

    @property
    def lacks(self) -> frozenset[str]:
        """Features of the seam this engine cannot serve: shown in GET /workers, and a
        request that needs one fails as INVALID_ARGUMENT naming it, never silently."""
        ...

    @property
    def models(self) -> tuple[str, ...]:
        """The models the worker lists itself (an OpenAI backend's ``/v1/models``); empty
        for a worker that serves the one model it reports."""
        ...

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> GenerateCall: ...

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool: ...

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse: ...

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse: ...

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse: ...

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse: ...

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse: ...

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse: ...

    async def tokenizer_zip(self, *, timeout: float = 60.0) -> tuple[bytes, str]: ...

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]: ...

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]: ...

    async def close(self, grace: float | None = None) -> None: ...
