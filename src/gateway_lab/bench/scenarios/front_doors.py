"""Relay overhead and throughput of the gateway's front doors, over a zero-cost worker.

Starts one simulated worker (every step cost 0, no EOS: outputs are exactly
``max_tokens`` long, one token per streamed chunk) and one gateway process
(``token-gateway serve --grpc-port 0 --policy round_robin``), then drives the
same token-id prompt through each door from this process:

* ``worker``       Generate straight to the worker: the floor, no gateway at all
* ``passthrough``  SglangScheduler.Generate on the gateway's gRPC port (raw relay)
* ``grpc``         token_gateway.v1 Completion / StreamCompletion (detokenized, stop-checked)
* ``http``         POST /v1/completions (JSON or SSE), the same pipeline over HTTP

Phase 1 (latency): one request at a time, short outputs, the doors taking turns
request by request; the overhead of a door is its latency minus the worker's.
Phase 2 (throughput): many concurrent callers with longer outputs, streamed and
whole, in rounds with the doors taking turns; tokens/s at the client and the
gateway process's CPU time per token and per request (the steadier figure on a
shared machine). Every phase is bounded by a request count and a time cap.

    token-gateway bench front-doors            # defaults below
    token-gateway bench front-doors --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench import launch, results
from gateway_lab.bench.machine import cpu_seconds
from gateway_lab.sim.config import SimConfig

PROMPT = list(range(1000, 1064))  # 64 ordinary token ids
DOORS = ("worker", "passthrough", "grpc", "http")

# A door runs one request: (request number, stream?, max tokens) -> tokens received.
Door = Callable[[int, bool, int], Awaitable[int]]






def scheduler_door(stub: pb_grpc.SglangSchedulerStub, prefix: str) -> Door:
    async def run(i: int, stream: bool, max_tokens: int) -> int:
        request = pb.GenerateRequest(
            request_id=f"{prefix}-{i}-{time.monotonic_ns()}", tokenized=pb.TokenizedInput(input_ids=PROMPT),
            sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=max_tokens, ignore_eos=True),
            stream=stream,
        )
        tokens = 0
        async for reply in stub.Generate(request):
            if reply.HasField("chunk"):
                tokens += len(reply.chunk.token_ids)
            elif not stream:
                tokens += len(reply.complete.output_ids)
        return tokens

    return run


def grpc_door(stub: gpb_grpc.TokenGatewayStub) -> Door:
    async def run(i: int, stream: bool, max_tokens: int) -> int:
        request = gpb.CompletionRequest(
            token_ids=gpb.TokenIds(ids=PROMPT), sampling=gpb.Sampling(max_tokens=max_tokens, ignore_eos=True),
        )
        if not stream:
            reply = await stub.Completion(request)
            return int(reply.usage.completion_tokens)
        request.stream_options.include_usage = True
        tokens = 0
        async for chunk in stub.StreamCompletion(request):
            if chunk.HasField("usage"):
                tokens = chunk.usage.completion_tokens
        return tokens

    return run


def http_door(client: httpx.AsyncClient) -> Door:
    async def run(i: int, stream: bool, max_tokens: int) -> int:
        body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
        if not stream:
            reply = await client.post("/v1/completions", content=orjson.dumps(body), headers={"content-type": "application/json"})
            reply.raise_for_status()
            return int(orjson.loads(reply.content)["usage"]["completion_tokens"])
        body["stream_options"] = {"include_usage": True}
        tokens = 0
        async with client.stream("POST", "/v1/completions", content=orjson.dumps(body), headers={"content-type": "application/json"}) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    usage = orjson.loads(line[6:]).get("usage")
                    if usage:
                        tokens = usage["completion_tokens"]
        return tokens

    return run


async def latency_phase(doors: dict[str, Door], *, stream: bool, requests: int, max_tokens: int, cap_s: float) -> dict[str, dict[str, float]]:
    """One request at a time, the doors taking turns (so a busy machine slows them alike)."""
    for door in doors.values():
        for i in range(5):  # warm up channels, caches and the tokenizer
            await door(-i - 1, stream, max_tokens)
    samples: dict[str, list[float]] = {name: [] for name in doors}
    deadline = time.perf_counter() + cap_s
    for i in range(requests):
        if time.perf_counter() > deadline:
            break
        for name, door in doors.items():
            t0 = time.perf_counter()
            got = await door(i, stream, max_tokens)
            samples[name].append(time.perf_counter() - t0)
            if got != max_tokens:
                raise RuntimeError(f"{name}: expected {max_tokens} tokens, got {got}")
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {
            "requests": len(values),
            "mean_ms": round(1e3 * statistics.fmean(values), 3),
            "p50_ms": round(1e3 * values[len(values) // 2], 3),
            "p99_ms": round(1e3 * values[min(len(values) - 1, int(len(values) * 0.99))], 3),
        }
    return out


async def throughput_burst(door: Door, *, stream: bool, concurrency: int, requests: int, max_tokens: int, cap_s: float, gateway_pid: int | None) -> tuple[int, int, float, float]:
    """(requests, tokens, wall seconds, gateway CPU seconds) of one burst of concurrent callers."""
    started = done = tokens = 0
    deadline = time.perf_counter() + cap_s

    async def caller() -> None:
        nonlocal started, done, tokens
        while started < requests and time.perf_counter() < deadline:
            started += 1
            got = await door(started, stream, max_tokens)  # not `tokens += await ...`: that reads tokens before the await
            tokens += got
            done += 1

    cpu0 = cpu_seconds(gateway_pid) if gateway_pid else 0.0
    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(gateway_pid) - cpu0 if gateway_pid else 0.0
    return done, tokens, wall, cpu


async def throughput_phase(doors: dict[str, Door], *, stream: bool, rounds: int, gateway_pid: int, **burst: Any) -> dict[str, dict[str, float]]:
    """``rounds`` bursts per door, the doors taking turns; totals over the rounds."""
    totals = {name: [0, 0, 0.0, 0.0] for name in doors}
    for _ in range(rounds):
        for name, door in doors.items():
            pid = None if name == "worker" else gateway_pid
            for i, value in enumerate(await throughput_burst(door, stream=stream, gateway_pid=pid, **burst)):
                totals[name][i] += value
    out: dict[str, dict[str, float]] = {}
    for name, (done, tokens, wall, cpu) in totals.items():
        row = {
            "requests": done, "tokens": tokens, "seconds": round(wall, 3),
            "requests_per_s": round(done / wall, 1), "tokens_per_s": round(tokens / wall, 1),
        }
        if name != "worker":
            row["gateway_cpu_us_per_token"] = round(1e6 * cpu / max(1, tokens), 1)
            row["gateway_cpu_ms_per_request"] = round(1e3 * cpu / max(1, done), 3)
        out[name] = row
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = SimConfig(eos_probability=0.0, max_running_requests=256, kv_capacity_tokens=1 << 20).zero_cost()
    figures: dict[str, Any] = {"latency": {}, "throughput": {}}
    async with (
        launch.fleet("process", 1, config) as fleet,
        launch.gateway("ours", fleet.urls, "round_robin", extra_args=["--grpc-port", "0", "--log-level", "warning"]) as served,
    ):
        gateway_pid = served.pid
        limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
        async with (
            aio.insecure_channel(fleet.urls[0].removeprefix("grpc://")) as worker_channel,
            aio.insecure_channel(served.ready_info["grpc_target"]) as gateway_channel,
            httpx.AsyncClient(base_url=served.url, limits=limits, timeout=60) as http,
        ):
            doors: dict[str, Door] = {
                "worker": scheduler_door(pb_grpc.SglangSchedulerStub(worker_channel), "w"),
                "passthrough": scheduler_door(pb_grpc.SglangSchedulerStub(gateway_channel), "p"),
                "grpc": grpc_door(gpb_grpc.TokenGatewayStub(gateway_channel)),
                "http": http_door(http),
            }
            chosen = {name: doors[name] for name in args.doors}
            for stream in (False, True):
                mode = "stream" if stream else "unary"
                rows = await latency_phase(
                    chosen, stream=stream, requests=args.latency_requests, max_tokens=args.latency_tokens, cap_s=args.cap_s,
                )
                for name, row in rows.items():
                    figures["latency"][f"{name}/{mode}"] = row
                    print(f"latency    {name}/{mode:14s} {row}", file=sys.stderr, flush=True)
            for stream in (True, False):
                mode = "stream" if stream else "unary"
                rows = await throughput_phase(
                    chosen, stream=stream, rounds=args.rounds, gateway_pid=gateway_pid,
                    concurrency=args.concurrency, requests=args.throughput_requests,
                    max_tokens=args.throughput_tokens, cap_s=args.cap_s,
                )
                for name, row in rows.items():
                    figures["throughput"][f"{name}/{mode}"] = row
                    print(f"throughput {name}/{mode:14s} {row}", file=sys.stderr, flush=True)
    return figures


def report(figures: dict[str, Any], args: argparse.Namespace) -> results.Result:
    """The latency and throughput tables in the common result format (the JSON keeps
    ``latency``, ``throughput`` and the flags)."""
    lat = figures["latency"]
    latency_rows = []
    for key, row in lat.items():
        name, mode = key.split("/")
        base = lat.get(f"worker/{mode}")
        over = f"{row['p50_ms'] - base['p50_ms']:+.2f} ms" if base and name != "worker" else "-"
        latency_rows.append((name, mode, f"{row['mean_ms']:.2f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", over))
    throughput_rows = []
    for key, row in figures["throughput"].items():
        name, mode = key.split("/")
        cpu = row.get("gateway_cpu_us_per_token")
        per_req = row.get("gateway_cpu_ms_per_request")
        throughput_rows.append((name, mode, f"{row['requests_per_s']:.1f}", f"{row['tokens_per_s']:.0f}",
                                cpu if cpu is not None else "-", per_req if per_req is not None else "-"))  # fmt: skip
    latency = results.Table.of(
        f"latency, one request at a time, 64-token prompt, {args.latency_tokens} output tokens",
        ("door", "mode", "mean ms", "p50 ms", "p99 ms", "overhead vs worker (p50)"), latency_rows,
    )  # fmt: skip
    throughput = results.Table.of(
        f"throughput, {args.concurrency} concurrent callers x {args.throughput_tokens} tokens, {args.rounds} rounds x "
        f"{args.throughput_requests} requests per door (streams: one token per chunk)",
        ("door", "mode", "requests/s", "tokens/s", "gateway CPU us/token", "gateway CPU ms/request"), throughput_rows,
    )  # fmt: skip
    return results.Result(tables=[latency, throughput], data={"args": vars(args), **figures})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--doors", nargs="+", choices=DOORS, default=list(DOORS))
    parser.add_argument("--latency-requests", type=int, default=300, help="latency phase: requests per door and mode")
    parser.add_argument("--latency-tokens", type=int, default=8, help="latency phase: output tokens")
    parser.add_argument("--throughput-requests", type=int, default=192, help="throughput phase: requests per door and round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput phase: bursts per door, the doors taking turns")
    parser.add_argument("--throughput-tokens", type=int, default=128, help="throughput phase: output tokens per request")
    parser.add_argument("--concurrency", type=int, default=32, help="throughput phase: concurrent streams")
    parser.add_argument("--cap-s", type=float, default=60.0, help="time cap per phase and door, seconds")
    parser.add_argument("--json", help="also write the figures to this file")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    figures = asyncio.run(run(args))
    return results.write(report(figures, args), json_path=args.json or "")
