"""`token-gateway bench transports` (gateway_lab.bench.scenarios.transports): one small gsp run
per worker kind through an in-process gateway, each row with the hit rate the workers report."""

from __future__ import annotations

import argparse

import pytest

from gateway_lab.bench.scenarios import transports


def test_one_row_per_transport_with_the_workers_hit_rate(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args([
        "--groups", "2", "--prompts", "3", "--system-tokens", "256", "--question-tokens", "16", "--output-tokens", "2",
        "--workers", "2", "--concurrency", "1", "--policies", "cache_aware", "--transports", "grpc,http",
    ])  # fmt: skip
    assert transports.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gsp 2x3, ideal hit rate")
    rows = [dict(kv.split("=", 1) for kv in line.split()) for line in lines[1:]]
    assert [r["transport"] for r in rows] == ["grpc", "http"]
    for r in rows:
        assert r["ok"] == "6" and r["failed"] == "0" and r["worker_requests"] == "6"
        assert float(r["hit_rate"]) > 0.5  # one at a time: each group's system prompt is reused from its second prompt on (ideal 0.63)
