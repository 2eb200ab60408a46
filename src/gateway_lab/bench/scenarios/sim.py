"""Raw capacity of one simulated worker (zero step costs), over loopback gRPC.

Starts ``token-gateway sim-worker`` as a subprocess with every cost at 0 and
drives it from this process with a grpc.aio client:

* unary: non-streaming Generate calls per second (small prompt, few tokens),
  from ``--concurrency`` concurrent callers;
* stream: streamed tokens per second (streaming Generate, long outputs),
  from ``--streams`` concurrent streams.

Both phases are bounded by a call/token count and a time cap. Prints the
figures (``--json`` writes them too). Run:

    token-gateway bench sim
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from typing import Any

import grpc

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench import launch, results
from gateway_lab.bench.machine import cpu_seconds
from gateway_lab.sim.config import SimConfig


def make_request(rid: str, prompt: list[int], max_new: int, stream: bool) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(
            temperature=1.0, n=1, max_new_tokens=max_new, ignore_eos=True
        ),
        stream=stream,
    )


async def unary_phase(
    stub: pb_grpc.SglangSchedulerStub, calls: int, concurrency: int, max_new: int, cap_s: float
) -> dict[str, float]:
    prompt = list(range(1000, 1016))
    started = done = 0
    deadline = time.perf_counter() + cap_s

    async def caller(k: int) -> None:
        nonlocal started, done
        while started < calls and time.perf_counter() < deadline:
            started += 1
            async for _ in stub.Generate(make_request(f"u{k}-{started}", prompt, max_new, False)):
                pass
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"calls": done, "seconds": round(wall, 3), "calls_per_s": round(done / wall, 1)}


async def stream_phase(
    stub: pb_grpc.SglangSchedulerStub, streams: int, tokens_each: int, cap_s: float
) -> dict[str, float]:
    prompt = list(range(2000, 2064))
    received = 0
    chunks = 0
    deadline = time.perf_counter() + cap_s

    async def one(k: int) -> None:
        nonlocal received, chunks
        call = stub.Generate(make_request(f"s{k}", prompt, tokens_each, True))
        async for r in call:
            if r.WhichOneof("response") == "chunk":
                received += len(r.chunk.token_ids)
                chunks += 1
            if time.perf_counter() > deadline:
                call.cancel()
                break

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(streams)))
    wall = time.perf_counter() - t0
    return {
        "streams": streams,
        "tokens": received,
        "chunks": chunks,
        "seconds": round(wall, 3),
        "tokens_per_s": round(received / wall, 1),
    }




async def run(args: argparse.Namespace) -> dict[str, object]:
    config = dataclasses.replace(SimConfig().zero_cost(), max_running_requests=args.max_running)
    async with launch.fleet("process", 1, config) as fleet:
        assert fleet.proc is not None
        pid = fleet.proc.pid
        async with grpc.aio.insecure_channel(fleet.urls[0].removeprefix("grpc://")) as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            await stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
            cpu0 = cpu_seconds(pid)
            unary = await unary_phase(
                stub, args.calls, args.concurrency, args.unary_tokens, args.cap_s
            )
            cpu1 = cpu_seconds(pid)
            stream = await stream_phase(stub, args.streams, args.stream_tokens, args.cap_s)
            cpu2 = cpu_seconds(pid)
    # Worker-side CPU per unit of work: what bounds a process hosting many workers.
    unary["worker_cpu_ms_per_call"] = round(1000 * (cpu1 - cpu0) / max(1, unary["calls"]), 3)
    stream["worker_cpu_us_per_token"] = round(1e6 * (cpu2 - cpu1) / max(1, stream["tokens"]), 1)
    return {"unary": unary, "stream": stream, "worker": fleet.counters}




def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--calls", type=int, default=3000, help="unary phase: max Generate calls")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="unary phase: concurrent callers"
    )
    parser.add_argument("--unary-tokens", type=int, default=4, help="unary phase: max_new_tokens")
    parser.add_argument("--streams", type=int, default=32, help="stream phase: concurrent streams")
    parser.add_argument(
        "--stream-tokens", type=int, default=2000, help="stream phase: tokens per stream"
    )
    parser.add_argument("--max-running", type=int, default=64, help="worker max_running_requests")
    parser.add_argument("--cap-s", type=float, default=20.0, help="time cap per phase, seconds")
    parser.add_argument("--json", default="", help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    measured = asyncio.run(run(args))
    return results.write(result(measured, args), json_path=args.json)


def result(measured: dict[str, Any], args: argparse.Namespace) -> results.Result:
    """Both phases as two rows of the common result format (the JSON keeps ``unary`` and ``stream``)."""
    u, s = measured["unary"], measured["stream"]
    header = ("phase", "load", "rate", "done", "seconds", "worker CPU")
    rows = [
        ("unary Generate", f"16-token prompt, {args.unary_tokens} tokens, {args.concurrency} callers",
         f"{u['calls_per_s']} calls/s", f"{u['calls']} calls", u["seconds"], f"{u['worker_cpu_ms_per_call']} ms/call"),
        ("streamed tokens", f"{args.streams} streams x {args.stream_tokens} tokens", f"{s['tokens_per_s']} tokens/s",
         f"{s['tokens']} tokens, {s['chunks']} chunks", s["seconds"], f"{s['worker_cpu_us_per_token']} us/token"),
    ]  # fmt: skip
    table = results.Table.of("one simulated worker, zero step costs", header, rows, labels=2)
    return results.Result(tables=[table], data={"unary": u, "stream": s})
