"""Flags of the routing sync (``serve --sync-url``)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import option


@dataclass
class SyncConfig:
    sync_url: str | None = option(
        None,
        "NATS server joining this gateway's routing view with other replicas' (nats://HOST:PORT); "
        "unset: no sync, except that --processes N > 1 starts a local nats-server on loopback",
    )
    sync_subject: str = option("token_gateway.sync", "NATS subject the replicas of one gateway set share")
    sync_heartbeat_s: float = option(
        0.25, "each process publishes its changed per-worker loads this often (all of them every 4th time), seconds"
    )
    sync_peer_timeout_s: float = option(3.0, "a peer not heard from this long has its load forgotten, seconds")
    sync_encoding: str = option(
        "blocks",
        "how a decision's prompt travels: tokens (every token id, every time) or blocks (a hash for the "
        "leading blocks already on the bus, token ids for the rest; same tree, fewer bytes)",
        choices=["tokens", "blocks"],
    )
    sync_block_tokens: int = option(64, "block size of --sync-encoding blocks, tokens")
    sync_flush_interval_s: float = option(
        0.005, "events of this long a window go out in one NATS message (0: one per event-loop tick), seconds"
    )
    sync_max_pending_bytes: int = option(
        8 * 1024 * 1024, "bytes buffered for NATS while it is unreachable; beyond that batches are dropped (and counted)"
    )
    sync_same_host: str = option(
        "memory",
        "how the processes of one serve --processes N set share decisions besides the bus: memory (each "
        "writes its decisions to a ring in shared memory that the others read before every choice, so a "
        "burst is not routed blind while the bus lags, and the requests it has in prefill, for the others' "
        "prefill gates) or bus (the bus only)",
        choices=["memory", "bus"],
    )
