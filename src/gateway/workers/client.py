"""A thin async client for one SGLang `--grpc-mode` worker.

Owns the gRPC channel and nothing else: no retries, no load accounting, no
client-facing errors (those each have one home in pipeline/). Keeping it thin means
the gateway's front doors, health checks and the tokenizer fetch all share it. It is
one implementation of ``workers/transport.WorkerTransport``: a failed grpc.aio call
leaves it as a ``WorkerCallError`` (``call_error``), never as a grpc exception.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from grpc import aio

from gateway.proto import common_pb2, sglang_scheduler_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.headers import REQUEST_ID, bearer
from gateway.workers.address import BadWorkerUrl, WorkerAddress, canonical_host, parse_worker_url
from gateway.workers.h2 import H2Channel
from gateway.workers.h2.batch import BatchParser
from gateway.workers.reply_bound import (
    CONTROL_REPLY_BYTES,
    GRPC_TOO_LARGE,
    KV_EVENT_REPLY_BYTES,
    MAX_REPLY_BYTES,
    ReplyTooLarge,
    channel_bound,
    grpc_reply_bytes,
)
from gateway.workers.sglang_http_wire import without_seed
from gateway.workers.trace_context import TRACEPARENT
from gateway.workers.transport import (
    END_OF_STREAM,
    CallCode,
    EndOfStream,
    GenerateCall,
    WorkerCallError,
)

__all__ = [
    "STREAM_TRANSPORTS", "BadWorkerUrl", "TlsOptions", "WorkerAddress", "WorkerClient", "call_error",
    "canonical_host", "parse_worker_url",
]

T = TypeVar("T")
R = TypeVar("R")
_W = TypeVar("_W", bound="WorkerClient")

# Prompts of 100K+ tokens exceed gRPC's 4 MiB default on the way out; what comes back is
# bounded per call (``reply_bound``).
_MAX_SEND_BYTES = 256 * 1024 * 1024


def _channel_options(receive_bytes: int) -> list[tuple[str, int | str]]:
    """A worker channel's options, its messages in capped at ``receive_bytes``."""
    return [
        ("grpc.max_send_message_length", _MAX_SEND_BYTES),
        ("grpc.max_receive_message_length", receive_bytes),
        # Keepalive only while calls are open, and no more often than a gRPC server with
        # default settings accepts (one ping per 5 min without data): faster pings earn a
        # GOAWAY "too_many_pings". Dead idle workers are the health checks' job.
        ("grpc.keepalive_time_ms", 300_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        # gRPC's default reconnect back-off grows to 120 s; a worker that restarts should
        # be reachable again within seconds so the health checks can re-admit it.
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 5_000),
    ]


