"""Cost of the history store per stored turn: memory vs SQLite (vs PostgreSQL with --dsn).

Each round stores a response (a few-KB body with 256 generated ids), reads it back as a
``previous_response_id`` lookup does, and appends two conversation items. Prints wall
and this process's CPU time per round for each backend, measured in the same run
(compare the ratios, not absolute figures across runs).
``token-gateway bench store [--rounds 300] [--dsn postgresql://...]``
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.pipeline.store.base import Store, StoredConversation, StoredItem, StoredResponse
from gateway.pipeline.store.memory import MemoryStore
from gateway.pipeline.store.sqlite import SqliteStore
from gateway_lab.bench import results


async def one_round(store: Store, n: int) -> None:
    rid = f"resp_{n}"
    body: dict[str, Any] = {"id": rid, "object": "response", "status": "completed",
            "output": [{"type": "message", "id": f"msg_{n}", "content": [{"type": "output_text", "text": "word " * 256}]}]}
    await store.put_response(StoredResponse(rid, "key", time.time(), body, [{"type": "message", "role": "user", "content": "q" * 200}],
                                            output_token_ids={f"msg_{n}": list(range(256))}))
    got = await store.get_response("key", rid)
    assert got is not None
    await store.add_items([StoredItem(f"in_{n}", "conv_b", "key", time.time(), {"type": "message"}),
                           StoredItem(f"out_{n}", "conv_b", "key", time.time(), body["output"][0], token_ids=list(range(256)))])


async def measure(name: str, store: Store, rounds: int) -> tuple[float, float]:
    """(wall, CPU) seconds per round, after a short warm-up; printed too."""
    await store.open()
    try:
        await store.put_conversation(StoredConversation("conv_b", "key", time.time()))
        for n in range(3):
            await one_round(store, -n - 1)
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(rounds):
            await one_round(store, n)
        wall, cpu = (time.perf_counter() - wall) / rounds, (time.process_time() - cpu) / rounds
        print(f"{name:10s} {1e3 * wall:7.3f} ms wall/round  {1e3 * cpu:7.3f} ms CPU/round")
        return wall, cpu
    finally:
        await store.close()


async def _run(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per round of each backend."""
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["memory"] = await measure("memory", MemoryStore(), args.rounds)
        out["sqlite"] = await measure("sqlite", SqliteStore(Path(tmp) / "h.sqlite3"), args.rounds)
    if args.dsn:
        from gateway.pipeline.store.postgres import PostgresStore

        out["postgres"] = await measure("postgres", PostgresStore(args.dsn), args.rounds)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's flags (``token-gateway bench NAME --help``)."""
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--dsn", default=None, help="also measure PostgreSQL at this DSN (an empty database is best)")
    parser.add_argument("--json", default="", help="also write the results here as JSON")
    parser.add_argument("--markdown", default="", help="also write the table here as Markdown")


def main(args: argparse.Namespace) -> int | None:
    """Run the scenario with parsed flags; the exit status."""
    measured = asyncio.run(_run(args))
    rows = [(name, f"{1e3 * wall:.3f}", f"{1e3 * cpu:.3f}") for name, (wall, cpu) in measured.items()]
    table = results.Table.of(f"one stored turn, {args.rounds} rounds", ("backend", "ms wall/round", "ms CPU/round"), rows, labels=1)
    data = {name: {"wall_s_per_round": wall, "cpu_s_per_round": cpu} for name, (wall, cpu) in measured.items()}
    return results.write(results.Result(tables=[table], data=data), json_path=args.json, markdown_path=args.markdown)
