"""Long soak of the gateway: mixed requests, random worker faults, client hang-ups.

Runs ``gateway.bench.soak.run_soak`` (simulated workers + in-process gateway +
httpx client in one process) and prints what came back: outcomes per request
kind, latency, fault flips, leftover in-flight counters (must be none) and the
memory series after warm-up (RSS, and tracemalloc with ``--trace-memory``).
Exits non-zero if any request ended uncleanly, a counter was left non-zero, or
memory grew more than ``--max-growth-mb``. Run:

    .venv/bin/python scripts/soak.py --requests 20000 --trace-memory --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gateway.bench.soak import SoakConfig, run_soak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--trace-memory", action="store_true", help="also sample tracemalloc (slower)")
    p.add_argument("--max-growth-mb", type=float, default=24.0, help="fail if memory grew more than this after warm-up")
    p.add_argument("--json", type=Path, help="write the full report here")
    args = p.parse_args()
    # The gateway logs every retry and mid-stream failure as a warning; thousands are expected here.
    logging.basicConfig(level=logging.ERROR)
    cfg = SoakConfig(
        requests=args.requests, concurrency=args.concurrency, workers=args.workers, seed=args.seed,
        disconnect_rate=args.disconnect_rate, fault_period_s=args.fault_period_s, policy=args.policy,
        max_seconds=args.max_seconds, memory_samples=args.memory_samples, trace_memory=args.trace_memory,
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
    console.print(f"RSS MB after warm-up: first {report.rss_mb[:1]}, last {report.rss_mb[-1:]}, growth {out['rss_growth_mb']} MB")
    if report.traced_mb:
        console.print(f"traced MB after warm-up: first {report.traced_mb[:1]}, last {report.traced_mb[-1:]}, growth {out['traced_growth_mb']} MB")
    if report.unclean_examples:
        console.print(f"unclean: {report.unclean_examples}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    flat = report.growth(report.rss_mb) < args.max_growth_mb and report.growth(report.traced_mb) < args.max_growth_mb
    ok = report.all_clean and report.idle and flat
    console.print("[green]PASS[/green]" if ok else "[red]FAIL[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
