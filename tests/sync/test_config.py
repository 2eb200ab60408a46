"""The routing sync's flags (sync/config.py): off unless a NATS URL is given, blocks
encoding by default."""

from __future__ import annotations

from gateway.sync.config import SyncConfig


def test_defaults() -> None:
    config = SyncConfig()
    assert config.sync_url is None and config.sync_subject == "token_gateway.sync"
    assert (config.sync_encoding, config.sync_block_tokens) == ("blocks", 64)
    assert config.sync_peer_timeout_s > config.sync_heartbeat_s  # a peer is forgotten only after several missed beats
