"""One process of ``serve --processes N`` (server/process_set.py): membership from the
supervisor's environment, the set's status for /health, and a scrape answered for the
whole set over the siblings' unix sockets, each series labelled with its process."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.server.process_set import (
    ENV_COUNT,
    ENV_INDEX,
    ENV_RUN_DIR,
    STATUS_FILE,
    SetMember,
    in_process_set,
    member_from_env,
    merge_expositions,
)


def _exposition(value: float) -> bytes:
    registry = CollectorRegistry()
    Counter("token_gateway_requests", "requests", ["endpoint"], registry=registry).labels(endpoint="/x").inc(value)
    return generate_latest(registry)


def _samples(body: bytes) -> dict[tuple[str, str], float]:
    return {(s.labels["process"], s.name): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples if s.name.endswith("_total")}


def test_membership_comes_from_the_supervisors_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_INDEX, raising=False)
    assert not in_process_set() and member_from_env(lambda: b"") is None
    monkeypatch.setenv(ENV_INDEX, "1")
    monkeypatch.setenv(ENV_COUNT, "3")
    monkeypatch.setenv(ENV_RUN_DIR, str(tmp_path))
    member = member_from_env(lambda: b"")
    assert in_process_set() and member is not None and (member.index, member.count, member.run_dir) == (1, 3, tmp_path)


def test_health_reports_the_supervisors_account(tmp_path: Path) -> None:
    member = SetMember(0, 2, tmp_path, lambda: b"")
    assert member.describe() == {"this": 0, "expected": 2, "alive": None}  # no status file yet
    (tmp_path / STATUS_FILE).write_text('{"alive": [0, 1], "restarts": 1}')
    assert member.describe() == {"this": 0, "expected": 2, "alive": [0, 1], "restarts": 1}


def test_expositions_merge_by_family_with_a_process_label() -> None:
    merged = merge_expositions([(1, _exposition(5)), (0, _exposition(2))])
    assert _samples(merged) == {("0", "token_gateway_requests_total"): 2, ("1", "token_gateway_requests_total"): 5}
    assert merged.count(b"# HELP token_gateway_requests_total") == 1


async def test_a_scrape_answers_for_every_live_sibling() -> None:
    with tempfile.TemporaryDirectory(prefix="ps-") as folder:  # short: unix socket paths are limited
        run_dir = Path(folder)
        members = [SetMember(i, 3, run_dir, lambda i=i: _exposition(10 + i)) for i in range(3)]
        for m in members[:2]:  # process 2 is restarting: no socket
            await m.start()
        try:
            body = await members[0].federate(_exposition(10))
            assert _samples(body) == {("0", "token_gateway_requests_total"): 10, ("1", "token_gateway_requests_total"): 11}
            await members[1].stop()
            await members[1].start()  # its next process replaces the socket file the last one left
            body = await members[0].federate(_exposition(10))
            assert ("1", "token_gateway_requests_total") in _samples(body)
        finally:
            for m in members:
                await m.stop()
