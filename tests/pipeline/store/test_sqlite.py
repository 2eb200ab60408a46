"""SQLite specifics: data survives a reopen, migrations run once and are recorded."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from gateway.pipeline.store.base import StoredConversation, StoredItem
from gateway.pipeline.store.schema import LATEST
from gateway.pipeline.store.sqlite import SqliteStore


async def test_survives_reopen_and_migrates_once(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "h.sqlite3"
    first = SqliteStore(path)
    await first.open()
    await first.put_conversation(StoredConversation("conv_1", "k", time.time(), {"m": "v"}))
    await first.add_items([StoredItem("msg_1", "conv_1", "k", time.time(), {"type": "message"}, token_ids=[7])])
    await first.close()

    second = SqliteStore(path)
    await second.open()  # the schema is there: nothing to apply, nothing lost
    try:
        conv = await second.get_conversation("k", "conv_1")
        assert conv is not None and conv.metadata == {"m": "v"}
        items = await second.list_items("k", "conv_1")
        assert [(i.id, i.token_ids) for i in items] == [("msg_1", [7])]
    finally:
        await second.close()
    with sqlite3.connect(path) as db:
        versions = [r[0] for r in db.execute("SELECT version FROM gateway_schema ORDER BY version")]
    assert versions == list(range(1, LATEST + 1))
