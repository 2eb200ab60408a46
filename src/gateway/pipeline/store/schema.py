"""The stores' SQL schema as numbered migrations, shared by SQLite and PostgreSQL.

A database records the versions applied in ``gateway_schema``; opening a store
applies the missing ones in order, inside one transaction (PostgreSQL under an
advisory lock, so replicas starting together migrate once). A migration is never
edited once released: a change is a new one appended to ``MIGRATIONS``.

``{serial}`` is the one type the two dialects spell differently (an auto-increasing
integer key: conversation order across processes).
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: responses, conversations, their items
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            previous_response_id TEXT,
            conversation_id TEXT,
            body TEXT NOT NULL,
            input_items TEXT NOT NULL,
            output_token_ids TEXT NOT NULL
        )""",
        "CREATE INDEX responses_created_at ON responses (created_at)",
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            metadata TEXT NOT NULL
        )""",
        "CREATE INDEX conversations_created_at ON conversations (created_at)",
        """CREATE TABLE conversation_items (
            seq {serial},
            id TEXT NOT NULL,
            conversation_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            item TEXT NOT NULL,
            token_ids TEXT,
            UNIQUE (conversation_id, id)
        )""",
        "CREATE INDEX conversation_items_order ON conversation_items (conversation_id, seq)",
    ),
    (  # 2: the event journal of background responses
        """CREATE TABLE response_events (
            response_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event TEXT NOT NULL,
            PRIMARY KEY (response_id, seq)
        )""",
    ),
    (  # 3: the heartbeat of the process running a background response
        "ALTER TABLE responses ADD COLUMN heartbeat DOUBLE PRECISION",
    ),
    (  # 4: what another process needs to continue a background run
        """CREATE TABLE background_runs (
            response_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            spec TEXT NOT NULL,
            generated TEXT NOT NULL,
            runner TEXT NOT NULL
        )""",
    ),
)

VERSION_TABLE = "CREATE TABLE IF NOT EXISTS gateway_schema (version INTEGER NOT NULL)"


def statements(version: int, serial: str) -> list[str]:
    """Migration ``version`` (1-based) in one dialect."""
    return [s.replace("{serial}", serial) for s in MIGRATIONS[version - 1]]


LATEST = len(MIGRATIONS)
