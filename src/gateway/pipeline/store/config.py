"""``--history-backend`` and friends: where responses and conversations are kept."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import option

BACKENDS = ["memory", "sqlite", "postgres"]


@dataclass
class HistoryConfig:
    history_backend: str = option("sqlite", "where stored responses and conversations live: 'sqlite' (embedded, survives restarts), 'postgres' (shared by processes and replicas: --history-dsn) or 'memory' (this process only)", choices=BACKENDS)
    history_path: str | None = option(None, "the SQLite file (default: token-gateway/history.sqlite3 under the user's data dir, $XDG_DATA_HOME)")
    history_dsn: str | None = option(None, "PostgreSQL connection string for --history-backend postgres (postgresql://user:pass@host/db)", secret=True)
    history_stale_s: float = option(15.0, "a background response whose process gave no sign of life for this long is recorded as failed by its readers, seconds")
    history_retention_s: float = option(30 * 24 * 3600.0, "stored responses and conversations older than this are deleted, seconds (0: kept for ever)")
