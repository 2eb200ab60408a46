"""The in-process stack of tests/e2e/http (uvicorn gateway + simulated fleet) plus its gRPC port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.client import GatewayClient
from gateway.server.grpc.server import GrpcServer, start_grpc_server
from tests.e2e.http.conftest import Stack, StackOptions, start_stack


@dataclass
class GrpcStack:
    http: Stack
    grpc: GrpcServer
    client: GatewayClient

    @property
    def target(self) -> str:
        return self.grpc.target

    @property
    def model(self) -> str:
        return self.http.model


@contextlib.asynccontextmanager
async def start_grpc_stack(opts: StackOptions, tmp_path: Any, *, api_key: str | None = None) -> AsyncIterator[GrpcStack]:
    async with start_stack(opts, tmp_path) as stack:
        server = await start_grpc_server(stack.state, "127.0.0.1", 0)
        keys = opts.server.get("api_keys") or []
        client = GatewayClient(server.target, api_key=api_key if api_key is not None else (keys[0] if keys else None), timeout=30)
        try:
            yield GrpcStack(stack, server, client)
        finally:
            await client.close()
            await server.stop(0)


@pytest.fixture
async def gstack(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[GrpcStack]:
    marker = request.node.get_closest_marker("stack")
    # An indirect parametrization's options (``request.param``) win over the marker's.
    opts = StackOptions(**{**(marker.kwargs if marker else {}), **getattr(request, "param", {})})
    async with start_grpc_stack(opts, tmp_path) as s:
        yield s
