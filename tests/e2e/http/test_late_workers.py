"""A gateway started before its listed workers does not exit: it retries them in the
background, /readiness says whom it waits for, and they join once they are up."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.worker import SimWorker
from tests.e2e.http.conftest import ZERO_COST
from tests.e2e.live_gateway import gateway


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_worker_that_comes_up_later_joins(tmp_path: Path) -> None:
    port = _free_port()
    url = f"grpc://127.0.0.1:{port}"
    async with gateway([url], tmp_path / "tok", probe_timeout_s=1.0) as gw:
        ready = await gw.http.get("/readiness")
        assert ready.status_code == 503 and url in ready.json()["error"]["message"]
        assert (await gw.http.get("/health")).status_code == 200
        worker = SimWorker(SimConfig(**ZERO_COST))
        await worker.start(port=port)
        try:
            for _ in range(200):
                if (await gw.http.get("/readiness")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await gw.http.get("/readiness")).status_code == 200
            ok = await gw.client.completions.create(model=gw.model, prompt="hi", max_tokens=2)
            assert ok.choices
            assert gw.state.late.describe() == []
        finally:
            await worker.stop(None)


async def test_worker_startup_timeout_waits_for_them(tmp_path: Path) -> None:
    port = _free_port()
    worker = SimWorker(SimConfig(**ZERO_COST))

    async def late_start() -> None:
        await asyncio.sleep(0.8)
        await worker.start(port=port)

    starting = asyncio.create_task(late_start())
    try:
        async with gateway([f"grpc://127.0.0.1:{port}"], tmp_path / "tok", worker_startup_timeout_s=20.0) as gw:
            assert [w.url for w in gw.state.registry.all()] == [f"grpc://127.0.0.1:{port}"]  # there before ready
    finally:
        await starting
        await worker.stop(None)
