"""`token-gateway bench trace`: replay a public trace through each policy on two fleets.

    token-gateway bench trace --trace conversation_trace.jsonl --policies round_robin cache_aware prefix_hash

Every (fleet, policy) cell gets a fresh, cold simulated fleet, an in-process gateway with
that policy (real HTTP and gRPC on loopback, as ``bench matrix``) and the same scaled
trace, sent at its own (scaled) arrival times. The table puts each policy's hit rate
next to the trace's own ideals: unbounded, and within the fleet's total KV, pooled as one
LRU cache (``traces.bounded_ideal_hit_rate``, the "of fleet-KV ideal" column) and with
offline-optimal eviction (``traces.optimal_bounded_hit_rate``: the ceiling no router
reaches past).

With ``--peers smg`` each fleet also gets, per ``--peer-policies`` policy, the peer gateway
(``scripts/peers.sh``) and ours as a child process (``ours-process``), both sent the same
trace as text (each block word is one token, so the text tokenizes back to the trace's
ids; the peer takes no token-id prompts): a like-for-like comparison through
``launch.gateway``. A policy with our own knobs (``cache_aware:knob=value``) runs on ours only.

Why two fleets: a routing gain that depends on one simulator's timing is no gain. The
fleets differ in what a routing policy could overfit: KV page size, KV capacity, running
slots and the prefill/decode cost model (``FLEETS``). A claim holds when it holds on both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench.traces import TraceConfig, TraceIdeals, load_trace_workload, trace_ideals


@dataclass(frozen=True, slots=True)
class FleetShape:
    """The simulated workers' build: page size, KV, slots and step costs."""

    page_size: int
    kv_capacity_tokens: int
    max_running_requests: int
    step_base_s: float
    prefill_token_s: float
    decode_seq_s: float


FLEETS: dict[str, FleetShape] = {
    # the simulator's own cost model (a small model on one GPU)
    "sim": FleetShape(16, 50_000, 64, 0.002, 20e-6, 0.0002),
    # another build: 2x larger pages, less KV, fewer slots, prefill 3x dearer, decode cheaper
    "sim-alt": FleetShape(32, 40_000, 24, 0.006, 60e-6, 0.0001),
}
TRACE_POLICIES = ["round_robin", "cache_aware", "prefix_hash"]


@dataclass(slots=True)
class TraceBenchConfig:
    """Which trace, which policies, which fleets."""

    trace: str = option("", "trace file: Mooncake JSONL (hash_ids) or JSONL prompts with timestamps")
    policies: list[str] = option(
        list(TRACE_POLICIES), "policies to compare (NAME:knob=value,... sets knobs, as bench matrix)"
    )
    fleets: list[str] = option(list(FLEETS), "fleet builds to run every policy on", choices=list(FLEETS))
    workers: int = option(8, "simulated workers per fleet")
    per_worker_concurrency: int = option(32, "requests in flight per worker at most (arrivals are timed)")
    time_scale_sim: float = option(1.0, "wall seconds per simulated second of the workers")
    run_timeout_s: float = option(600.0, "wall-time limit of one cell, s")
    request_timeout_s: float = option(120.0, "give up on one request after this many s")
    peers: list[str] = option([], "peer gateways to run on the trace as text, beside ours as a process "
                              "(see scripts/peers.sh)", choices=["smg"])
    peer_policies: list[str] = option(
        ["cache_aware"], "policies run on ours-process and on each peer (with our own knobs: on ours only)"
    )
    peers_python: str = option(".peers-venv/bin/python", "python of the peers' virtualenv")
    json_out: str = option("", "write every cell's figures as JSON to this file", flag="--json")
    markdown: str = option("", "write the table as Markdown to this file")
    requests_out: str = option(
        "", "in-process cells: append one JSON line per request to this file (its TTFT split into gateway, "
        "wait and prefill, the decision and its reason, each worker's queue as the policy saw it and as it was)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("trace bench"), TraceBenchConfig)
    add_options(parser.add_argument_group("trace scaling"), TraceConfig)


def matrix_config(bench: TraceBenchConfig, shape: FleetShape) -> Any:
    """The ``bench matrix`` cell settings that build fleet ``shape``."""
    from gateway_lab.bench.matrix import MatrixConfig

    return MatrixConfig(
        workloads=[], workers=[bench.workers], policies=list(bench.policies),
        per_worker_concurrency=bench.per_worker_concurrency, kv_capacity_tokens=shape.kv_capacity_tokens,
        page_size=shape.page_size, max_running_requests=shape.max_running_requests,
        step_base_s=shape.step_base_s, prefill_token_s=shape.prefill_token_s, decode_seq_s=shape.decode_seq_s,
        time_scale=bench.time_scale_sim, run_timeout_s=bench.run_timeout_s,
        request_timeout_s=bench.request_timeout_s,
    )  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f}"


