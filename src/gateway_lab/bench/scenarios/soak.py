"""Long soak of the gateway: mixed requests, random worker faults, client hang-ups.

Runs ``gateway_lab.bench.soak.run_soak`` (simulated workers + in-process gateway +
httpx client in one process) and prints what came back: outcomes per request
kind, latency, fault flips, leftover in-flight counters (must be none) and the
memory series after warm-up (RSS, and tracemalloc with ``--trace-memory``).
With ``--gateway-process`` the gateway is a ``token-gateway serve`` child and the
RSS series is that process's alone.
Exits non-zero if any request ended uncleanly, a counter was left non-zero, or
memory grew more than ``--max-growth-mb``. Run:

    token-gateway bench soak --requests 20000 --trace-memory --json soak.json
    token-gateway bench soak --requests 40000 --gateway-process --json soak-gw.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gateway_lab.bench.results import Result
from gateway_lab.bench.soak import SoakConfig, run_soak


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench soak --help``)."""
    d = SoakConfig()
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--disconnect-rate", type=float, default=d.disconnect_rate)
    p.add_argument("--fault-period-s", type=float, default=d.fault_period_s)
    p.add_argument("--policy", default=d.policy)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    p.add_argument("--memory-samples", type=int, default=40)
    p.add_argument("--trace-memory", action="store_true",
                   help="also trace the Python heap (slower); with --gateway-process, diff the gateway's heap snapshots")
    p.add_argument("--gateway-process", action="store_true",
                   help="run the gateway as its own `token-gateway serve` process and measure its RSS alone")
    p.add_argument("--max-growth-mb", type=float, default=24.0, help="fail if memory grew more than this after warm-up")
    p.add_argument("--json", type=Path, help="write the full report here")


def main(args: argparse.Namespace) -> int:
    """Run the soak with parsed flags; 0 when every request ended cleanly and memory stayed flat."""
    # SIGTERM exits through atexit, which stops a --gateway-process child (it has its own session).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # The gateway logs every retry and mid-stream failure as a warning; thousands are expected here.
    logging.basicConfig(level=logging.ERROR)
    cfg = SoakConfig(
        requests=args.requests, concurrency=args.concurrency, workers=args.workers, seed=args.seed,
        disconnect_rate=args.disconnect_rate, fault_period_s=args.fault_period_s, policy=args.policy,
        max_seconds=args.max_seconds, memory_samples=args.memory_samples, trace_memory=args.trace_memory,
        gateway_process=args.gateway_process,
    )
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run_soak(cfg, Path(tmp)))
    out = report.to_dict()
    console = Console()
    table = Table(title=f"soak: {report.completed} requests in {report.seconds:.1f} s ({report.requests_per_s:.1f}/s)")
    outcomes = ("ok", "clean_error", "disconnected", "unclean")
    table.add_column("kind")
    for o in outcomes:
        table.add_column(o, justify="right")
    for kind, counts in report.by_kind.items():
        table.add_row(kind, *(str(counts.get(o, 0)) for o in outcomes))
    table.add_row("all", *(str(report.outcomes.get(o, 0)) for o in outcomes), style="bold")
    console.print(table)
    console.print(f"statuses: {report.statuses}")
    console.print(f"fault flips: {report.fault_flips}")
    console.print(f"latency p50 {report.latency_p50_ms} ms, p99 {report.latency_p99_ms} ms")
    console.print(f"leftover in-flight counters: {report.leftover or 'none'}")
    if report.idle_gauges:
        console.print(f"gateway in-flight gauges at the end (/metrics): {report.idle_gauges}")
    console.print(f"RSS of the {report.rss_of}, MB after warm-up: {report.rss_mb}")
    console.print(f"RSS first {report.rss_mb[:1]}, last {report.rss_mb[-1:]}, growth {out['rss_growth_mb']} MB (first to last third)")
    if report.soak_rss_mb:
        console.print(f"soak process (workers + client) RSS MB: first {report.soak_rss_mb[:1]}, last {report.soak_rss_mb[-1:]}")
    if report.heap_traced_mb:
        console.print(f"gateway traced heap at each snapshot (tracing from the first): {report.heap_traced_mb} MB")
    for line in report.heap_growth:
        console.print(f"  heap growth in the gateway: {line}", highlight=False)
    if report.traced_mb:
        console.print(f"traced MB after warm-up: first {report.traced_mb[:1]}, last {report.traced_mb[-1:]}, growth {out['traced_growth_mb']} MB")
    if report.unclean_examples:
        console.print(f"unclean: {report.unclean_examples}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    flat = report.growth(report.rss_mb) < args.max_growth_mb and report.growth(report.traced_mb) < args.max_growth_mb
    verdict = Result()  # the rule every benchmark exits by
    verdict.require(report.all_clean, f"{report.outcomes.get('unclean', 0)} requests ended uncleanly")
    verdict.require(report.idle, "in-flight counters left non-zero")
    verdict.require(flat, f"memory grew {args.max_growth_mb:g} MB or more after warm-up")
    for reason in verdict.invalid:
        console.print(f"INVALID run: {reason}", markup=False, highlight=False)
    console.print("[green]PASS[/green]" if not verdict.exit_status else "[red]FAIL[/red]")
    return verdict.exit_status

