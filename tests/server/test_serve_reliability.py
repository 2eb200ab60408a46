"""The reliability flags reach the gateway's config (watchdog, breaker window, resume)."""

from __future__ import annotations

import pytest

from gateway.cli import build_parser
from gateway.server.serve import config_from_args


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOKEN_GATEWAY_"):
            monkeypatch.delenv(key)


def test_flags_set_the_watchdog_breaker_and_resume_sections() -> None:
    args = build_parser().parse_args([
        "serve", "--worker-urls", "grpc://127.0.0.1:1", "--no-resume", "--max-resumes", "1",
        "--watchdog-floor-s", "2", "--watchdog-interval-s", "0.25", "--breaker-window-s", "10",
        "--breaker-failure-ratio", "0.5", "--breaker-half-open-probes", "3",
    ])
    c = config_from_args(args)
    assert not c.resume.resume and c.resume.max_resumes == 1
    assert c.watchdog.watchdog_floor_s == 2.0 and c.watchdog.watchdog_interval_s == 0.25
    b = c.health.breaker()
    assert (b.window_s, b.failure_ratio, b.half_open_probes) == (10.0, 0.5, 3)


def test_defaults_resume_and_watch() -> None:
    c = config_from_args(build_parser().parse_args(["serve", "--worker-urls", "grpc://127.0.0.1:1"]))
    assert c.resume.resume and c.resume.max_resumes == 3
    assert c.watchdog.watchdog_interval_s > 0 and c.dispatch.first_token_timeout_s == 180.0
