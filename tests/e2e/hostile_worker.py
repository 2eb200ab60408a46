"""A hostile worker: a simulated worker whose answers lie, over real gRPC on loopback.

It serves everything as the simulator does except what its ``HostilePlan`` replaces:
Generate may send more tokens than asked (whole or streamed), never end, or send ids
outside the vocabulary; GetTokenizer may send chunks of the plan's making. The
gateway in front of it is a real one (``hostile_stack``), on a real HTTP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import uvicorn

from gateway.proto import common_pb2, sglang_scheduler_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.http.guard import http_server_config
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.servicer import SimServicer
from gateway_lab.sim.worker import SimWorker

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
    def __init__(self, worker: SimWorker, plan: HostilePlan) -> None:
        super().__init__(worker)
        self.plan = plan

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
        ids = [plan.token_id] * plan.flood_tokens
        plan.sent[-1] = len(ids)
        if request.stream:
            step = plan.chunk_tokens
            for start in range(0, len(ids), step):
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                    token_ids=ids[start:start + step], prompt_tokens=prompt, completion_tokens=start + step))
        complete = pb.GenerateComplete(output_ids=ids, finish_reason="length", prompt_tokens=prompt, completion_tokens=len(ids))
        if plan.padding:
            complete.matched_stop_str = "x" * plan.padding
        yield pb.GenerateResponse(complete=complete)

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
    """The hostile worker's URL while the block runs."""
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


@dataclass
class Gateway:
    state: GatewayState
    url: str
    http: httpx.AsyncClient
    client: openai.AsyncOpenAI

    @property
    def model(self) -> str:
        return self.state.catalog.names()[0]


@contextlib.asynccontextmanager
async def gateway(worker_urls: list[str], cache: Path, **server: Any) -> AsyncIterator[Gateway]:
    """A real gateway on a loopback HTTP port in front of ``worker_urls``."""
    config = GatewayConfig(server=ServerConfig(worker_urls=worker_urls, tokenizer_cache_dir=str(cache), **server))
    state = GatewayState(config)
    await state.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv = uvicorn.Server(http_server_config(create_app(state, manage_lifecycle=False), config.http))
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    for _ in range(500):
        if uv.started:
            break
        await asyncio.sleep(0.01)
    http = httpx.AsyncClient(base_url=url, timeout=30)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    try:
        yield Gateway(state, url, http, client)
    finally:
        await client.close()
        await http.aclose()
        uv.should_exit = True
        await task
        await state.stop()


@contextlib.asynccontextmanager
async def health_probe(url: str, every_s: float = 0.02) -> AsyncIterator[list[float]]:
    """Poll ``url``/health on its own connection while the block runs; the list gets each
    answer's latency in seconds (a probe that got no answer counts its whole wait)."""
    latencies: list[float] = []

    async def poll() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as probe:
            while True:
                started = time.perf_counter()
                try:
                    await probe.get("/health")
                finally:
                    latencies.append(time.perf_counter() - started)
                await asyncio.sleep(every_s)

    task = asyncio.create_task(poll())
    try:
        await asyncio.sleep(every_s)
        yield latencies
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
