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

from gateway_lab.bench import launch
from gateway_lab.bench.machine import cpu_seconds
from gateway_lab.bench.results import Result, Table, write


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


async def measure(args: argparse.Namespace) -> Result:
    result = Result()
    quiet = ["--no-access-log", "--log-level", "warning"]
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    server, port, spans = await receiver()
    try:
        async with (
            launch.fleet("process", args.workers, launch.ZERO_COST) as fleet,
            launch.gateway("ours", fleet.urls, "round_robin", extra_args=quiet) as off,
            launch.gateway(
                "ours", fleet.urls, "round_robin", extra_args=[*quiet, "--otlp-traces-endpoint", f"127.0.0.1:{port}"]
            ) as on,
        ):
            for gw in (off, on):  # warm-up: templates compiled, connections open
                await batch(gw.url, 20, args.concurrency, args.tokens)
            for _ in range(args.rounds):
                for name, gw in (("off", off), ("on", on)):
                    before = cpu_seconds(gw.pid)
                    t0 = time.perf_counter()
                    await batch(gw.url, args.requests, args.concurrency, args.tokens)
                    wall = time.perf_counter() - t0
                    used = cpu_seconds(gw.pid) - before
                    cpu[name].append(used / args.requests * 1e6)
                    print(f"  {name:3} {args.requests} requests: {used:.2f} s CPU, {wall:.2f} s wall")
            await asyncio.sleep(2.5)  # the last span batch
    finally:
        await server.stop(0)
    off_us, on_us = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    result.tables.append(Table.of(
        f"gateway CPU per streamed request ({args.tokens} tokens), median of {args.rounds} rounds",
        ["tracing off, us", "tracing on, us", "on / off", "spans received"],
        [[f"{off_us:.0f}", f"{on_us:.0f}", f"{on_us / off_us:.2f}", str(spans[0])]], labels=0,
    ))  # fmt: skip
    hooks = hook_costs()
    result.tables.append(Table.of("the off path, per call", ["hook", "ns"], [[k, f"{v:.0f}"] for k, v in hooks.items()], labels=1))
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    return write(asyncio.run(measure(args)))
