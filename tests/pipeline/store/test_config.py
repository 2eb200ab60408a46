"""``--history-*`` flags: their defaults and the backends they offer."""

from __future__ import annotations

import argparse

from gateway.pipeline.store.config import BACKENDS, HistoryConfig
from gateway.settings import add_options, from_namespace


def test_flags_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, HistoryConfig)
    config = from_namespace(HistoryConfig, parser.parse_args([]))
    assert (config.history_backend, config.history_path, config.history_dsn) == ("sqlite", None, None)
    assert config.history_retention_s > 0 and config.history_stale_s > 0
    chosen = from_namespace(HistoryConfig, parser.parse_args(["--history-backend", "postgres", "--history-dsn", "postgresql://x/y"]))
    assert (chosen.history_backend, chosen.history_dsn) == ("postgres", "postgresql://x/y")
    assert BACKENDS == ["memory", "sqlite", "postgres"]
