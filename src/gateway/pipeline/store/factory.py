"""The store ``--history-backend`` names, and its retention sweep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import platformdirs

from gateway.pipeline.store.base import Store
from gateway.pipeline.store.config import HistoryConfig
from gateway.pipeline.store.memory import MemoryStore

log = logging.getLogger(__name__)


def default_sqlite_path() -> Path:
    return Path(platformdirs.user_data_dir("token-gateway")) / "history.sqlite3"


def make_store(config: HistoryConfig) -> Store:
    if config.history_backend == "memory":
        return MemoryStore()
    if config.history_backend == "sqlite":
        from gateway.pipeline.store.sqlite import SqliteStore

        return SqliteStore(config.history_path or default_sqlite_path())
    if config.history_backend == "postgres":
        if not config.history_dsn:
            raise ValueError("--history-backend postgres needs --history-dsn")
        from gateway.pipeline.store.postgres import PostgresStore

        return PostgresStore(config.history_dsn)
    raise ValueError(f"unknown history backend {config.history_backend!r}")


class Retention:
    """Deletes what is older than ``--history-retention-s``, at start and then every
    tenth of that period (at most hourly), in the background."""

    def __init__(self, store: Store, retention_s: float) -> None:
        self.store = store
        self.retention_s = retention_s
        self._task: asyncio.Task[None] | None = None

    async def sweep(self) -> int:
        if self.retention_s <= 0:
            return 0
        return await self.store.prune(time.time() - self.retention_s)

    def start(self) -> None:
        if self.retention_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        interval = min(3600.0, self.retention_s / 10)
        while True:
            try:
                gone = await self.sweep()
                if gone:
                    log.info("history retention: %d stored objects deleted", gone)
            except Exception:
                log.exception("history retention sweep failed")
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class History:
    """The process's store, opened on first use (a gateway whose clients never store a
    response never creates a file or connects to a database), with its retention sweep."""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self._store = make_store(config)
        self._retention = Retention(self._store, config.history_retention_s)
        self._opened = False
        self._lock = asyncio.Lock()

    def in_use(self) -> bool:
        """Whether the store is open or holds data already (a file, a shared database):
        what sweeping for other processes' runs may open without creating anything."""
        if self._opened or self.config.history_backend == "postgres":
            return True
        if self.config.history_backend == "sqlite":
            return Path(self.config.history_path or default_sqlite_path()).exists()
        return False

    async def store(self) -> Store:
        if not self._opened:
            async with self._lock:
                if not self._opened:
                    await self._store.open()
                    self._retention.start()
                    self._opened = True
        return self._store

    async def close(self) -> None:
        if self._opened:
            await self._retention.stop()
            await self._store.close()
            self._opened = False
