"""What the gateway needs from a connection to one worker, as a Protocol.

``WorkerClient`` (gRPC, ``workers/client.py``) is the one real implementation.
Naming the surface lets dispatch, the lease, retries and stall handling be unit
tested against an in-memory transport without sockets (as httpx's
``_transports/base.py`` does for HTTP), and keeps what pipeline/ may ask of a
worker explicit. Errors are gRPC's: a failed call raises ``grpc.aio.AioRpcError``,
the end of a Generate stream is ``grpc.aio.EOF``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.client import WorkerAddress


class GenerateCall(Protocol):
    """One open Generate stream: read messages until ``grpc.aio.EOF``, or cancel it.

    ``cancel()`` makes a pending ``read()`` raise ``asyncio.CancelledError``."""

    async def read(self) -> Any: ...  # pb.GenerateResponse, or grpc.aio.EOF at the end

    def cancel(self) -> bool: ...


class WorkerTransport(Protocol):
    """The calls the gateway makes on one worker (SglangScheduler RPCs)."""

    @property
    def url(self) -> str: ...

    @property
    def address(self) -> WorkerAddress: ...

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
