"""A ``WorkerTransport`` for vLLM's gRPC engine service (``grpc://`` workers of vLLM).

vLLM serves the same shape of service as SGLang's ``--grpc-mode`` (``VllmEngine``:
Generate, Abort, GetLoads, GetTokenizer, SubscribeKvEvents, ...), so the gateway
routes on the same token ids and runs the same control plane over it; this client
is the SGLang client's channel, streams and errors with vLLM's service path, and
every message translated in ``vllm_grpc_wire``. What the service has no field for
is in ``lacks`` (GET /workers shows it); a request that needs one of those fails
with a 400 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway.proto import common_pb2, vllm_engine_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import vllm_engine_pb2 as vpb
from gateway.workers import vllm_grpc_wire as wire
from gateway.workers.client import WorkerClient, _GrpcGenerateCall, _stream
from gateway.workers.h2.batch import BatchParser
from gateway.workers.reply_bound import KV_EVENT_REPLY_BYTES, grpc_reply_bytes
from gateway.workers.transport import (
    END_OF_STREAM,
    EndOfStream,
    GenerateCall,
    RefusedCall,
    WorkerCallError,
)

_GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
_REPLIES = BatchParser(vpb.GenerateResponse)


class _TranslatedCall:
    """A vLLM Generate stream read as the seam's messages."""

    __slots__ = ("_call", "_reader")

    def __init__(self, call: Any, reader: wire.ReplyReader) -> None:
        self._call = call
        self._reader = reader

    async def read(self) -> pb.GenerateResponse | EndOfStream:
        got = await self._call.read()
        if got is END_OF_STREAM:
            return END_OF_STREAM
        return self._reader.read(got)

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def ready(self) -> bool:
        """The inner call's answer: each vLLM reply reads as exactly one message, so the
        relay can hand the tokens that arrived together over in one batch."""
        return bool(self._call.ready())


class VllmGrpcClient(WorkerClient):
    """The worker seam over one vLLM gRPC server."""

    kind = "vllm/grpc"
    lacks = frozenset(wire.LACKS)

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._engine = vllm_engine_pb2_grpc.VllmEngineStub(self._channel)
        self._started = wire.StartClock()

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> GenerateCall:
        missing = wire.lacking(request)
        if missing:
            return RefusedCall(wire.refusal(self.kind, self.url, missing))
        sent = wire.generate_request(request)
        metadata = self._metadata(request.request_id)
        reader = wire.ReplyReader(request)
        bound = grpc_reply_bytes(request)  # vLLM's rows are the same ids and floats
        if self._streams is not None:
            call: Any = self._streams.unary_stream(
                _GENERATE, sent.SerializeToString(), _REPLIES, timeout=timeout, metadata=metadata, max_message=bound,
            )
        else:
            engine = vllm_engine_pb2_grpc.VllmEngineStub(self.bounded_channel(bound))
            call = _GrpcGenerateCall(engine.Generate(sent, timeout=timeout, metadata=metadata))
        return _TranslatedCall(call, reader)

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        await self._unary(self._engine.Abort(
            vpb.AbortRequest(request_ids=[request_id]), timeout=timeout, metadata=self._metadata(request_id),
        ))
        return True  # vLLM's reply says nothing: an unknown id is no error there

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        reply = await self._unary(self._engine.HealthCheck(
            vpb.HealthCheckRequest(), timeout=timeout, metadata=self._metadata()
        ))
        return pb.HealthCheckResponse(healthy=reply.healthy, message=reply.message)

    async def _model_info(self, timeout: float) -> vpb.GetModelInfoResponse:
        return await self._unary(self._engine.GetModelInfo(
            vpb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))

    async def _loads(self, timeout: float, include: Sequence[str] = ("core",)) -> vpb.GetLoadsResponse:
        return await self._unary(self._engine.GetLoads(
            vpb.GetLoadsRequest(include=list(include)), timeout=timeout, metadata=self._metadata()
        ))

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        return wire.model_info(await self._model_info(timeout))

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        """Server info with the model's name and context and, from GetLoads, the KV pool."""
        reply = await self._unary(self._engine.GetServerInfo(
            vpb.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))
        model = await self._model_info(timeout)
        try:
            kv_tokens = wire.kv_pool_tokens(await self._loads(timeout))
        except WorkerCallError:
            kv_tokens = 0  # unknown: the cache-aware budget falls back as for any worker
        return wire.server_info(reply, model, kv_tokens, self._started.observe(reply.uptime_seconds))

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        return wire.loads(await self._loads(timeout, include))

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        reply = await self._unary(self._engine.Embed(
            wire.embed_request(request), timeout=timeout, metadata=self._metadata(request.request_id)
        ))
        return wire.embed_response(reply)

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        return await self._unary(self._engine.FlushCache(
            common_pb2.FlushCacheRequest(timeout_s=timeout_s), timeout=timeout, metadata=self._metadata(),
        ))

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(self.tokenizer_channel())  # messages capped (WorkerClient)
        return _stream(stub.GetTokenizer(
            request or common_pb2.GetTokenizerRequest(), timeout=timeout, metadata=self._metadata()
        ))

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        engine = vllm_engine_pb2_grpc.VllmEngineStub(self.bounded_channel(KV_EVENT_REPLY_BYTES))
        return _stream(engine.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(
                start_sequence_number=start_sequence_number, load_records_before_first_batch=True
            ),
            metadata=self._metadata(),
        ))


__all__ = ["VllmGrpcClient"]
