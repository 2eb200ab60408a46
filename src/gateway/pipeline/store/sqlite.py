"""The SQLite store: the default, embedded, survives restarts, needs no setup.

One ``aiosqlite`` connection per process (SQLite's own thread, off the event loop),
in WAL mode (synchronous NORMAL: no fsync per commit) with a busy timeout, so the processes of ``serve --processes N`` can
share one file. An asyncio lock keeps one statement or transaction at a time on
the connection (the transactions of two coroutines must not interleave).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from gateway.pipeline.store.schema import LATEST, VERSION_TABLE, statements
from gateway.pipeline.store.sql import Row, SqlStore

_SERIAL = "INTEGER PRIMARY KEY AUTOINCREMENT"


class SqliteStore(SqlStore):
    name = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(self.path, isolation_level=None)
        await db.execute("PRAGMA busy_timeout = 10000")
        await db.execute("PRAGMA journal_mode = WAL")
        # WAL with NORMAL sync: a commit survives the process being killed (not a power cut
        # in the last moments), without an fsync per stored turn.
        await db.execute("PRAGMA synchronous = NORMAL")
        self._db = db
        async with self._lock:
            await db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see it done
            try:
                await db.execute(VERSION_TABLE)
                async with db.execute("SELECT MAX(version) FROM gateway_schema") as cur:
                    row = await cur.fetchone()
                current = int(row[0]) if row and row[0] is not None else 0
                for version in range(current + 1, LATEST + 1):
                    for sql in statements(version, _SERIAL):
                        await db.execute(sql)
                    await db.execute("INSERT INTO gateway_schema (version) VALUES (?)", (version,))
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("the store is not open")
        return self._db

    async def _run(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[Row], int]:
        db = self._conn()
        async with self._lock, db.execute(sql, tuple(params)) as cur:
            rows: list[Row] = list(await cur.fetchall())
            return rows, cur.rowcount

    async def _run_many(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        db = self._conn()
        out: list[list[Row]] = []
        async with self._lock:
            await db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    async with db.execute(sql, tuple(params)) as cur:
                        out.append(list(await cur.fetchall()))
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise
        return out