MAX_TOKENIZER_MESSAGE_BYTES = CONTROL_REPLY_BYTES
"""Largest single GetTokenizer message accepted (workers send chunks of about 1 MiB): the
control channel's bound, so one message cannot make the gateway hold hundreds of MiB
before the download's total bound (``tokenizer_fetch``) even sees it."""


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS to workers (grpcs://): a CA bundle and, for mutual TLS, a client cert and key."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same trust and client identity for the gateway's own HTTP/2 connections
        (``workers/h2``), which speak HTTP/2 only (ALPN h2)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(["h2"])
        return context


def call_error(exc: aio.AioRpcError) -> WorkerCallError:
    """A failed grpc.aio call as the gateway's own call error (the one translation); a
    message over the channel's receive bound is ``ReplyTooLarge``."""
    code = CallCode.from_number(exc.code().value[0])
    details = exc.details() or ""
    if code is CallCode.RESOURCE_EXHAUSTED and GRPC_TOO_LARGE in details:
        return ReplyTooLarge(*_sizes(details))
    return WorkerCallError(code, details)


def _sizes(details: str) -> tuple[int | None, int]:
    """(size, bound) from grpc's "Received message larger than max (SIZE vs. BOUND)"."""
    numbers = [int(n) for n in re.findall(r"\d+", details)]
    return (numbers[0], numbers[1]) if len(numbers) >= 2 else (None, numbers[0] if numbers else 0)


class _GrpcGenerateCall:
    """A grpc.aio Generate stream read through the transport's terms (the end is
    ``END_OF_STREAM``, a failure ``WorkerCallError``)."""

    __slots__ = ("_call",)

    def __init__(self, call: aio.UnaryStreamCall) -> None:
        self._call = call

    async def read(self) -> pb.GenerateResponse | EndOfStream:
        try:
            got = await self._call.read()
        except aio.AioRpcError as exc:
            raise call_error(exc) from None
        return END_OF_STREAM if got is aio.EOF else got

    def cancel(self) -> bool:
        return self._call.cancel()

    def ready(self) -> bool:
        return False  # grpc.aio cannot tell whether a message has arrived


async def _stream(call: AsyncIterator[T]) -> AsyncIterator[T]:
    """A grpc.aio server stream whose failure is a ``WorkerCallError``."""
    try:
        async for item in call:
            yield item
    except aio.AioRpcError as exc:
        raise call_error(exc) from None
    finally:
        cancel = getattr(call, "cancel", None)
        if cancel is not None:
            cancel()  # the consumer stopped early: end the call on the worker too


STREAM_TRANSPORTS = ("h2", "grpcio")
_GENERATE = "/sglang.grpc.scheduler.SglangScheduler/Generate"
_GENERATE_REPLIES = BatchParser(pb.GenerateResponse)  # one parse per socket read (h2/batch.py)


class WorkerClient:
    """Async stubs for one worker over one shared HTTP/2 channel; Generate streams over
    the gateway's own HTTP/2 connections (``workers/h2``) unless ``stream_transport`` is
    ``"grpcio"``."""

    kind = "sglang/grpc"
    lacks: frozenset[str] = frozenset()  # features of the seam this engine cannot serve
    models: tuple[str, ...] = ()  # a gRPC worker serves the one model it reports

    def __init__(
        self,
        url: str,
        *,
        tls: TlsOptions | None = None,
        api_key: str | None = None,
        stream_transport: str = "h2",
    ) -> None:
        if stream_transport not in STREAM_TRANSPORTS:
            raise ValueError(f"stream transport must be one of {STREAM_TRANSPORTS}, got {stream_transport!r}")
        self.address = parse_worker_url(url)
        self.url = self.address.url
        secure = self.address.scheme == "grpcs"
        self._tls = tls
        # Calls other than Generate: their replies are small (``CONTROL_REPLY_BYTES``).
        self._channel = self._open_channel(CONTROL_REPLY_BYTES)
        self._stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(self._channel)
        # grpc.aio bounds messages per channel: Generate and KV events run on channels
        # sized for them, opened on first use (``reply_bound.channel_bound``).
        self._bounded: dict[int, aio.Channel] = {}
        self._streams: H2Channel | None = None
        if stream_transport == "h2":
            self._streams = H2Channel(
                self.address.host, self.address.port, self.address.target,
                ssl_context=(tls or TlsOptions()).ssl_context() if secure else None,
                max_message=MAX_REPLY_BYTES,  # each call passes its own, smaller bound
            )
        self._auth: tuple[tuple[str, str], ...] = (
            (bearer(api_key),) if api_key else ()
        )
        self._options = (tls, api_key, stream_transport)

    def _open_channel(self, receive_bytes: int) -> aio.Channel:
        options = _channel_options(receive_bytes)
        if self.address.scheme == "grpcs":
            creds = (self._tls or TlsOptions()).credentials()
            return aio.secure_channel(self.address.target, creds, options=options)
        return aio.insecure_channel(self.address.target, options=options)

    def bounded_channel(self, need: int) -> aio.Channel:
        """A channel whose receive bound fits ``need`` bytes (the smallest power-of-four
        tier, ``reply_bound.channel_bound``); the control channel when that is enough."""
        bound = channel_bound(need)
        if bound <= CONTROL_REPLY_BYTES:
            return self._channel
        channel = self._bounded.get(bound)
        if channel is None:
            channel = self._bounded[bound] = self._open_channel(bound)
        return channel

    def tokenizer_channel(self) -> aio.Channel:
        """The channel GetTokenizer runs on: its messages capped at ``MAX_TOKENIZER_MESSAGE_BYTES``."""
        return self._channel

    def same_worker_as(self, kind: type[_W]) -> _W:
        """A client of another engine's service for this worker (engine detection)."""
        tls, api_key, stream_transport = self._options
        return kind(self.url, tls=tls, api_key=api_key, stream_transport=stream_transport)

    def _metadata(self, request_id: str | None = None) -> tuple[tuple[str, str], ...]:
        # gRPC refuses non-ASCII header values before sending; such an id stays in the body only.
        out = self._auth
        if request_id and request_id.isascii() and request_id.isprintable():
            out = (*out, (REQUEST_ID, request_id))
        traceparent = TRACEPARENT.get()  # None unless tracing is on
        if traceparent is not None:
            out = (*out, ("traceparent", traceparent))
        return out

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> GenerateCall:
        """Start a Generate stream; the caller reads it and may ``cancel()`` it."""
        request = without_seed(request)
        bound = grpc_reply_bytes(request)
        if self._streams is not None:
            return self._streams.unary_stream(
                _GENERATE, request.SerializeToString(), _GENERATE_REPLIES,
                timeout=timeout, metadata=self._metadata(request.request_id), max_message=bound,
            )
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(self.bounded_channel(bound))
        return _GrpcGenerateCall(stub.Generate(
            request, timeout=timeout, metadata=self._metadata(request.request_id)
        ))

    async def _unary(self, call: Awaitable[R]) -> R:
        try:
            return await call
        except aio.AioRpcError as exc:
            raise call_error(exc) from None

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        reply = await self._unary(self._stub.Abort(
            pb.AbortRequest(request_id=request_id, reason=reason),
            timeout=timeout,
            metadata=self._metadata(request_id),
        ))
        return bool(reply.success)

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        return await self._unary(self._stub.HealthCheck(
            pb.HealthCheckRequest(), timeout=timeout, metadata=self._metadata()
        ))

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        return await self._unary(self._stub.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        return await self._unary(self._stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        return await self._unary(self._stub.GetLoads(
            pb.GetLoadsRequest(include=list(include)), timeout=timeout, metadata=self._metadata()
        ))

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        return await self._unary(self._stub.Embed(
            request, timeout=timeout, metadata=self._metadata(request.request_id)
        ))

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        return await self._unary(self._stub.FlushCache(
            common_pb2.FlushCacheRequest(timeout_s=timeout_s),
            timeout=timeout,
            metadata=self._metadata(),
        ))

    async def tokenizer_zip(self, *, timeout: float = 60.0) -> tuple[bytes, str]:
        """Download the worker's tokenizer zip, bounded (``tokenizer_fetch``); raises
        ``TokenizerFetchError`` (a ValueError) if it is too large or its sha256 does not match."""
        from gateway.workers.tokenizer_fetch import DEFAULT_MAX_TOKENIZER_BYTES, fetch_tokenizer_zip

        return await fetch_tokenizer_zip(self, max_bytes=DEFAULT_MAX_TOKENIZER_BYTES, timeout=timeout)

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        """The worker's GetTokenizer stream as it comes (the gRPC pass-through relays it);
        a message over ``MAX_TOKENIZER_MESSAGE_BYTES`` fails the call (RESOURCE_EXHAUSTED)."""
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(self.tokenizer_channel())
        return _stream(stub.GetTokenizer(
            request or common_pb2.GetTokenizerRequest(), timeout=timeout, metadata=self._metadata()
        ))

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(self.bounded_channel(KV_EVENT_REPLY_BYTES))
        return _stream(stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(
                start_sequence_number=start_sequence_number, load_records_before_first_batch=True
            ),
            metadata=self._metadata(),
        ))

    async def close(self, grace: float | None = None) -> None:
        if self._streams is not None:
            await self._streams.close(grace)
        for channel in self._bounded.values():
            await channel.close(grace)
        await self._channel.close(grace)
