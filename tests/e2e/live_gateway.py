"""A real gateway on a loopback HTTP port, in this process, for whole-stack tests that
need its state at hand (the hostile-worker tests put ``gateway_lab.sim.hostile`` workers
behind it), and a /health poller that runs while a test attacks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.http.guard import http_server_config
from gateway.server.state import GatewayState


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
