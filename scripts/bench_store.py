"""Cost of the history store per stored turn: memory vs SQLite vs PostgreSQL, one run.

Each round stores a response (a few-KB body with 256 generated ids), reads it back as a
``previous_response_id`` lookup does, and appends two conversation items. Prints wall
and this process's CPU time per round for each backend, measured in the same run
(compare the ratios, not absolute figures across runs). PostgreSQL is a throwaway
server from Debian's binaries (skipped when they are missing).

    .venv/bin/python scripts/bench_store.py --rounds 300
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.pipeline.store.base import Store, StoredConversation, StoredItem, StoredResponse
from gateway.pipeline.store.memory import MemoryStore
from gateway.pipeline.store.sqlite import SqliteStore


async def _round(store: Store, n: int) -> None:
    rid = f"resp_{n}"
    body = {"id": rid, "object": "response", "status": "completed",
            "output": [{"type": "message", "id": f"msg_{n}", "content": [{"type": "output_text", "text": "word " * 256}]}]}
    await store.put_response(StoredResponse(rid, "key", time.time(), body, [{"type": "message", "role": "user", "content": "q" * 200}],
                                            output_token_ids={f"msg_{n}": list(range(256))}))
    got = await store.get_response("key", rid)
    assert got is not None
    await store.add_items([StoredItem(f"in_{n}", "conv_b", "key", time.time(), {"type": "message"}),
                           StoredItem(f"out_{n}", "conv_b", "key", time.time(), body["output"][0], token_ids=list(range(256)))])


async def _measure(name: str, store: Store, rounds: int) -> None:
    await store.open()
    try:
        await store.put_conversation(StoredConversation("conv_b", "key", time.time()))
        for n in range(10):  # warm-up
            await _round(store, -n - 1)
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(rounds):
            await _round(store, n)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{name:10s} {1e3 * wall / rounds:7.3f} ms wall/round  {1e3 * cpu / rounds:7.3f} ms CPU/round")
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await _measure("memory", MemoryStore(), args.rounds)
        await _measure("sqlite", SqliteStore(Path(tmp) / "h.sqlite3"), args.rounds)
        try:
            from tests.postgres_server import PostgresUnavailable, postgres_server
        except ImportError:
            return
        try:
            with postgres_server() as dsn:
                from gateway.pipeline.store.postgres import PostgresStore

                await _measure("postgres", PostgresStore(dsn), args.rounds)
        except PostgresUnavailable as exc:
            print(f"postgres   skipped: {exc}")


if __name__ == "__main__":
    asyncio.run(main())
