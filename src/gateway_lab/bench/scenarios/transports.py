"""gsp through the gateway to simulated workers: SGLang, vLLM and TensorRT-LLM over gRPC, SGLang and vLLM over HTTP, in one run.

Same workload, same fleet size and cache size, same policy: the prefix-cache hit rate
the workers report (their cached / prompt token counts, relayed in each answer's usage)
and the gateway's CPU time per request, for each transport. The gateway is
``token-gateway serve`` in its own process (as deployed), the workers in another, the
load driver in this one: the CPU figure is the gateway's alone. Zero-cost steps by
default, so the run measures routing and the gateway's own work, not simulated GPU
time; ``--step-ms`` paces the workers instead, so tokens arrive one at a time as from a
GPU on every transport. Two fleets: the simulator (``sim``, ``sim-alt``) and the
zero-cost workers (``zero``: gRPC, SGLang HTTP or vLLM HTTP, no simulator code in them).

    token-gateway bench transports --groups 16 --prompts 8 --workers 4 --json transports.json
    token-gateway bench transports --fleet zero --transports grpc,http --gateways ours before --baseline-src ../main/src
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gateway_lab.bench import launch, machine, results
from gateway_lab.bench import workloads as wl
from gateway_lab.bench.driver import DriverConfig, run_workload
from gateway_lab.bench.results import Result, Table
from gateway_lab.bench.scenarios.peer_cost import user_system_s
from gateway_lab.sim.config import SimConfig

if TYPE_CHECKING:
    from gateway_lab.bench.zero_fleet import ZeroFleet
    from gateway_lab.sim.fleet import SubprocessFleet

SIM_KINDS = {
    "grpc": [], "vllm-grpc": ["--engine", "vllm"], "trtllm-grpc": ["--engine", "trtllm"],
    "http": ["--http"], "vllm": ["--http", "--http-api", "vllm"],
}  # fmt: skip
ZERO_KINDS = ("grpc", "http", "vllm")
# a run's keys, in the table's order: the first LABELS name the run, the rest are its figures
COLUMNS = (
    "transport", "gateway", "fleet", "step_ms", "kv_events", "policy",
    "ok", "failed", "hit_rate", "cpu_ms_per_request", "requests_per_s",
)  # fmt: skip
LABELS = 6


@contextlib.asynccontextmanager
async def _fleet(transport: str, args: argparse.Namespace) -> AsyncIterator[SubprocessFleet | ZeroFleet]:
    """A fresh fleet of ``transport`` workers in child processes."""
    if args.fleet == "zero":
        if transport not in ZERO_KINDS:
            raise SystemExit(f"the zero-cost fleet serves {', '.join(ZERO_KINDS)}, not {transport}")
        async with launch.fleet(
            "zero", args.workers, step_s=args.step_ms / 1e3, capacity_tokens=args.kv_tokens,
            http=transport in ("http", "vllm"), http_api="vllm" if transport == "vllm" else "sglang",
        ) as zero:  # fmt: skip
            yield zero
        return
    sim = dataclasses.replace(SimConfig().zero_cost(), kv_capacity_tokens=args.kv_tokens, eos_probability=0.0)
    if args.step_ms > 0:  # one step per token for every running request, slept in wall time
        sim = dataclasses.replace(sim, step_base_s=args.step_ms / 1e3, time_scale=1.0)
    if args.fleet == "sim-alt":  # the second build: bigger pages, less KV, fewer running slots
        sim = dataclasses.replace(sim, page_size=32, kv_capacity_tokens=args.kv_tokens * 4 // 5, max_running_requests=24)
    async with launch.fleet("process", args.workers, sim, extra_args=SIM_KINDS[transport]) as fleet:
        yield fleet


def _gateway_flags(transport: str, args: argparse.Namespace) -> list[str]:
    flags = ["--no-access-log", "--log-level", "warning"]
    if transport == "vllm" or (args.fleet == "zero" and transport == "http"):
        # HTTP servers do not send their tokenizer: give it, as operators do.
        flags += ["--tokenizer-path", str(wl.default_tokenizer_dir())]
    if args.kv_events:
        flags.append("--kv-events")
    if args.tree_default_budget_tokens > 0:  # for workers that report no KV pool (TensorRT-LLM)
        flags += ["--tree-default-budget-tokens", str(args.tree_default_budget_tokens)]
    return flags


async def one(
    transport: str, policy: str, args: argparse.Namespace, workload: wl.Workload, warm: wl.Workload, gateway: str = "ours",
) -> dict[str, Any]:
    """One run: a fresh fleet and a fresh gateway process (``before``: the gateway from
    ``--baseline-src``), a short warm-up of other prompts, then the measured workload."""
    env = {**os.environ, "PYTHONPATH": args.baseline_src} if gateway == "before" else None
    async with _fleet(transport, args) as fleet:
        async with launch.gateway("ours", fleet.urls, policy, extra_args=_gateway_flags(transport, args), env=env) as gw:
            if warm.requests:
                await run_workload(gw.url, warm, DriverConfig(concurrency=args.concurrency))
            u0, s0 = user_system_s(gw.pid)
            t0 = time.perf_counter()
            run = await run_workload(gw.url, workload, DriverConfig(concurrency=args.concurrency))
            wall = time.perf_counter() - t0
            u1, s1 = user_system_s(gw.pid)
    done = [r for r in run.results if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    cpu = (u1 - u0) + (s1 - s0)
    return {
        "transport": transport, "gateway": gateway, "fleet": args.fleet, "step_ms": args.step_ms,
        "kv_events": args.kv_events, "policy": policy, "ok": len(done), "failed": len(run.results) - len(done),
        "hit_rate": sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        "cpu_ms_per_request": 1000 * cpu / max(1, len(done)), "requests_per_s": len(done) / wall if wall > 0 else 0.0,
    }  # fmt: skip


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
        "--fleet", default="sim", choices=["sim", "sim-alt", "zero"],
        help="sim: page 16, --kv-tokens KV, 64 slots; sim-alt: page 32, 4/5 of the KV, 24 slots;"
        " zero: the zero-cost workers (grpc, http and vllm), page 16, --kv-tokens KV",
    )
    parser.add_argument(
        "--step-ms", type=float, default=0.0,
        help="milliseconds per generated token on every worker (0: zero cost, tokens as fast as they go)",
    )
    parser.add_argument("--warm", type=int, default=8, help="requests of other prompts before each measured run")
    parser.add_argument(
        "--gateways", nargs="+", choices=["ours", "before"], default=["ours"],
        help="who runs each transport, in this order for odd transports and reversed for even ones",
    )
    parser.add_argument("--baseline-src", default="", help="src/ of another checkout, run as gateway 'before'")
    parser.add_argument(
        "--kv-events", action="store_true",
        help="the gateway subscribes to the workers' KV events (the page size and cache contents from the workers)",
    )
    parser.add_argument(
        "--tree-default-budget-tokens", type=int, default=0,
        help="cache_aware's tree budget for workers that report no KV pool, as an operator would set it (0: the default)",
    )
    parser.add_argument("--json", default="", help="also write the figures here as JSON")
    parser.add_argument("--markdown", default="", help="also write the table here as Markdown")


def result(runs: list[dict[str, Any]], ideal: float, args: argparse.Namespace) -> Result:
    """The runs as one table (a row per run, a column per key, floats to three places);
    the raw runs and the ideal hit rate go to the JSON as they are."""
    cells = [[f"{run[c]:.3f}" if isinstance(run[c], float) else run[c] for c in COLUMNS] for run in runs]
    title = f"gsp {args.groups}x{args.prompts}, ideal hit rate {ideal:.3f}"
    return Result(tables=[Table.of(title, COLUMNS, cells, labels=LABELS)], data={"ideal_hit_rate": ideal, "runs": runs})


async def _run(args: argparse.Namespace) -> Result:
    started = machine.facts()
    config = wl.GspConfig(
        groups=args.groups, prompts_per_group=args.prompts, system_tokens=args.system_tokens,
        question_tokens=args.question_tokens, output_tokens=args.output_tokens,
    )
    vocab = wl.Vocab.from_tokenizer_dir()
    workload = wl.gsp(config, vocab, seed=0)
    warm_all = wl.gsp(dataclasses.replace(config, groups=1, prompts_per_group=max(1, args.warm)), vocab, seed=7919)
    warm = dataclasses.replace(warm_all, requests=warm_all.requests[: args.warm])
    unique = args.groups * args.system_tokens + len(workload.requests) * args.question_tokens
    total = len(workload.requests) * (args.system_tokens + args.question_tokens)
    runs = []
    step = 0
    for policy in args.policies.split(","):
        for transport in args.transports.split(","):
            step += 1
            for gateway in args.gateways if step % 2 else reversed(args.gateways):
                row = await one(transport, policy, args, workload, warm, gateway)
                runs.append(row)
                print(
                    f"[{transport} {gateway} {policy}] hit {row['hit_rate']:.3f}, "
                    f"{row['cpu_ms_per_request']:.3f} CPU ms/request, {row['failed']} failed", flush=True,
                )
    out = result(runs, 1 - unique / total, args)
    out.machine = started
    for row in runs:
        out.count_failed(f"{row['transport']} {row['gateway']} {row['policy']}", row["failed"], row["ok"] + row["failed"])
    return out


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags."""
    if "before" in args.gateways and not args.baseline_src:
        raise SystemExit("--gateways before needs --baseline-src DIR (another checkout's src/)")
    args.baseline_src = os.path.abspath(args.baseline_src) if args.baseline_src else ""
    out = asyncio.run(_run(args))
    return results.write(out, json_path=args.json, markdown_path=args.markdown)
