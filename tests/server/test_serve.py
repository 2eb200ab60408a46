"""``token-gateway serve``'s settings (server/serve.py): flags over the environment over a
config file, each concern's section built from them, SMG's spellings accepted, PD pools
parsed, the reliability sections (watchdog, breaker window, resume), bad settings an exit status 2,
and --print-config a usable config without secrets."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest
import yaml

from gateway import cli
from gateway.server import serve


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_become_each_sections_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKEN_GATEWAY_POLICY", raising=False)
    config = serve.config_from_args(_args(
        "--worker-urls", "grpc://a:1", "grpc://b:1", "--policy", "manual", "--max-concurrent-requests", "8",
        "--prefill", "grpc://p:1", "8998", "--decode", "grpc://d:1",
    ))
    assert config.server.worker_urls == ["grpc://a:1", "grpc://b:1"]
    assert config.policy.policy == "consistent_hash"  # SMG's "manual"
    assert config.admission.max_concurrent_requests == 8
    assert [(p.url, p.bootstrap_port) for p in config.pd.prefill] == [("grpc://p:1", 8998)]
    assert [d.url for d in config.pd.decode] == ["grpc://d:1"]


def test_the_environment_and_a_config_file_sit_under_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "gw.yaml"
    file.write_text("policy: round_robin\nport: 31000\nmax_queued_requests: 7\n")
    monkeypatch.setenv("TOKEN_GATEWAY_PORT", "32000")
    config = serve.config_from_args(_args("--config", str(file), "--max-queued-requests", "9"))
    assert config.policy.policy == "round_robin"  # the file
    assert config.server.port == 32000  # the environment beats the file
    assert config.admission.max_queued_requests == 9  # the flag beats both


def test_bad_settings_exit_with_status_2() -> None:
    assert serve.run(_args("--dns-workers", "no-port")) == 2
    assert serve.run(_args("--prefill", "grpc://p:1", "not-a-port")) == 2


def test_print_config_shows_the_settings_but_not_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.run(_args("--print-config", "--api-keys", "sk-secret", "--policy", "prefix_hash")) == 0
    out = capsys.readouterr().out
    assert "sk-secret" not in out and "# api_keys: set, not printed" in out
    settings = yaml.safe_load(out)
    assert settings["policy"] == "prefix_hash" and "api_keys" not in settings


def test_logging_is_text_or_json_at_the_level_asked() -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        serve.setup_logging("warning", True)
        assert root.level == logging.WARNING and len(root.handlers) == 1
        assert type(root.handlers[0].formatter).__name__ == "JsonFormatter"
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])


# The reliability flags reach the gateway's config (watchdog, breaker window, resume).
@pytest.fixture
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOKEN_GATEWAY_"):
            monkeypatch.delenv(key)


@pytest.mark.usefixtures("_clean_env")
def test_flags_set_the_watchdog_breaker_and_resume_sections() -> None:
    args = cli.build_parser().parse_args([
        "serve", "--worker-urls", "grpc://127.0.0.1:1", "--no-resume", "--max-resumes", "1",
        "--watchdog-floor-s", "2", "--watchdog-interval-s", "0.25", "--breaker-window-s", "10",
        "--breaker-failure-ratio", "0.5", "--breaker-half-open-probes", "3",
    ])
    c = serve.config_from_args(args)
    assert not c.resume.resume and c.resume.max_resumes == 1
    assert c.watchdog.watchdog_floor_s == 2.0 and c.watchdog.watchdog_interval_s == 0.25
    b = c.health.breaker()
    assert (b.window_s, b.failure_ratio, b.half_open_probes) == (10.0, 0.5, 3)


@pytest.mark.usefixtures("_clean_env")
def test_defaults_resume_and_watch() -> None:
    c = serve.config_from_args(cli.build_parser().parse_args(["serve", "--worker-urls", "grpc://127.0.0.1:1"]))
    assert c.resume.resume and c.resume.max_resumes == 3
    assert c.watchdog.watchdog_interval_s > 0 and c.dispatch.first_token_timeout_s == 180.0
