"""The gateway served from this process (gateway_lab/bench/inprocess.py): state and a
uvicorn server on an ephemeral loopback port, both stopped on exit (no workers here: the
whole-stack runs are the benchmarks' own)."""

from __future__ import annotations

import httpx
import pytest

from gateway.server.config import GatewayConfig
from gateway_lab.bench.inprocess import serve_in_process


async def test_the_gateway_answers_on_loopback_until_the_context_ends() -> None:
    async with serve_in_process(GatewayConfig()) as gw:
        assert gw.url.startswith("http://127.0.0.1:") and not gw.state.ready  # no worker listed
        async with httpx.AsyncClient(base_url=gw.url) as client:
            assert (await client.get("/health")).json() == {"status": "ok"}
            assert (await client.get("/readiness")).status_code == 503
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=gw.url) as client:
            await client.get("/health")
