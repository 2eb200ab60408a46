"""``--history-backend`` picks the store; retention sweeps by age."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.pipeline.store.base import StoredConversation
from gateway.pipeline.store.config import HistoryConfig
from gateway.pipeline.store.factory import Retention, default_sqlite_path, make_store
from gateway.pipeline.store.memory import MemoryStore
from gateway.pipeline.store.sqlite import SqliteStore


def test_backends_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(make_store(HistoryConfig(history_backend="memory")), MemoryStore)
    store = make_store(HistoryConfig(history_backend="sqlite", history_path=str(tmp_path / "x.db")))
    assert isinstance(store, SqliteStore) and store.path == tmp_path / "x.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_sqlite_path() == tmp_path / "xdg" / "token-gateway" / "history.sqlite3"
    with pytest.raises(ValueError, match="--history-dsn"):
        make_store(HistoryConfig(history_backend="postgres"))


async def test_retention_sweep() -> None:
    store = MemoryStore()
    now = time.time()
    await store.put_conversation(StoredConversation("conv_old", "", now - 1000))
    await store.put_conversation(StoredConversation("conv_new", "", now))
    assert await Retention(store, 0).sweep() == 0  # 0 keeps everything
    assert await Retention(store, 500).sweep() == 1
    assert await store.get_conversation("", "conv_old") is None
    assert await store.get_conversation("", "conv_new") is not None
