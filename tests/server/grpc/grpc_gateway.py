"""A gateway's gRPC port over in-memory workers, for the unit tests of the gRPC door and
the Python client (the state of ``tests.server.http.gateway_app``, one fake worker)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.server.config import GatewayConfig
from gateway.server.grpc.server import GrpcServer, start_grpc_server
from gateway.server.state import GatewayState
from tests.server.http.gateway_app import gateway


@asynccontextmanager
async def grpc_gateway(config: GatewayConfig | None = None, *, workers: int = 1) -> AsyncIterator[tuple[GatewayState, GrpcServer]]:
    async with gateway(config) as (state, _):
        for i in range(workers):
            await state.add_worker(f"grpc://w{i + 1}:1")
        server = await start_grpc_server(state, "127.0.0.1", 0)
        try:
            yield state, server
        finally:
            await server.stop(0)
