"""`token-gateway serve --grpc-port 0`: a real gateway process over in-process sims."""

from __future__ import annotations

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.client import GatewayClient, user
from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet


@pytest.mark.slow
async def test_serve_prints_grpc_port_and_serves_both_doors(tmp_path: object) -> None:
    async with SimFleet.start(2, SimConfig().zero_cost()) as fleet:
        served = await ServeProcess.start(
            fleet.urls, "cache_aware",
            extra_args=["--grpc-port", "0", "--tokenizer-cache-dir", str(tmp_path)],
        )
        try:
            port = served.ready_info["grpc_port"]
            assert isinstance(port, int) and port > 0
            target = served.ready_info["grpc_target"]
            async with aio.insecure_channel(target) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            async with GatewayClient(target) as client:
                answer = await client.chat([user("hello")], max_tokens=3)
                assert answer.usage.completion_tokens == 3 and answer.worker_ids
                assert len(await client.list_workers()) == 2
        finally:
            assert await served.stop() == 0
