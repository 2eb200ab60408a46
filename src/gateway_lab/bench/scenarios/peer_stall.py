"""Does a peer gateway (SMG) wait in front of the simulated workers? Latency of short chats.

Starts ``--workers`` zero-cost simulated workers in this process and SMG (from
``scripts/peers.sh``'s virtualenv) in front of them, sends ``--requests`` short,
non-streaming chat requests with ``--in-flight`` at a time, and prints the latency
percentiles (``--json`` writes them too). Zero-cost workers answer in milliseconds: seconds mean
the peer waits on something. Bounded by the request count and a per-request timeout.

    token-gateway bench peer-stall [--requests 256 --in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from gateway_lab.bench import launch, results
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.vocab import default_tokenizer_path


def summarize(latencies: list[float], wall_s: float) -> dict[str, float]:
    """Request count, wall time and latency percentiles (ms) of one run."""
    ordered = sorted(latencies)
    return {
        "requests": len(ordered), "wall_s": round(wall_s, 3),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def run(args: argparse.Namespace) -> dict[str, float]:
    config = SimConfig(eos_probability=0.0).zero_cost()
    async with launch.fleet("sim", args.workers, config) as fleet:
        async with launch.gateway(
            "smg", fleet.urls, "round_robin", peers_python=args.python, tokenizer_dir=str(default_tokenizer_path()),
            ready_timeout_s=90,
        ) as peer:
            gate = asyncio.Semaphore(args.in_flight)
            latencies: list[float] = []
            async with httpx.AsyncClient(base_url=peer.url, trust_env=False, timeout=args.timeout_s) as client:
                model = (await client.get("/v1/models")).json()["data"][0]["id"]

                async def one(i: int) -> None:
                    async with gate:
                        started = time.perf_counter()
                        body = {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 16}
                        response = await client.post("/v1/chat/completions", json=body)
                        response.raise_for_status()
                        latencies.append(time.perf_counter() - started)

                started = time.perf_counter()
                await asyncio.gather(*(one(i) for i in range(args.requests)))
                wall = time.perf_counter() - started
    return summarize(latencies, wall)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", default=launch.PEERS_PYTHON, help="python of the peers' virtualenv")
    parser.add_argument("--workers", type=int, default=4, help="simulated workers")
    parser.add_argument("--requests", type=int, default=256, help="chat requests sent")
    parser.add_argument("--in-flight", type=int, default=32, help="requests in flight at once")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per-request timeout, seconds")
    parser.add_argument("--json", default="", help="also write the results here as JSON")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    if not Path(args.python).exists():
        raise SystemExit(f"{args.python} not found: run scripts/peers.sh first")
    figures = asyncio.run(run(args))
    return results.write(result(figures, args.workers), json_path=args.json)


def result(figures: dict[str, Any], workers: int) -> results.Result:
    """The figures as one row of the common result format (and at the JSON's top level)."""
    header = ("peer", "chats", "wall", "p50", "p99", "max")
    row = ("smg", figures["requests"], f"{figures['wall_s']} s", f"{figures['p50_ms']} ms", f"{figures['p99_ms']} ms",
           f"{figures['max_ms']} ms")  # fmt: skip
    table = results.Table.of(f"in front of {workers} zero-cost workers", header, [row], labels=1)
    return results.Result(tables=[table], data=figures)
