"""Every store backend behind the same fixture: the contract tests run on each."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.pipeline.store.base import Store
from gateway.pipeline.store.memory import MemoryStore
from gateway.pipeline.store.sqlite import SqliteStore
from tests.postgres_server import PostgresUnavailable, postgres_server


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    try:
        with postgres_server() as dsn:
            yield dsn
    except PostgresUnavailable as exc:
        print(f"PostgreSQL tests skipped: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")


async def fresh_postgres(dsn: str) -> str:
    """A new empty database on the shared server, so each test starts from no schema."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return dsn.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "memory":
        backend = MemoryStore()
    elif request.param == "sqlite":
        backend = SqliteStore(tmp_path / "history.sqlite3")
    else:
        from gateway.pipeline.store.postgres import PostgresStore

        dsn = request.getfixturevalue("postgres_dsn")
        backend = PostgresStore(await fresh_postgres(dsn))
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()
