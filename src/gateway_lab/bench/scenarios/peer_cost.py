#!/usr/bin/env python
"""The gateway's own CPU against SMG's, on a fleet both serve without stalls.

    token-gateway bench peer-cost                       # ours and SMG, both orders
    token-gateway bench peer-cost --loads short --repeat 4

The fleet is ``ZeroFleet`` (gateway_lab/bench/zero_fleet.py): zero-cost workers with no
simulator code in them that answer the SGLang service as its ``--grpc-mode`` servicer does
(``--worker-transport http``: SGLang's HTTP server, ``zero_http``; ours sends it token ids,
SMG the OpenAI request) and report a model folder, so a peer that reads the model's
``config.json`` from the reported path finds it. The same fleet serves every gateway (caches flushed in between);
a round runs the gateways in the order given, the next round in the reverse order, so
neither always runs first. Loads, each bounded in requests and ``--cap-s``:

* ``short``: chat, ``--short-prompt-tokens`` rendered prompt tokens (unique prompts),
  ``--short-max-tokens`` out, ``--concurrency`` in flight, non-streaming;
* ``short-stream``: the same streamed, ``--stream-max-tokens`` out;
* ``short-stream-think``: the same on workers whose answers open with a think block (the
  reasoning parser splits the tokens until it ends; ``short-stream``'s answers have none);
* ``gsp-paced``: the shared-prefix burst (text completions, streamed) on ``--gsp-workers``
  workers that emit one token per ``--worker-step-s``, a GPU's pace, ``--gsp-concurrency``
  in flight. ``--gsp-kv-tokens`` bounds each worker's prefix cache (LRU) and
  ``--gsp-prefill-token-s`` makes its uncached prompt tokens cost time before the first
  token, so a router that spreads a group over workers loses hits and pays in TTFT.

Per gateway and load: requests/s, latency p50/p99 (TTFT for streams), the router
process's user+system CPU over the load window divided by requests served (and by
relayed tokens), the hit rate (gsp) and, as the fleet itself recorded it, where each
prompt group went (distinct workers per group: 1 is perfect stickiness); a line says whether either gateway stalled (p99 over
``--stall-ratio`` x its p50, or requests/s under 1/``--stall-ratio`` of the other's).
Before each measured load, ``--warm`` requests of the same kind run and the gateway is let
go quiet: one-off costs (ours: the fast encoder's build) stay out of the window.
``--door grpc`` sends the chat loads to our gateway's own gRPC API (``StreamChatCompletion``,
``ChatCompletion``) instead of HTTP; SMG is not run then.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from gateway_lab.bench import launch
from gateway_lab.bench.results import Result, Table, write
from gateway_lab.bench.scenarios.overhead import (
    Client,
    Prompts,
    Reply,
    closed_loop,
    flush_caches,
    pct,
    profiling,
    settle,
    start_gateway,
    summarize_profile,
)  # fmt: skip
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import ZeroFleet, placement, read_records

LOADS = ("short", "short-stream", "short-stream-think", "gsp-paced")
SHORT_STREAMED = ("short-stream", "short-stream-think")
GATEWAYS = ("ours", "smg", "before")
FIGURES = (
    ("requests_per_s", "requests/s"),
    ("p50_ms", "latency p50 ms"),
    ("p99_ms", "latency p99 ms"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("cpu_ms_per_request", "CPU ms/request"),
    ("cpu_us_per_token", "CPU µs/relayed token"),
    ("tokens_per_event", "relayed tokens per streamed text event"),
    ("system_share", "share of CPU in the kernel"),
    ("hit_rate", "hit rate"),
    ("fleet_ideal", "hit rate, every group on one worker"),
    ("holders_mean", "workers per prompt group, mean"),
    ("holders_max", "workers per prompt group, max"),
)


def load_row(done: Sequence[Reply], wall: float, cpu: float) -> dict[str, Any]:
    """One load's figures from its replies, its wall time and the router's CPU seconds."""
    lat = [r.total_s * 1e3 for r in done]
    ttft = [r.ttft_s * 1e3 for r in done]
    tokens = sum(r.tokens for r in done)
    prompt = sum(r.prompt_tokens for r in done)
    events = sum(r.events for r in done)
    return {
        "requests": len(done), "seconds": round(wall, 2),
        "requests_per_s": round(len(done) / wall, 1) if wall > 0 else 0.0,
        "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
        "ttft_p50_ms": round(pct(ttft, 0.5), 2), "ttft_p99_ms": round(pct(ttft, 0.99), 2),
        "cpu_ms_per_request": round(1e3 * cpu / max(1, len(done)), 3),
        "cpu_us_per_token": round(1e6 * cpu / max(1, tokens), 1),
        "tokens_per_event": round(tokens / events, 2) if events else None,
        "hit_rate": round(sum(r.cached_tokens for r in done) / prompt, 3) if prompt else None,
    }  # fmt: skip


def stalls(rows: dict[str, dict[str, Any]], ratio: float) -> list[str]:
    """Why each gateway's run of one load does not count (empty: none stalled)."""
    out: list[str] = []
    best = max((r["requests_per_s"] for r in rows.values()), default=0.0)
    for name, row in rows.items():
        if row["p50_ms"] > 0 and row["p99_ms"] > ratio * row["p50_ms"]:
            out.append(f"{name}: p99 {row['p99_ms']:g} ms > {ratio:g} x p50 {row['p50_ms']:g} ms")
        if best > 0 and row["requests_per_s"] * ratio < best:
            out.append(f"{name}: {row['requests_per_s']:g} requests/s < 1/{ratio:g} of {best:g}")
    return out


