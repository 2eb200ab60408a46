"""`token-gateway bench tracing` (gateway_lab.bench.scenarios.tracing): its OTLP receiver
counts the spans exported to it, and the off-path hook costs are measured."""

from __future__ import annotations

import argparse

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from gateway_lab.bench.scenarios import tracing as scenario


async def test_the_receiver_counts_exported_spans() -> None:
    server, port, count = await scenario.receiver()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            spans = [trace_pb2.Span(name=f"s{i}") for i in range(3)]
            request = trace_service_pb2.ExportTraceServiceRequest(
                resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=spans)])])
            await trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=5)
        assert count == [3]
    finally:
        await server.stop(0)


def test_hook_costs_and_flags() -> None:
    costs = scenario.hook_costs()
    assert set(costs) == {"TRACEPARENT.get() (worker call)", "tracing is None (per hook)"} and all(v > 0 for v in costs.values())
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args(["--requests", "10"])
    assert (args.requests, args.rounds, args.workers) == (10, 3, 2)
