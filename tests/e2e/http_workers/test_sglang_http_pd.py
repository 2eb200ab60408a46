"""Prefill/decode pairs of simulated SGLang *HTTP* workers behind the gateway: the
bootstrap host, port and room go in both JSON bodies, and the decode worker answers only
after meeting its prefill partner in that room (so an answer proves the pairing)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

import openai
import uvicorn

from gateway.pipeline.pd import PdWorkerSpec
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.http.guard import http_server_config
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.http_server import SimHttpWorker

ZERO_COST = SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


@contextlib.asynccontextmanager
async def pd_stack(tmp_path: Any) -> AsyncIterator[tuple[list[SimHttpWorker], openai.AsyncOpenAI, GatewayState]]:
    workers = [SimHttpWorker(dataclasses.replace(ZERO_COST, role=role)) for role in ("prefill", "decode")]
    try:
        for w in workers:
            await w.start()
        config = GatewayConfig(server=ServerConfig(worker_urls=[], tokenizer_cache_dir=str(tmp_path / "tok")))
        config.pd.prefill = [PdWorkerSpec(workers[0].url)]
        config.pd.decode = [PdWorkerSpec(workers[1].url)]
        state = GatewayState(config)
        await state.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(http_server_config(create_app(state, manage_lifecycle=False), state.config.http))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none", max_retries=0, timeout=30,
        )
        try:
            yield workers, client, state
        finally:
            await client.close()
            server.should_exit = True
            await task
            await state.stop()
    finally:
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


async def test_pd_pairs_of_http_workers_meet_in_the_same_room(tmp_path: Any) -> None:
    async with pd_stack(tmp_path) as (workers, client, state):
        model = state.catalog.names()[0]
        for stream in (False, True):
            created = await client.completions.create(
                model=model, prompt="a prefill and a decode worker", max_tokens=8, stream=stream,
                extra_body={"ignore_eos": True},
            )
            if stream:
                text = "".join([c.choices[0].text async for c in created if c.choices])  # type: ignore[union-attr]
            else:
                text = created.choices[0].text  # type: ignore[union-attr]
            assert text
        prefill, decode = (w.worker.counters for w in workers)
        assert prefill.requests == 2 and decode.requests == 2
        assert decode.pd_rendezvous_ok == 2
