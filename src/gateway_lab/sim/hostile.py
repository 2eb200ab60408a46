"""A hostile worker: a simulated worker whose answers lie, over real gRPC on loopback.

It serves everything as the simulator does except what its ``HostilePlan`` replaces:
Generate may send more tokens than asked (whole or streamed), never end, send ids
outside the vocabulary or one oversized message; GetTokenizer may send chunks of the
plan's making. The gateway's hostile-worker tests and ``token-gateway bench hostile``
put a real gateway in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from gateway.proto import common_pb2, sglang_scheduler_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.servicer import SimServicer
from gateway_lab.sim.worker import SimWorker

# no step costs: what is measured is the gateway against the lies, not simulated GPU time
ZERO_COST = dict(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


@dataclass
class HostilePlan:
    """What the worker does instead of behaving. Zero/None fields: behave."""

    flood_tokens: int = 0  # answer every Generate with this many tokens, whatever was asked
    endless: bool = False  # stream one token every ``gap_s`` until cancelled
    gap_s: float = 0.001
    chunk_tokens: int = 1000  # tokens per streamed chunk of a flood
    padding: int = 0  # bytes of matched_stop_str the flood's complete carries (a large message, cheap to build)
    token_id: int = 100  # the id it sends (an id past the vocabulary makes an OOV worker)
    tokenizer_chunks: Callable[[], Iterable[common_pb2.GetTokenizerChunk]] | None = None
    sent: list[int] = field(default_factory=list)  # tokens sent per Generate call


class HostileServicer(SimServicer):
    """The simulator's SGLang service with Generate and GetTokenizer as the plan says."""

    def __init__(self, worker: SimWorker, plan: HostilePlan) -> None:
        super().__init__(worker)
        self.plan = plan
        # A flood's messages, built once here: turning hundreds of thousands of ids into a
        # message costs the worker tens of ms of CPU, and in a test that hosts worker and
        # gateway in one process that time would be charged to the gateway's /health.
        self._flood_chunks: list[pb.GenerateResponse] = []
        self._flood_complete = pb.GenerateResponse()
        if plan.flood_tokens:
            ids = [plan.token_id] * plan.flood_tokens
            step = plan.chunk_tokens
            self._flood_chunks = [
                pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                    token_ids=ids[start:start + step], completion_tokens=start + step))
                for start in range(0, len(ids), step)
            ]  # fmt: skip
            complete = self._flood_complete.complete
            complete.output_ids.extend(ids)
            complete.finish_reason = "length"
            complete.completion_tokens = len(ids)
            if plan.padding:
                complete.matched_stop_str = "x" * plan.padding

    @staticmethod
    def _for(template: pb.GenerateResponse, part: str, prompt: int) -> pb.GenerateResponse:
        """A copy of a prebuilt message with this request's prompt count (a C-level copy)."""
        msg = pb.GenerateResponse()
        msg.CopyFrom(template)
        getattr(msg, part).prompt_tokens = prompt
        return msg

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        plan = self.plan
        if not (plan.flood_tokens or plan.endless):
            async for response in super().Generate(request, context):
                yield response
            return
        prompt = len(request.tokenized.input_ids)
        plan.sent.append(0)
        if plan.endless:
            while True:
                plan.sent[-1] += 1
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                    token_ids=[plan.token_id], prompt_tokens=prompt, completion_tokens=plan.sent[-1]))
                await asyncio.sleep(plan.gap_s)
        plan.sent[-1] = plan.flood_tokens
        if request.stream:
            for chunk in self._flood_chunks:
                yield self._for(chunk, "chunk", prompt)
        yield self._for(self._flood_complete, "complete", prompt)

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        if self.plan.tokenizer_chunks is None:
            async for chunk in super().GetTokenizer(request, context):
                yield chunk
            return
        for chunk in self.plan.tokenizer_chunks():
            yield chunk
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def hostile_worker(plan: HostilePlan, **sim: Any) -> AsyncIterator[str]:
    """The hostile worker's URL while the block runs; ``sim`` sets ``SimConfig`` fields
    (zero step costs unless given). It may send messages of up to 256 MiB, as SGLang's
    server may."""
    worker = SimWorker(SimConfig(**{**ZERO_COST, **sim}))
    await worker.start()  # its scheduler runs what the plan leaves to it
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 256 << 20)])
    sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(HostileServicer(worker, plan), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        await server.stop(None)
        await worker.stop(None)
