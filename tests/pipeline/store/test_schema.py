"""The migrations: numbered, applied in order, the one dialect difference substituted."""

from __future__ import annotations

import sqlite3

from gateway.pipeline.store.schema import LATEST, MIGRATIONS, VERSION_TABLE, statements


def test_statements_substitute_the_serial_type() -> None:
    assert LATEST == len(MIGRATIONS) >= 3
    first = statements(1, "BIGSERIAL PRIMARY KEY")
    assert any("seq BIGSERIAL PRIMARY KEY" in s for s in first)
    assert not any("{serial}" in s for v in range(1, LATEST + 1) for s in statements(v, "X"))


def test_every_migration_applies_in_order_on_sqlite() -> None:
    db = sqlite3.connect(":memory:")
    db.execute(VERSION_TABLE)
    for version in range(1, LATEST + 1):
        for sql in statements(version, "INTEGER PRIMARY KEY AUTOINCREMENT"):
            db.execute(sql)
    columns = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
    assert {"id", "owner", "body", "output_token_ids", "heartbeat"} <= columns
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"responses", "conversations", "conversation_items", "response_events", "gateway_schema"} <= tables