def cell_row(fleet: str, cell: Any, ideals: TraceIdeals) -> list[str]:
    """fleet, policy, hit, of fleet-KV ideal, TTFT p50 / p99, max/mean requests per worker, idle, ok."""
    s = cell.summary
    who = cell.policy if cell.gateway == "ours" else f"{cell.gateway} {cell.policy}"
    if s is None:
        return [fleet, who, "failed: " + cell.error.splitlines()[0][:60], *["-"] * 5]
    per_worker = list(s.spread.per_worker.values()) if s.spread else []
    mean = sum(per_worker) / len(per_worker) if per_worker else 0.0
    return [
        fleet, who, _pct(s.hit_rate),
        f"{s.hit_rate / ideals.fleet_kv:.2f}" if ideals.fleet_kv else "-",
        f"{_ms(s.ttft_p50_s)} / {_ms(s.ttft_p99_s)}",
        f"{max(per_worker) / mean:.2f}" if mean else "-",
        str(sum(1 for n in per_worker if n == 0)),
        f"{s.ok}/{s.requests + s.not_sent}",
    ]  # fmt: skip


HEADER = ["fleet", "policy", "hit", "of fleet-KV ideal", "TTFT p50 / p99 ms", "max/mean req per worker",
          "idle workers", "ok"]  # fmt: skip


def ideals_line(fleet: str, shape: FleetShape, ideals: TraceIdeals) -> str:
    return (
        f"{fleet}: page {shape.page_size}, {shape.kv_capacity_tokens:,} KV tokens per worker: ideal hit "
        f"{_pct(ideals.unbounded)} unbounded, {_pct(ideals.fleet_kv)} within the fleet's "
        f"{ideals.fleet_kv_tokens:,} KV tokens as one LRU cache, {_pct(ideals.fleet_kv_optimal)} "
        f"with offline-optimal eviction (the ceiling)"
    )


