#!/usr/bin/env python
"""What tracing and the per-token metrics cost the gateway: CPU per request, off vs on.

    token-gateway bench tracing --requests 300 --rounds 3

A zero-cost simulated fleet (one child process) and two ``token-gateway serve``
children on it: one without tracing, one with ``--otlp-traces-endpoint`` pointed at an
OTLP TraceService receiver that runs in this process (spans really are built, batched
and exported). Batches of streamed chat requests alternate between the two gateways
(``--rounds`` times each, so drift on a shared machine hits both); the figure is each
gateway's CPU seconds (from /proc) per request. A second section times the hooks the
pipeline calls when tracing is off, per call, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit

import grpc
import httpx

from gateway_lab.bench.machine import cpu_seconds, describe
from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SubprocessFleet

ZERO = SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


async def receiver() -> tuple[grpc.aio.Server, int, list[int]]:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    count = [0]

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        async def Export(self, request, context):  # type: ignore[no-untyped-def]
            count[0] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, count


async def batch(url: str, n: int, concurrency: int, tokens: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]

        async def one(i: int) -> None:
            body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"request {i}: say something"}],
                    "chat_template_kwargs": {"enable_thinking": False}}
            async with sem, http.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass
                assert r.status_code == 200

        await asyncio.gather(*(one(i) for i in range(n)))


def hook_costs() -> dict[str, float]:
    from gateway.observability.metrics import GatewayMetrics
    from gateway.workers.trace_context import TRACEPARENT

    m = GatewayMetrics()
    n = 200_000
    out = {
        "TRACEPARENT.get() (worker call)": timeit.timeit(TRACEPARENT.get, number=n) / n * 1e9,
        "tracing is None (per hook)": timeit.timeit(lambda: m.tracing is not None, number=n) / n * 1e9,
    }
    return out


async def measure(args: argparse.Namespace) -> None:
    print(describe())
    fleet = SubprocessFleet(args.workers, ZERO).start()
    server, port, spans = await receiver()
    off = await ServeProcess.start(fleet.urls, "round_robin", extra_args=["--no-access-log", "--log-level", "warning"])
    on = await ServeProcess.start(fleet.urls, "round_robin", extra_args=[
        "--no-access-log", "--log-level", "warning", "--otlp-traces-endpoint", f"127.0.0.1:{port}"])
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for proc in (off, on):  # warm-up: templates compiled, connections open
            await batch(proc.url, 20, args.concurrency, args.tokens)
        for _ in range(args.rounds):
            for name, proc in (("off", off), ("on", on)):
                pid = proc.process.pid
                before = cpu_seconds(pid)
                t0 = time.perf_counter()
                await batch(proc.url, args.requests, args.concurrency, args.tokens)
                wall = time.perf_counter() - t0
                used = cpu_seconds(pid) - before
                cpu[name].append(used / args.requests * 1e6)
                print(f"  {name:3} {args.requests} requests: {used:.2f} s CPU, {wall:.2f} s wall")
        await asyncio.sleep(2.5)  # the last span batch
    finally:
        await off.stop()
        await on.stop()
        await server.stop(0)
        fleet.stop()
    off_us, on_us = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print(f"gateway CPU per streamed request ({args.tokens} tokens): tracing off {off_us:.0f} us, "
          f"on {on_us:.0f} us (x{on_us / off_us:.2f}); spans received: {spans[0]}")
    for name, ns in hook_costs().items():
        print(f"  off path: {name}: {ns:.0f} ns")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    asyncio.run(measure(args))
    return 0
