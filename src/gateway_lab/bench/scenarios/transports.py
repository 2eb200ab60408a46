"""gsp through the gateway to simulated workers: SGLang, vLLM and TensorRT-LLM over gRPC, SGLang and vLLM over HTTP, in one run.

Same workload, same fleet size and cache size, same policy: the prefix-cache hit rate
the workers themselves report (their cached / prompt token counters) and the CPU time
per request of the process running the gateway and the load driver (the workers run in
a child process), for each transport. Zero-cost simulated steps, so the run measures
routing and the gateway's own work, not simulated GPU time.

    token-gateway bench transports --groups 16 --prompts 8 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from typing import Any

from gateway.server.config import GatewayConfig, ServerConfig
from gateway_lab.bench import launch
from gateway_lab.bench import workloads as wl
from gateway_lab.bench.driver import DriverConfig, run_workload
from gateway_lab.bench.inprocess import serve_in_process
from gateway_lab.sim.config import SimConfig


async def one(transport: str, policy: str, args: argparse.Namespace, workload: wl.Workload) -> dict[str, Any]:
    """One run: a fresh fleet (in its own process, so this process's CPU time is the
    gateway's and the load driver's, the same for both transports) and a fresh gateway."""
    sim = dataclasses.replace(SimConfig().zero_cost(), kv_capacity_tokens=args.kv_tokens, eos_probability=0.0)
    extra = {
        "grpc": [], "vllm-grpc": ["--engine", "vllm"], "trtllm-grpc": ["--engine", "trtllm"],
        "http": ["--http"], "vllm": ["--http", "--http-api", "vllm"],
    }[transport]
    if args.fleet == "sim-alt":  # the second build: bigger pages, less KV, fewer running slots
        sim = dataclasses.replace(sim, page_size=32, kv_capacity_tokens=args.kv_tokens * 4 // 5, max_running_requests=24)
    async with launch.fleet("process", args.workers, sim, extra_args=extra) as fleet:
        with tempfile.TemporaryDirectory() as tok:
            # vLLM's server does not say where its tokenizer is: give it, as operators do.
            tokenizer = str(wl.default_tokenizer_dir()) if transport == "vllm" else None
            config = GatewayConfig(server=ServerConfig(
                worker_urls=fleet.urls, tokenizer_cache_dir=tok, tokenizer_path=tokenizer,
            ))
            config.policy.policy = policy
            config.server.kv_events = args.kv_events
            if args.tree_default_budget_tokens > 0:  # for workers that report no KV pool (TensorRT-LLM)
                config.policy.tree_default_budget_tokens = args.tree_default_budget_tokens
            async with serve_in_process(config) as gateway:
                cpu0 = time.process_time()
                run = await run_workload(gateway.url, workload, DriverConfig(concurrency=args.concurrency))
                cpu = time.process_time() - cpu0
    counters = (fleet.counters or {}).get("workers", [])
    ok = sum(r.ok for r in run.results)
    cached = sum(c["cached_tokens"] for c in counters)
    prompt = sum(c["prompt_tokens"] for c in counters)
    return {
        "transport": transport, "fleet": args.fleet, "kv_events": args.kv_events, "policy": policy, "ok": ok, "failed": len(run.results) - ok,
        "hit_rate": cached / prompt if prompt else 0.0, "cpu_ms_per_request": 1000 * cpu / max(1, ok),
        "worker_requests": sum(c["requests"] for c in counters),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench transports --help``)."""
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--question-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kv-tokens", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--policies", default="cache_aware,round_robin")
    parser.add_argument(
        "--transports", default="grpc,http,vllm", help="grpc (SGLang), vllm-grpc, trtllm-grpc, http (SGLang), vllm (HTTP)",
    )
    parser.add_argument(
        "--fleet", default="sim", choices=["sim", "sim-alt"],
        help="sim: page 16, --kv-tokens KV, 64 slots; sim-alt: page 32, 4/5 of the KV, 24 slots",
    )
    parser.add_argument(
        "--kv-events", action="store_true",
        help="the gateway subscribes to the workers' KV events (the page size and cache contents from the workers)",
    )
    parser.add_argument(
        "--tree-default-budget-tokens", type=int, default=0,
        help="cache_aware's tree budget for workers that report no KV pool, as an operator would set it (0: the default)",
    )


async def _run(args: argparse.Namespace) -> None:
    workload = wl.gsp(wl.GspConfig(
        groups=args.groups, prompts_per_group=args.prompts, system_tokens=args.system_tokens,
        question_tokens=args.question_tokens, output_tokens=args.output_tokens,
    ), wl.Vocab.from_tokenizer_dir(), seed=0)
    unique = args.groups * args.system_tokens + len(workload.requests) * args.question_tokens
    total = len(workload.requests) * (args.system_tokens + args.question_tokens)
    print(f"gsp {args.groups}x{args.prompts}, ideal hit rate {1 - unique / total:.3f}")
    for policy in args.policies.split(","):
        for transport in args.transports.split(","):
            row = await one(transport, policy, args, workload)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))



def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags."""
    asyncio.run(_run(args))
    return 0
