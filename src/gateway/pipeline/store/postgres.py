"""The PostgreSQL store: one database shared by every process and replica.

``psycopg`` 3 with its async connection pool. Migrations run under a transaction-level
advisory lock, so replicas that start together apply each migration once. Queries are
the shared SQL of ``store.sql`` with ``?`` turned into psycopg's ``%s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.pipeline.store.schema import LATEST, VERSION_TABLE, statements
from gateway.pipeline.store.sql import Row, SqlStore

_SERIAL = "BIGSERIAL PRIMARY KEY"
_MIGRATION_LOCK = 0x6761_7465  # any constant both replicas agree on


def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresStore(SqlStore):
    name = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 8) -> None:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:  # the optional extra is missing
            raise RuntimeError("--history-backend postgres needs the 'postgres' extra (psycopg[binary,pool])") from exc
        self.dsn = dsn
        self._pool = AsyncConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False)

    async def open(self) -> None:
        await self._pool.open(wait=True, timeout=30)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(VERSION_TABLE)
            cur = await conn.execute("SELECT MAX(version) FROM gateway_schema")
            row = await cur.fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            for version in range(current + 1, LATEST + 1):
                for sql in statements(version, _SERIAL):
                    await conn.execute(sql)  # type: ignore[arg-type]  # our own constant SQL
                await conn.execute("INSERT INTO gateway_schema (version) VALUES (%s)", (version,))

    async def close(self) -> None:
        await self._pool.close()

    async def _run(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[Row], int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_pg(sql), tuple(params))  # type: ignore[arg-type]
            rows: list[Row] = list(await cur.fetchall()) if cur.description is not None else []
            return rows, cur.rowcount

    async def _run_many(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        out: list[list[Row]] = []
        async with self._pool.connection() as conn, conn.transaction():
            for sql, params in statements:
                cur = await conn.execute(_pg(sql), tuple(params))  # type: ignore[arg-type]
                out.append(list(await cur.fetchall()) if cur.description is not None else [])
        return out
