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
    token-gateway bench transports --fleet zero --transports grpc,http,vllm --repeat 4

One sitting moves a cell's CPU per request by more than the gap being measured (the host's
other work lands on whichever run is going), so ``--repeat N`` runs N rounds, each with the
transports in another order (rotated every other round, reversed in every second one, so
each transport runs early and late), and adds a table of each cell's median and range over
the rounds and its ratio to gRPC round by round: a ratio taken within one round compares
runs that had the same host minutes ago, not an hour apart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway_lab.bench import launch, machine, results
from gateway_lab.bench import workloads as wl
from gateway_lab.bench.driver import DriverConfig, run_workload
from gateway_lab.bench.results import Result, Table
from gateway_lab.bench.scenarios.overhead import profiling, summarize_profile
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
    "round", "transport", "gateway", "fleet", "step_ms", "kv_events", "policy",
    "ok", "failed", "hit_rate", "cpu_ms_per_request", "cpu_vs_grpc", "requests_per_s",
)  # fmt: skip
LABELS = 7
# the transport every other one's CPU per request is compared with, within a round
REFERENCE = "grpc"
SUMMARY = (
    "transport", "gateway", "policy", "cpu_ms_per_request", "requests_per_s", "cpu_vs_grpc", "cpu_vs_grpc_per_round",
)  # fmt: skip


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
    rnd: int = 1,
) -> dict[str, Any]:
    """One run: a fresh fleet and a fresh gateway process (``before``: the gateway from
    ``--baseline-src``), a short warm-up of other prompts, then the measured workload
    (sampled with py-spy into ``--profile`` when given)."""
    env = {**os.environ, "PYTHONPATH": args.baseline_src} if gateway == "before" else None
    spy = Path(args.profile) / f"r{rnd}-{transport}-{gateway}-{policy}.txt" if args.profile else None
    async with _fleet(transport, args) as fleet:
        async with launch.gateway("ours", fleet.urls, policy, extra_args=_gateway_flags(transport, args), env=env) as gw:
            if warm.requests:
                await run_workload(gw.url, warm, DriverConfig(concurrency=args.concurrency))
            with profiling(gw.pid, spy, args.profile_rate, True):
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
        "--repeat", type=int, default=1,
        help="rounds, the transports in another order each (rotated every other round, reversed in even ones);"
        " more than one adds each cell's median, range and per-round ratio to grpc",
    )
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
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of each measured run (slows them)")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--json", default="", help="also write the figures here as JSON")
    parser.add_argument("--markdown", default="", help="also write the table here as Markdown")


def rotated(transports: list[str], rnd: int) -> list[str]:
    """Round ``rnd``'s order (from 1): rotated by one every other round, reversed in even rounds,
    so over ``2 * len(transports)`` rounds each transport runs in every place, after and
    before every other one."""
    turn = (rnd - 1) // 2 % max(1, len(transports))
    order = transports[turn:] + transports[:turn]
    return order if rnd % 2 else order[::-1]


def with_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's CPU per request over its round's gRPC run of the same gateway and policy
    (``cpu_vs_grpc``, None when that round ran no gRPC or it used no CPU)."""
    ref = {
        (r["round"], r["gateway"], r["policy"]): r["cpu_ms_per_request"] for r in runs if r["transport"] == REFERENCE
    }  # fmt: skip
    out = []
    for r in runs:
        base = ref.get((r["round"], r["gateway"], r["policy"]))
        out.append(r | {"cpu_vs_grpc": r["cpu_ms_per_request"] / base if base else None})
    return out


def _spread(values: list[float], digits: int) -> str:
    """``median (min-max)``, or the value alone when there is one."""
    if not values:
        return "-"
    med = f"{statistics.median(values):.{digits}f}"
    return med if len(values) == 1 else f"{med} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(runs: list[dict[str, Any]]) -> Table:
    """Per cell (transport, gateway, policy) over the rounds: the median and range of its CPU
    per request and requests/s, and its ratio to gRPC, as a median and round by round."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((r["transport"], r["gateway"], r["policy"]), []).append(r)
    rows = []
    for (transport, gateway, policy), rs in cells.items():
        rs = sorted(rs, key=lambda r: r["round"])
        ratios = [r["cpu_vs_grpc"] for r in rs if r["cpu_vs_grpc"] is not None]
        rows.append([
            transport, gateway, policy, _spread([r["cpu_ms_per_request"] for r in rs], 3),
            _spread([r["requests_per_s"] for r in rs], 1), _spread(ratios, 2),
            " ".join(f"{x:.2f}" for x in ratios) or "-",
        ])  # fmt: skip
    return Table.of(f"per cell over {len({r['round'] for r in runs})} rounds: median (range)", SUMMARY, rows, labels=3)


def result(runs: list[dict[str, Any]], ideal: float, args: argparse.Namespace) -> Result:
    """The runs as one table (a row per run, a column per key, floats to three places), and
    with more than one round the per-cell summary; the raw runs and the ideal hit rate go
    to the JSON as they are."""
    runs = with_ratios(runs)

    def cell(value: Any) -> Any:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else value

    cells = [[cell(run[c]) for c in COLUMNS] for run in runs]
    title = f"gsp {args.groups}x{args.prompts}, ideal hit rate {ideal:.3f}"
    tables = [Table.of(title, COLUMNS, cells, labels=LABELS)]
    if len({r["round"] for r in runs}) > 1:
        tables.append(summary(runs))
    return Result(tables=tables, data={"ideal_hit_rate": ideal, "runs": runs})


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
    loads = []
    for rnd in range(1, args.repeat + 1):
        loads.append(f"round {rnd}: load {os.getloadavg()[0]:.1f} at its start")
        for policy in args.policies.split(","):
            for step, transport in enumerate(rotated(args.transports.split(","), rnd), start=rnd):
                for gateway in args.gateways if step % 2 else reversed(args.gateways):
                    row = {"round": rnd, **await one(transport, policy, args, workload, warm, gateway, rnd)}
                    runs.append(row)
                    print(
                        f"[round {rnd} {transport} {gateway} {policy}] hit {row['hit_rate']:.3f}, "
                        f"{row['cpu_ms_per_request']:.3f} CPU ms/request, {row['requests_per_s']:.1f} requests/s, "
                        f"{row['failed']} failed", flush=True,
                    )  # fmt: skip
    out = result(runs, 1 - unique / total, args)
    out.machine = started
    out.notes += [*loads, f"load {os.getloadavg()[0]:.1f} at the end"]
    for row in runs:
        where = f"round {row['round']} " if args.repeat > 1 else ""
        out.count_failed(f"{where}{row['transport']} {row['gateway']} {row['policy']}", row["failed"], row["ok"] + row["failed"])
    return out


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags."""
    if args.repeat < 1:
        raise SystemExit("--repeat takes 1 or more rounds")
    if "before" in args.gateways and not args.baseline_src:
        raise SystemExit("--gateways before needs --baseline-src DIR (another checkout's src/)")
    args.baseline_src = os.path.abspath(args.baseline_src) if args.baseline_src else ""
    out = asyncio.run(_run(args))
    status = results.write(out, json_path=args.json, markdown_path=args.markdown)
    for raw in sorted(Path(args.profile).glob("*.txt")) if args.profile else ():
        top = summarize_profile(raw, top=25)
        print(f"\nprofile {raw.stem}: {top['samples']} samples")
        for share, frame in top["top_self_percent"]:
            print(f"  {share:5.1f}%  {frame}")
    return status