async def run_trace_cell(
    workload: Any, policy: str, config: Any, tokenizer_dir: str, scratch: str, ideal: float,
    tracer: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """One cell as ``bench matrix`` runs it, plus the gateway's misses by cause at the end.
    With ``tracer`` (a ``route_trace.RouteTracer``) every decision and worker timeline is
    recorded, and joined per request into ``tracer.requests`` at the end."""
    from gateway.pipeline.offpath import run_pending
    from gateway.pipeline.pd import pool_policy_config
    from gateway.policies.factory import make_policy
    from gateway_lab.bench import launch
    from gateway_lab.bench.driver import DriverConfig, run_workload
    from gateway_lab.bench.gc_quiet import quiet_collector
    from gateway_lab.bench.inprocess import serve_in_process
    from gateway_lab.bench.matrix import Cell, sim_config, sim_figures
    from gateway_lab.bench.report import summarize
    from gateway_lab.bench.route_trace import request_id

    workers = config.workers[0]
    driver = DriverConfig(
        concurrency=config.per_worker_concurrency * workers, duration_s=config.run_timeout_s,
        request_timeout_s=config.request_timeout_s,
    )  # fmt: skip
    misses: dict[str, Any] = {}
    async with launch.fleet("sim", workers, sim_config(config)) as fleet:
        gateway = launch.ours_config(fleet.urls, policy, tokenizer_dir, scratch)
        maker = None
        if tracer is not None:
            tracer.attach(fleet.workers)
            maker = tracer.policy_maker(lambda role: make_policy(pool_policy_config(gateway.policy, gateway.pd, role)))
        async with serve_in_process(gateway, policy_maker=maker) as served:
            with quiet_collector():  # as a serving process collects (see gc_quiet)
                async with tracer.watching() if tracer is not None else contextlib.nullcontext():
                    run = await run_workload(served.url, workload, driver, label=policy,
                                             request_ids=request_id if tracer is not None else None)
            run_pending()
            for (_, pool), q in served.state.router.qualities().items():
                if pool == "regular":
                    misses = q.misses.snapshot()
        stats = fleet.stats()
    run.worker_counters = {str(s["url"]): s for s in stats}
    summary = summarize(run, ideal_hit_rate=ideal, worker_ids=[str(s["url"]) for s in stats])
    cell = Cell(workload.name, workers, policy, "ours", summary, sim_figures(stats, run.wall_s, summary.completion_tokens))
    if tracer is not None:
        tracer.requests = tracer.rows(run.results, run.meta["t0"])
    return cell, misses


def as_text(workload: Any, vocab: Any) -> Any:
    """The workload with every token-id prompt sent as its text (a peer takes no token ids)."""
    specs = tuple(
        dataclasses.replace(s, prompt=vocab.decode(s.prompt_token_ids), prompt_token_ids=None)
        if s.prompt_token_ids is not None else s
        for s in workload
    )  # fmt: skip
    return dataclasses.replace(workload, requests=specs, name=workload.name + " (text)")


def peer_plan(bench: TraceBenchConfig) -> list[tuple[str, str]]:
    """(gateway, policy) of the text cells: ours as a process, then each peer, per policy. A
    policy with our own knobs (``NAME:knob=value``) is ours alone: a peer has no such knob."""
    if not bench.peers:
        return []
    return [(gw, p) for p in bench.peer_policies for gw in ("ours-process", *(() if ":" in p else bench.peers))]


def misses_line(fleet: str, policy: str, misses: dict[str, Any]) -> str:
    """The prefill tokens each miss cause cost, largest first."""
    causes = {k: v["tokens"] for k, v in misses.items() if not k.startswith("_") and v.get("tokens")}
    total = sum(causes.values()) or 1
    parts = [f"{k} {100 * n / total:.0f}%" for k, n in sorted(causes.items(), key=lambda kv: -kv[1])]
    return f"{fleet} {policy}: missed {total:,} prompt tokens: " + (", ".join(parts) or "none")


async def run_peer_cell(
    workload: Any, gateway: str, policy: str, config: Any, tokenizer_dir: str, scratch: str, ideal: float
) -> Any:
    """One text cell with ``gateway`` (``ours-process`` or a peer) as ``bench matrix`` runs its
    peer cells; a gateway that fails to start is a failed cell, not a failed bench."""
    from gateway_lab.bench.matrix import Cell, run_cell

    try:
        return await run_cell(workload, config.workers[0], policy, config, tokenizer_dir, scratch, ideal, gateway=gateway)
    except (RuntimeError, OSError, ValueError) as exc:
        return Cell(workload.name, config.workers[0], policy, gateway, None, error=str(exc)[:2000])


async def run_trace_bench(
    bench: TraceBenchConfig, trace: TraceConfig, console: Any, tokenizer_dir: str
) -> tuple[list[tuple[str, Any, TraceIdeals]], list[str]]:
    from gateway_lab.bench.route_trace import RouteTracer, write_rows
    from gateway_lab.bench.route_trace import summary as route_summary
    from gateway_lab.bench.workloads import Vocab

    vocab = Vocab.from_tokenizer_dir(tokenizer_dir)
    workload = load_trace_workload(bench.trace, trace, vocab)
    text = as_text(workload, vocab) if bench.peers else None
    span = max((s.arrival_s or 0.0) for s in workload)
    console.print(
        f"{workload.name}: {len(workload)} requests over {span:.0f} s ({len(workload) / max(span, 1e-9):.1f} req/s), "
        f"mean prompt {sum(len(s.prompt_token_ids or ()) for s in workload) / len(workload):.0f} tokens"
    )
    import tempfile

    rows: list[tuple[str, Any, TraceIdeals]] = []
    lines: list[str] = []
    miss_lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="token-gateway-trace-") as scratch:
        for fleet in bench.fleets:
            shape = FLEETS[fleet]
            ideals = trace_ideals(workload, shape.page_size, shape.kv_capacity_tokens * bench.workers)
            lines.append(ideals_line(fleet, shape, ideals))
            console.print(lines[-1])
            config = matrix_config(bench, shape)
            for policy in bench.policies:
                start = time.monotonic()
                try:
                    tracer = RouteTracer() if bench.requests_out else None
                    cell, misses = await run_trace_cell(workload, policy, config, tokenizer_dir, scratch,
                                                        ideals.unbounded, tracer)  # fmt: skip
                    cell.sim["miss_causes"] = misses
                    miss_lines.append(misses_line(fleet, policy, misses))
                    if tracer is not None:
                        write_rows(bench.requests_out, tracer.requests, fleet=fleet, policy=policy)
                        stalls = tracer.watch.lines() if tracer.watch is not None else []
                        for line in [*route_summary(tracer.requests), *("process stalls: " + x for x in stalls)]:
                            miss_lines.append(f"{fleet} {policy}: {line}")
                            console.print(miss_lines[-1])
                except (RuntimeError, OSError, ValueError) as exc:
                    from gateway_lab.bench.matrix import Cell

                    cell = Cell(workload.name, bench.workers, policy, "ours", None, error=str(exc)[:2000])
                rows.append((fleet, cell, ideals))
                row = cell_row(fleet, cell, ideals)
                console.print(" | ".join(row) + f"  ({time.monotonic() - start:.0f} s)")
            for gateway, policy in peer_plan(bench):
                start = time.monotonic()
                cell = await run_peer_cell(text, gateway, policy, dataclasses.replace(config, peers_python=bench.peers_python),
                                           tokenizer_dir, scratch, ideals.unbounded)  # fmt: skip
                rows.append((fleet, cell, ideals))
                console.print(" | ".join(cell_row(fleet, cell, ideals)) + f"  ({time.monotonic() - start:.0f} s)")
    return rows, lines + miss_lines


