"""SMG's command line on token-gateway (server/smg_compat.py), on a small parser: aliases
with unit conversions, ignored flags collected for a warning, refused flags, SMG's value
spellings, and aliases whose target this build lacks."""

from __future__ import annotations

import argparse
import logging

import pytest

from gateway.server.smg_compat import IGNORED, install, map_value, warn_ignored
from gateway.settings import explicit_flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serve")
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--log-level", dest="log_level", default="info")
    parser.add_argument("--max-concurrent-requests", dest="max_concurrent_requests", type=int, default=0)
    parser.add_argument("--max-attempts", dest="max_attempts", type=int, default=3)
    parser.add_argument("--backoff-base-s", dest="backoff_base_s", type=float, default=0.1)
    parser.add_argument("--otlp-traces-endpoint", dest="otlp_traces_endpoint", default=None)
    parser.add_argument("--worker-tls-ca-file", dest="worker_tls_ca_file", default=None)
    parser.add_argument("--queue-size", dest="max_queued_requests", type=int, default=1024)  # our own flag of that name
    install(parser)
    return parser


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    return capsys.readouterr().err


def test_aliases_convert_units_and_count_as_explicit() -> None:
    args = _parser().parse_args(["--retry-max-retries", "3", "--retry-initial-backoff-ms", "250"])
    assert args.max_attempts == 4 and args.backoff_base_s == 0.25  # retries + 1 attempts; ms -> s
    assert {"max_attempts", "backoff_base_s"} <= explicit_flags(args)


def test_switches_and_a_weak_switch_that_yields_to_an_explicit_value() -> None:
    assert _parser().parse_args(["--disable-retries"]).max_attempts == 1
    assert _parser().parse_args(["--enable-trace"]).otlp_traces_endpoint == "localhost:4317"
    # --enable-trace only fills a default; an endpoint given explicitly wins (marked explicit by the target's action)
    args = argparse.Namespace()
    from gateway.settings import mark_explicit

    mark_explicit(args, "otlp_traces_endpoint")
    args.otlp_traces_endpoint = "collector:4317"
    assert _parser().parse_args(["--enable-trace"], namespace=args).otlp_traces_endpoint == "collector:4317"


def test_ignored_flags_are_collected_and_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    args = _parser().parse_args(["--cache-threshold", "0.5", "--dp-aware"])
    assert [flag for flag, _ in getattr(args, IGNORED)] == ["--cache-threshold", "--dp-aware"]
    with caplog.at_level(logging.WARNING, logger="gateway"):
        lines = warn_ignored(args)
    assert len(lines) == 2 and lines[0].startswith("--cache-threshold has no effect in token-gateway: ")
    assert warn_ignored(_parser().parse_args([])) == []


def test_refused_flags_and_failed_checks_name_the_way_forward(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--log-dir is not supported: token-gateway logs to stderr" in _fails(["--log-dir", "/var/log"], capsys)
    assert "give one CA bundle" in _fails(["--ca-cert-paths", "a.pem", "b.pem"], capsys)
    assert _parser().parse_args(["--ca-cert-paths", "a.pem"]).worker_tls_ca_file == "a.pem"


def test_an_alias_without_its_target_in_this_build() -> None:
    parser = _parser()
    # --max-tree-size maps onto tree_max_tokens, which this small parser lacks: with a note it is ignored
    args = parser.parse_args(["--max-tree-size", "1000"])
    assert [flag for flag, _ in getattr(args, IGNORED)] == ["--max-tree-size"]
    assert not hasattr(args, "tree_max_tokens")


def test_our_own_flag_of_the_same_name_is_kept() -> None:
    assert _parser().parse_args(["--queue-size", "7"]).max_queued_requests == 7


def test_smg_value_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["--policy", "manual", "--log-level", "WARN", "--max-concurrent-requests", "-1"])
    assert (args.policy, args.log_level, args.max_concurrent_requests) == ("consistent_hash", "warning", 0)
    assert map_value("policy", "consistent_hashing") == "consistent_hash"
    assert map_value("log_level", "trace") == "debug"
    assert map_value("max_concurrent_requests", -1) == 0 and map_value("max_concurrent_requests", -2) == -2
    assert map_value("other", "manual") == "manual"
    with pytest.raises(ValueError, match="no bucket policy"):
        map_value("decode_policy", "bucket")
    assert "no bucket policy" in _fails(["--policy", "bucket"], capsys)