def ordered(gateways: Sequence[str], rnd: int) -> list[str]:
    """The gateways in the given order in odd rounds, reversed in even ones."""
    return list(gateways) if rnd % 2 == 1 else list(reversed(gateways))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except (OSError, ValueError):
        pass
    return out


def user_system_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` and its live descendants (a gateway
    run with ``--processes N`` serves from children; Linux /proc, zeros elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11]) / tick
            system += int(fields[12]) / tick
        except (OSError, IndexError, ValueError):
            continue
        todo += _children(p)
    return user, system


class GrpcClient:
    """Chat requests to our gateway's own gRPC API, read as ``Client`` reads HTTP replies."""

    def __init__(self, target: str, model: str) -> None:
        from grpc import aio

        from gateway.proto import gateway_pb2_grpc as gpb_grpc

        self.channel = aio.insecure_channel(target)
        self.stub = gpb_grpc.TokenGatewayStub(self.channel)
        self.model = model

    async def close(self) -> None:
        await self.channel.close()

    async def send(self, path: str, body: dict[str, Any]) -> Reply:
        from gateway.proto import gateway_pb2 as gpb

        if path != "/v1/chat/completions":
            raise ValueError(f"the gRPC door serves chat loads only, not {path}")
        request = gpb.ChatCompletionRequest(
            model=self.model, messages=[gpb.ChatMessage(role=m["role"], content=m["content"]) for m in body["messages"]],
            sampling=gpb.Sampling(max_tokens=body["max_tokens"], temperature=0.0, ignore_eos=True),
        )  # fmt: skip
        t0 = time.perf_counter()
        if not body.get("stream"):
            reply = await self.stub.ChatCompletion(request)
            total = time.perf_counter() - t0
            u = reply.usage
            return Reply(total, total, u.completion_tokens, reply.choices[0].message.content, u.prompt_tokens,
                         u.cached_tokens)  # fmt: skip
        request.stream_options.include_usage = True
        ttft = 0.0
        pieces: list[str] = []
        events = 0
        usage = None
        async for chunk in self.stub.StreamChatCompletion(request):
            for c in chunk.choices:
                piece = c.delta.reasoning_content + c.delta.content
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    pieces.append(piece)
                    events += 1
            if chunk.HasField("usage"):
                usage = chunk.usage
        total = time.perf_counter() - t0
        if usage is None:
            raise RuntimeError("StreamChatCompletion ended without a usage chunk")
        return Reply(total, ttft or total, usage.completion_tokens, "".join(pieces), usage.prompt_tokens,
                     usage.cached_tokens, events)  # fmt: skip


async def _measure(gw: launch.Gateway, client: Client | GrpcClient, bodies: Sequence[tuple[str, dict[str, Any]]], concurrency: int, cap_s: float) -> dict[str, Any]:
    u0, s0 = user_system_s(gw.pid)
    done, wall = await closed_loop(lambda i: client.send(*bodies[i]), concurrency, len(bodies), cap_s)  # type: ignore[arg-type,return-value]
    u1, s1 = user_system_s(gw.pid)
    row = load_row(done, wall, (u1 - u0) + (s1 - s0))  # type: ignore[arg-type]
    row["system_share"] = round((s1 - s0) / max(1e-9, (u1 - u0) + (s1 - s0)), 2)
    return row


def short_bodies(prompts: Prompts, args: argparse.Namespace, n: int, stream: bool) -> list[tuple[str, dict[str, Any]]]:
    max_tokens = args.stream_max_tokens if stream else args.short_max_tokens
    return [
        ("/v1/chat/completions", {"messages": prompts.messages(args.short_prompt_tokens), "max_tokens": max_tokens, "stream": stream})
        for _ in range(n)
    ]


def gsp_bodies(args: argparse.Namespace, seed: int) -> list[tuple[str, dict[str, Any]]]:
    from gateway_lab.bench.workloads import GspConfig, Vocab, gsp

    config = GspConfig(
        groups=args.gsp_groups, prompts_per_group=args.gsp_prompts_per_group, system_tokens=args.gsp_system_tokens,
        question_tokens=args.gsp_question_tokens, output_tokens=args.gsp_output_tokens, text_prompts=True,
    )  # fmt: skip
    return [
        ("/v1/completions", {"prompt": s.prompt, "max_tokens": s.max_tokens, "stream": True})
        for s in gsp(config, Vocab.from_tokenizer_dir(), seed)
    ]


async def run_gateway(name: str, fleet: ZeroFleet, loads: Sequence[str], prompts: Prompts, args: argparse.Namespace) -> dict[str, Any]:
    """One gateway in front of ``fleet``: every load, each after its own warm-up."""
    await flush_caches(fleet.urls)
    out: dict[str, Any] = {}
    async with start_gateway(name, fleet.urls, args) as gw:
        async with httpx.AsyncClient(trust_env=False) as probe:
            model = (await probe.get(gw.url + "/v1/models")).json()["data"][0]["id"]
        client: Client | GrpcClient
        if args.door == "grpc":
            client = GrpcClient(gw.ready_info["grpc_target"], model)
        else:
            client = Client(gw.url, model, args.concurrency)
        try:
            for load in loads:
                if load == "gsp-paced":
                    warm = gsp_bodies(args, args.seed + 7919)[: args.gsp_warm]
                    bodies = gsp_bodies(args, args.seed)
                else:
                    stream = load in SHORT_STREAMED
                    warm = short_bodies(prompts, args, args.warm, stream)
                    bodies = short_bodies(prompts, args, args.requests, stream)
                await _measure(gw, client, warm, min(8, args.concurrency), args.cap_s)
                await settle(gw.pid, args.cap_s)
                if load == "gsp-paced":
                    await flush_caches(fleet.urls)
                spy = Path(args.profile) / f"{name}-{load}.txt" if args.profile and name != "smg" else None
                t0 = time.time()
                with profiling(gw.pid, spy, args.profile_rate, True):
                    concurrency = (args.gsp_concurrency or args.concurrency) if load == "gsp-paced" else args.concurrency
                    out[load] = await _measure(gw, client, bodies, concurrency, args.cap_s)
                if fleet.record_dir is not None:
                    await asyncio.sleep(0.5)  # the fleet flushes its record every 0.2 s
                    where = placement(read_records(fleet.record_dir, t0, time.time()))
                    out[load] |= {"holders_mean": where["holders_mean"], "holders_max": where["holders_max"],
                                  "fleet_ideal": where["ideal"], "spread": where["spread"]}
                print(f"  {name} {load}: {out[load]}", flush=True)
        finally:
            await client.close()
    return out


def table(rounds: list[dict[str, Any]], gateways: Sequence[str], loads: Sequence[str], ratio: float) -> Result:
    """Per load and figure, each gateway's median over rounds and its range, and ours / smg;
    a stall verdict per round and load as notes."""
    both = {"ours", "smg"} <= set(gateways)
    lines: list[list[str]] = []
    for load in loads:
        for key, label in FIGURES:
            per = {g: [r["gateways"][g][load][key] for r in rounds if r["gateways"].get(g, {}).get(load, {}).get(key) is not None] for g in gateways}
            if not any(per.values()):
                continue
            cells = [load, label]
            for g in gateways:
                v = per[g]
                med = statistics.median(v) if v else None
                cells.append("-" if med is None else (f"{med:g}" if len(v) == 1 else f"{med:g} ({min(v):g}-{max(v):g})"))
            if both:
                o, s = per["ours"], per["smg"]
                cells.append(f"{statistics.median(o) / statistics.median(s):.2f}x" if o and s and statistics.median(s) else "-")
            lines.append(cells)
    notes = []
    for rnd in rounds:
        for load in loads:
            rows = {g: rnd["gateways"][g][load] for g in rnd["order"] if load in rnd["gateways"].get(g, {})}
            why = stalls(rows, ratio)
            notes.append(f"round {rnd['round']} ({' then '.join(rnd['order'])}), {load}: " + ("STALLED: " + "; ".join(why) if why else "no stall"))
    header = ["load", "figure", *gateways, *(["ours / smg"] if both else [])]
    return Result([Table.of("CPU per request side by side", header, lines)], notes)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    gateways = [g for g in args.gateways if g != "smg" or (args.peers_installed and args.door == "http")]
    if args.door == "grpc" and "gsp-paced" in args.loads:
        raise SystemExit("--door grpc runs the chat loads only (gsp-paced sends text completions over HTTP)")
    if "smg" in args.gateways and "smg" not in gateways:
        print(f"smg skipped: no peers' python at {args.peers_python} (scripts/peers.sh installs it)", flush=True)
    if "before" in gateways and not args.baseline_src:
        raise SystemExit("--gateways before needs --baseline-src DIR (another checkout's src/)")
    prompts = Prompts(args.seed)
    tokenizer = default_tokenizer_dir()
    report: dict[str, Any] = {"argv": sys.argv[1:], "load_before": list(os.getloadavg()), "rounds": []}
    fast = [x for x in args.loads if x not in ("gsp-paced", "short-stream-think")]
    for rnd in range(1, args.repeat + 1):
        order = ordered(gateways, rnd)
        entry: dict[str, Any] = {"round": rnd, "order": order, "gateways": {g: {} for g in order}, "load": os.getloadavg()[0]}
        if fast:
            async with launch.fleet(
                "zero", args.workers, tokenizer_dir=tokenizer, processes=args.fleet_processes, http=args.worker_transport == "http",
            ) as fleet:  # fmt: skip
                for name in order:
                    entry["gateways"][name] |= await run_gateway(name, fleet, fast, prompts, args)
        if "short-stream-think" in args.loads:
            async with launch.fleet(
                "zero", args.workers, tokenizer_dir=tokenizer, processes=args.fleet_processes,
                http=args.worker_transport == "http", think=True,
            ) as fleet:  # fmt: skip
                for name in order:
                    entry["gateways"][name] |= await run_gateway(name, fleet, ["short-stream-think"], prompts, args)
        if "gsp-paced" in args.loads:
            with tempfile.TemporaryDirectory(prefix="zero-record-") as record:
                async with launch.fleet(
                    "zero", args.gsp_workers, tokenizer_dir=tokenizer, step_s=args.worker_step_s,
                    processes=args.fleet_processes, record_dir=Path(record), http=args.worker_transport == "http",
                    capacity_tokens=args.gsp_kv_tokens, prefill_token_s=args.gsp_prefill_token_s,
                ) as fleet:  # fmt: skip
                    for name in order:
                        entry["gateways"][name] |= await run_gateway(name, fleet, ["gsp-paced"], prompts, args)
        report["rounds"].append(entry)
    report["load_after"] = list(os.getloadavg())
    report["table"] = table(report["rounds"], gateways, args.loads, args.stall_ratio).markdown()
    report["gateways"] = gateways
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench peer-cost --help``)."""
    parser.add_argument("--gateways", nargs="+", choices=GATEWAYS, default=["ours", "smg"],
                        help="who runs, in this order in odd rounds and reversed in even ones")
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=["short", "short-stream", "gsp-paced"])
    parser.add_argument("--repeat", type=int, default=2, help="rounds (2: both orders once)")
    parser.add_argument("--door", choices=["http", "grpc"], default="http",
                        help="our gateway's front door for the chat loads (grpc: its own gRPC API; SMG is not run)")
    parser.add_argument("--policy", default="cache_aware", help="routing policy, the same name for every gateway")
    parser.add_argument("--peers-python", default=launch.PEERS_PYTHON, help="python of the peers' virtualenv")
    parser.add_argument("--baseline-src", default="", help="src/ of another checkout, run as gateway 'before'")
    parser.add_argument("--ours-args", default="", help="extra 'token-gateway serve' flags for gateway 'ours' only")
    parser.add_argument("--workers", type=int, default=8, help="short loads: zero-cost workers")
    parser.add_argument(
        "--worker-transport", choices=["grpc", "http"], default="grpc",
        help="how the zero-cost workers are reached: SGLang's gRPC service, or its HTTP server (ours sends token ids"
        " to /generate, SMG forwards the OpenAI request)",
    )
    parser.add_argument("--fleet-processes", type=int, default=2, help="processes the zero-cost workers share")
    parser.add_argument("--concurrency", type=int, default=128, help="requests in flight")
    parser.add_argument("--requests", type=int, default=4000, help="short loads: measured requests")
    parser.add_argument("--warm", type=int, default=1000, help="short loads: warm-up requests before each measured load")
    parser.add_argument("--short-prompt-tokens", type=int, default=32)
    parser.add_argument("--short-max-tokens", type=int, default=8)
    parser.add_argument("--stream-max-tokens", type=int, default=32)
    parser.add_argument("--gsp-workers", type=int, default=16)
    parser.add_argument("--gsp-groups", type=int, default=16)
    parser.add_argument("--gsp-prompts-per-group", type=int, default=16)
    parser.add_argument("--gsp-system-tokens", type=int, default=2048)
    parser.add_argument("--gsp-question-tokens", type=int, default=128)
    parser.add_argument("--gsp-output-tokens", type=int, default=128)
    parser.add_argument("--gsp-warm", type=int, default=32, help="gsp: warm-up requests (other prompts), then caches flushed")
    parser.add_argument("--gsp-concurrency", type=int, default=0, help="gsp: requests in flight (0: --concurrency)")
    parser.add_argument("--gsp-kv-tokens", type=int, default=65536, help="gsp: each worker's prefix cache, tokens (LRU)")
    parser.add_argument("--gsp-prefill-token-s", type=float, default=0.0,
                        help="gsp: seconds per uncached prompt token before the first token, one prompt at a time per worker")
    parser.add_argument("--worker-step-s", type=float, default=0.02, help="gsp-paced: seconds per token per stream")
    parser.add_argument("--stall-ratio", type=float, default=10.0)
    parser.add_argument("--cap-s", type=float, default=60.0, help="time cap per load, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of our gateway's measured loads")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--json", default="", help="write every figure to this JSON file")


def main(args: argparse.Namespace) -> int:
    """Run the scenario with parsed flags; the exit status."""
    args.baseline_src = os.path.abspath(args.baseline_src) if args.baseline_src else ""
    args.peers_installed = os.path.exists(args.peers_python)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    report = asyncio.run(run(args))
    result = table(report["rounds"], report["gateways"], args.loads, args.stall_ratio)
    result.notes.append(f"load before {report['load_before'][0]:.1f}, after {report['load_after'][0]:.1f}")
    for raw in sorted(Path(args.profile).glob("*.txt")) if args.profile else ():
        summary = summarize_profile(raw, top=30)
        print(f"\nprofile {raw.stem}: {summary['samples']} samples")
        for stage, share in summary["stage_percent"].items():
            print(f"  {share:5.1f}%  {stage}")
        for share, frame in summary["top_self_percent"]:
            print(f"  {share:5.1f}%  {frame}")
    result.data = report
    return write(result, json_path=args.json)
