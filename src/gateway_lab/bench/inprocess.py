"""The gateway served from this process, on this event loop, over real HTTP on loopback.

``ServeProcess`` runs the gateway as a child process, which is how it is deployed. A
benchmark that must look inside the simulated workers while the gateway routes (the
oracle reads their true caches) needs the fleet and the gateway in one process: this
starts ``GatewayState`` plus a uvicorn server on an ephemeral port and stops both.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from gateway.pipeline.router import PolicyMaker
from gateway.server.config import GatewayConfig
from gateway.server.http.acceptor import AcceptingServer
from gateway.server.http.app import create_app
from gateway.server.state import GatewayState


@dataclass(slots=True)
class InProcessGateway:
    state: GatewayState
    url: str  # http://127.0.0.1:PORT


@contextlib.asynccontextmanager
async def serve_in_process(
    config: GatewayConfig, *, policy_maker: PolicyMaker | None = None, ready_timeout_s: float = 30.0
) -> AsyncIterator[InProcessGateway]:
    """Start the gateway for ``config`` (workers from ``config.server.worker_urls``)."""
    state = GatewayState(config, policy_maker=policy_maker)
    await state.start()
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = create_app(state, manage_lifecycle=False)
        # the gateway's own accepting server: a burst of new connections is accepted in one loop turn
        server = AcceptingServer(
            uvicorn.Config(app, log_level="warning", lifespan="off", loop="none", access_log=False)
        )
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with asyncio.timeout(ready_timeout_s):
                while not server.started:
                    if task.done():
                        task.result()  # raises what stopped it
                        raise RuntimeError("in-process gateway exited before it started")
                    await asyncio.sleep(0.01)
            yield InProcessGateway(state, f"http://127.0.0.1:{port}")
        finally:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        sock.close()
        await state.stop()