def run(args: argparse.Namespace) -> int:
    from gateway_lab.bench import results
    from gateway_lab.bench.results import Result, Table, write
    from gateway_lab.bench.workloads import default_tokenizer_dir

    bench = from_namespace(TraceBenchConfig, args)
    trace = from_namespace(TraceConfig, args)
    if not bench.trace or not Path(bench.trace).is_file():
        raise SystemExit("give --trace FILE (a Mooncake trace or JSONL prompts with timestamps)")
    if not bench.policies or bench.workers < 1:
        raise SystemExit("give at least one policy and one worker")
    if bench.peers and not Path(bench.peers_python).exists():
        raise SystemExit(f"{bench.peers_python} not found: run scripts/peers.sh first")
    if bench.requests_out:
        Path(bench.requests_out).write_bytes(b"")  # each run's rows go to a fresh file
    console = results.console(160)
    result = Result()
    try:
        rows, lines = asyncio.run(run_trace_bench(bench, trace, console, str(default_tokenizer_dir())))
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    table = Table.of(f"trace {Path(bench.trace).name}", HEADER, [cell_row(fleet, cell, ideals) for fleet, cell, ideals in rows])
    result.tables.append(table)
    result.notes += lines
    result.data = {
        "bench": dataclasses.asdict(bench),
        "trace": dataclasses.asdict(trace),
        "fleets": {f: dataclasses.asdict(FLEETS[f]) for f in bench.fleets},
        "cells": [{"fleet": f, "ideals": dataclasses.asdict(i), **c.to_dict()} for f, c, i in rows],
    }
    for fleet, cell, _ in rows:
        cell.judge(result, fleet)
    return write(result, console, json_path=bench.json_out, markdown_path=bench.markdown)
