"""`token-gateway bench front-doors` (gateway_lab.bench.scenarios.front_doors): each door
reaches the gateway's pipeline and counts the tokens it got back, the latency phase
takes turns between doors, and the report's tables."""

from __future__ import annotations

import argparse

import httpx
from grpc import aio

from gateway.proto import gateway_pb2_grpc as gpb_grpc
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.server.http.app import create_app
from gateway_lab.bench.scenarios import front_doors as scenario
from tests.server.grpc.grpc_gateway import grpc_gateway


async def test_every_door_counts_the_tokens_of_a_streamed_answer() -> None:
    async with grpc_gateway() as (state, server), aio.insecure_channel(server.target) as channel:
        app = create_app(state, manage_lifecycle=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            doors = {
                "passthrough": scenario.scheduler_door(pb_grpc.SglangSchedulerStub(channel), "p"),
                "grpc": scenario.grpc_door(gpb_grpc.TokenGatewayStub(channel)),
                "http": scenario.http_door(http),
            }
            # the in-memory worker answers one token per request
            latency = await scenario.latency_phase(doors, stream=True, requests=2, max_tokens=1, cap_s=10)
            assert set(latency) == {"passthrough", "grpc", "http"} and all(row["requests"] == 2 for row in latency.values())
            assert await doors["http"](0, False, 1) == 1 and await doors["grpc"](0, False, 1) == 1
        sent = state.transports["grpc://w1:1"].requests  # type: ignore[attr-defined]
        assert len(sent) == 3 * (5 + 2) + 2 and all(list(r.tokenized.input_ids)[-64:] == scenario.PROMPT for r in sent)


def test_the_report_tables() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args([])
    row = {"mean_ms": 2.0, "p50_ms": 1.5, "p99_ms": 3.0}
    results = {
        "latency": {"worker/stream": row, "http/stream": {**row, "p50_ms": 2.5}},
        "throughput": {"http/stream": {"requests_per_s": 10.0, "tokens_per_s": 320.0, "gateway_cpu_us_per_token": 50.0}},
    }
    latency, throughput = scenario.report(results, args).tables
    assert latency.rows == (("worker", "stream", "2.00", "1.50", "3.00", "-"), ("http", "stream", "2.00", "2.50", "3.00", "+1.00 ms"))
    assert throughput.rows == (("http", "stream", "10.0", "320", "50.0", "-"),)
