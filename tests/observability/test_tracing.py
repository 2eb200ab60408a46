"""OpenTelemetry tracing against a real OTLP gRPC receiver run in this test process.

The receiver implements ``opentelemetry.proto``'s TraceService on 127.0.0.1; the
gateway exports to it; a simulated worker behind a server interceptor records the
metadata of the Generate calls it gets (where the ``traceparent`` must arrive).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from gateway.client import GatewayClient
from gateway.observability.tracing import TracingConfig
from gateway.proto import sglang_scheduler_pb2_grpc
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.grpc.server import start_grpc_server
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.servicer import SimServicer
from gateway_lab.sim.worker import SimWorker
from tests.e2e.http.conftest import ZERO_COST, _serve

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    async def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class MetadataRecorder(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self.generate_metadata: list[dict[str, str]] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        if details.method.endswith("/Generate"):
            self.generate_metadata.append({k: v for k, v in details.invocation_metadata})
        return await continuation(details)


async def _start_recorded_worker(recorder: MetadataRecorder) -> tuple[SimWorker, grpc.aio.Server]:
    worker = SimWorker(SimConfig(**ZERO_COST))
    server = grpc.aio.server(interceptors=[recorder])
    sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(SimServicer(worker), server)
    worker.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    worker._server = server
    worker._task = asyncio.create_task(worker.scheduler.run())
    return worker, server


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[Receiver, MetadataRecorder, GatewayState, str, str]]:
    receiver = Receiver()
    collector = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, collector)
    port = collector.add_insecure_port("127.0.0.1:0")
    await collector.start()
    recorder = MetadataRecorder()
    worker, _ = await _start_recorded_worker(recorder)
    config = GatewayConfig(
        server=ServerConfig(worker_urls=[worker.url], tokenizer_cache_dir=str(tmp_path / "tok")),
        tracing=TracingConfig(otlp_traces_endpoint=f"127.0.0.1:{port}"),
    )
    state = GatewayState(config)
    await state.start()
    http_server, task, url = await _serve(state)
    grpc_front = await start_grpc_server(state)
    try:
        yield receiver, recorder, state, url, grpc_front.target
    finally:
        await grpc_front.stop(0)
        http_server.should_exit = True
        await task
        await state.stop()  # flushes the spans
        await worker.stop(0.1)
        await collector.stop(0)


def _by_trace(receiver: Receiver, trace_id: str) -> list[Any]:
    return [s for s in receiver.spans if s.trace_id.hex() == trace_id]


async def test_spans_continue_the_client_trace_and_reach_the_worker(traced: Any) -> None:
    receiver, recorder, state, url, grpc_target = traced
    model = state.catalog.names()[0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/chat/completions", headers={"traceparent": TRACEPARENT},
                            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                  "stream": True, "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200
        assert (await http.get("/health")).status_code == 200  # probes make no spans
    async with GatewayClient(grpc_target) as client:
        await client.complete("hello", model=model, max_tokens=3,
                              metadata=[("traceparent", f"00-{'ab' * 16}-{'cd' * 8}-01")])
    await asyncio.to_thread(state.tracing.provider.force_flush, 5000)  # the exporter blocks: not on the loop
    deadline = time.monotonic() + 10
    while len(_by_trace(receiver, "ab" * 16)) < 4 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)

    spans = _by_trace(receiver, CLIENT_TRACE)
    names = {s.name for s in spans}
    assert {"POST /v1/chat/completions", "template", "tokenize", "select", "dispatch", "relay"} <= names, names
    root = next(s for s in spans if s.name == "POST /v1/chat/completions")
    assert root.parent_span_id.hex() == CLIENT_PARENT  # continues the client's trace
    assert root.kind == root.SPAN_KIND_SERVER
    for child in spans:
        if child is not root:
            assert child.parent_span_id == root.span_id, child.name
            assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
            assert child.end_time_unix_nano <= root.end_time_unix_nano + 5_000_000
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["http.route"].string_value == "/v1/chat/completions"
    assert attrs["gateway.worker"].string_value == state.registry.all()[0].id
    assert not any(s.name.endswith("/health") for s in receiver.spans)

    # The worker got the request span's context: same trace, the root span as parent.
    sent = [m["traceparent"] for m in recorder.generate_metadata if "traceparent" in m]
    assert f"00-{CLIENT_TRACE}-{root.span_id.hex()}-01" in sent

    grpc_spans = _by_trace(receiver, "ab" * 16)
    grpc_root = next(s for s in grpc_spans if s.name == "grpc Completion")
    assert grpc_root.parent_span_id.hex() == "cd" * 8
    assert {"tokenize", "select", "dispatch"} <= {s.name for s in grpc_spans}
    assert any(t.startswith(f"00-{'ab' * 16}-{grpc_root.span_id.hex()}") for t in sent)


async def test_without_a_client_trace_a_new_one_starts(traced: Any) -> None:
    receiver, recorder, state, url, _ = traced
    model = state.catalog.names()[0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
    await asyncio.to_thread(state.tracing.provider.force_flush, 5000)  # the exporter blocks: not on the loop
    roots = [s for s in receiver.spans if s.name == "POST /v1/completions"]
    assert len(roots) == 1 and not roots[0].parent_span_id
    assert recorder.generate_metadata[-1]["traceparent"].split("-")[1] == roots[0].trace_id.hex()


def test_off_by_default() -> None:
    from gateway.observability.tracing import make_tracing
    from gateway.workers.trace_context import TRACEPARENT

    assert make_tracing(TracingConfig()) is None
    assert TRACEPARENT.get() is None
