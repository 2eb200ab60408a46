"""The gateway's gRPC port (server/grpc/server.py): both services, health per service
following the gateway's readiness, reflection, and a graceful stop."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gateway.server.grpc.server import GATEWAY_SERVICE, SCHEDULER_SERVICE, GrpcServer
from tests.server.grpc.grpc_gateway import grpc_gateway


async def test_health_follows_readiness_and_reflection_lists_the_services() -> None:
    async with grpc_gateway(workers=0) as (_, server):
        assert server.target == f"127.0.0.1:{server.port}" and server.port > 0
        async with aio.insecure_channel(server.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", GATEWAY_SERVICE, SCHEDULER_SERVICE):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING  # no worker yet
            await server.set_serving(True)
            assert (await health.Check(health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE))).status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = [r async for r in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
            names = {s.name for s in replies[0].list_services_response.service}
            assert {GATEWAY_SERVICE, SCHEDULER_SERVICE, "grpc.health.v1.Health"} <= names


async def test_a_stopped_server_refuses_calls() -> None:
    async with grpc_gateway(workers=0) as (_, server):
        target = server.target
        await server.stop(0)
        async with aio.insecure_channel(target) as channel:
            with pytest.raises(aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_ipv6_targets_are_bracketed() -> None:
    server = GrpcServer(None, "::1", 50051, None, None, None)  # type: ignore[arg-type]
    assert server.target == "[::1]:50051"
