"""A ``WorkerTransport`` for TensorRT-LLM's gRPC service (``grpc://`` workers of TensorRT-LLM).

TensorRT-LLM serves the same Generate shape as SGLang's ``--grpc-mode`` (``TrtllmService``:
token ids in, token ids out), so the gateway routes on the same ids; this client is
the SGLang client's channel, streams and errors with TensorRT-LLM's service path, and
every message translated in ``trtllm_grpc_wire``. The service has no GetLoads and no
FlushCache: those calls fail as UNIMPLEMENTED and ``lacks`` says so (GET /workers),
and the policies see the gateway's own in-flight counts as the worker's load.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway.proto import common_pb2, trtllm_service_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import trtllm_service_pb2 as tpb
from gateway.workers import trtllm_grpc_wire as wire
from gateway.workers.client import WorkerClient, _GrpcGenerateCall, _stream
from gateway.workers.h2.batch import BatchParser
from gateway.workers.reply_bound import KV_EVENT_REPLY_BYTES, grpc_reply_bytes
from gateway.workers.transport import (
    END_OF_STREAM,
    CallCode,
    EndOfStream,
    GenerateCall,
    RefusedCall,
    WorkerCallError,
)

SERVICE = tpb.DESCRIPTOR.services_by_name["TrtllmService"].full_name
_GENERATE = f"/{SERVICE}/Generate"
_REPLIES = BatchParser(tpb.GenerateResponse)


class _TranslatedCall:
    """A TensorRT-LLM Generate stream read as the seam's messages (a reply may make none or two)."""

    __slots__ = ("_call", "_pending", "_reader")

    def __init__(self, call: Any, reader: wire.ReplyReader) -> None:
        self._call = call
        self._reader = reader
        self._pending: deque[pb.GenerateResponse] = deque()

    async def read(self) -> pb.GenerateResponse | EndOfStream:
        while not self._pending:
            got = await self._call.read()
            if got is END_OF_STREAM:
                return END_OF_STREAM
            self._pending.extend(self._reader.read(got))
        return self._pending.popleft()

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def ready(self) -> bool:
        """A translated message is waiting, or the inner call has a reply (or its end). A
        reply that reads as no message (TensorRT-LLM's "nothing yet") makes this True
        while ``read`` then waits for the next reply: the relay's batch goes out with that
        reply instead of before the wait (late, never lost)."""
        return bool(self._pending) or bool(self._call.ready())


class TrtllmGrpcClient(WorkerClient):
    """The worker seam over one TensorRT-LLM gRPC server."""

    kind = "trtllm/grpc"
    lacks = frozenset(wire.LACKS) - {"logit_bias"}  # a logit bias works once the vocabulary is known

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._engine = trtllm_service_pb2_grpc.TrtllmServiceStub(self._channel)
        self._max_seq_len = 0  # learned from GetModelInfo: the limit of a request with none
        self._vocab_size = 0

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> GenerateCall:
        missing = wire.lacking(request, self._vocab_size)
        if missing:
            return RefusedCall(wire.refusal(self.kind, self.url, missing))
        try:
            sent = wire.generate_request(request, self._max_seq_len, self._vocab_size)
        except WorkerCallError as exc:
            return RefusedCall(exc)
        metadata = self._metadata(request.request_id)
        reader = wire.ReplyReader(request)
        bound = grpc_reply_bytes(request)  # TensorRT-LLM's rows are the same ids and floats
        if self._streams is not None:
            call: Any = self._streams.unary_stream(
                _GENERATE, sent.SerializeToString(), _REPLIES, timeout=timeout, metadata=metadata, max_message=bound,
            )
        else:
            engine = trtllm_service_pb2_grpc.TrtllmServiceStub(self.bounded_channel(bound))
            call = _GrpcGenerateCall(engine.Generate(sent, timeout=timeout, metadata=metadata))
        return _TranslatedCall(call, reader)

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        reply = await self._unary(self._engine.Abort(
            tpb.AbortRequest(request_id=request_id), timeout=timeout, metadata=self._metadata(request_id),
        ))
        return bool(reply.success)

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        return wire.healthy(await self._unary(self._engine.HealthCheck(
            tpb.HealthCheckRequest(), timeout=timeout, metadata=self._metadata()
        )))

    async def _model_info(self, timeout: float) -> tpb.GetModelInfoResponse:
        reply: tpb.GetModelInfoResponse = await self._unary(self._engine.GetModelInfo(
            tpb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))
        self._max_seq_len = max(0, reply.max_seq_len)
        self._vocab_size = max(0, reply.vocab_size)
        return reply

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        return wire.model_info(await self._model_info(timeout))

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        reply = await self._unary(self._engine.GetServerInfo(
            tpb.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata()
        ))
        return wire.server_info(reply, await self._model_info(timeout))

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "TensorRT-LLM's gRPC service has no GetLoads")

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        reply = await self._unary(self._engine.Embed(
            wire.embed_request(request), timeout=timeout, metadata=self._metadata(request.request_id)
        ))
        return wire.embed_response(reply)

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "TensorRT-LLM's gRPC service has no FlushCache")

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        stub = trtllm_service_pb2_grpc.TrtllmServiceStub(self.tokenizer_channel())  # messages capped (WorkerClient)
        return _stream(stub.GetTokenizer(
            request or common_pb2.GetTokenizerRequest(), timeout=timeout, metadata=self._metadata()
        ))

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        engine = trtllm_service_pb2_grpc.TrtllmServiceStub(self.bounded_channel(KV_EVENT_REPLY_BYTES))
        return _stream(engine.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(
                start_sequence_number=start_sequence_number, load_records_before_first_batch=True
            ),
            metadata=self._metadata(),
        ))


__all__ = ["SERVICE", "TrtllmGrpcClient"]
