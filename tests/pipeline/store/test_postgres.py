"""PostgreSQL specifics: two stores (two replicas) on one database see each other's
writes, and open concurrently without migrating twice."""

from __future__ import annotations

import asyncio
import time

from gateway.pipeline.store.base import StoredConversation, StoredItem
from gateway.pipeline.store.schema import LATEST
from tests.pipeline.store.conftest import fresh_postgres


async def test_two_replicas_share_one_database(postgres_dsn: str) -> None:
    import psycopg

    from gateway.pipeline.store.postgres import PostgresStore

    dsn = await fresh_postgres(postgres_dsn)
    a, b = PostgresStore(dsn), PostgresStore(dsn)
    await asyncio.gather(a.open(), b.open())
    try:
        await a.put_conversation(StoredConversation("conv_1", "k", time.time()))
        await asyncio.gather(
            a.add_items([StoredItem(f"a{i}", "conv_1", "k", time.time(), {"n": i}) for i in range(3)]),
            b.add_items([StoredItem(f"b{i}", "conv_1", "k", time.time(), {"n": i}) for i in range(3)]),
        )
        seen = [i.id for i in await b.list_items("k", "conv_1", limit=10)]
        assert sorted(seen) == ["a0", "a1", "a2", "b0", "b1", "b2"]
        assert [x for x in seen if x[0] == "a"] == ["a0", "a1", "a2"]  # each replica's order kept
    finally:
        await a.close()
        await b.close()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM gateway_schema")
        row = await cur.fetchone()
    assert row is not None and row[0] == LATEST  # each migration once, though both replicas opened it
