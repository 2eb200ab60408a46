"""`token-gateway bench transports` (gateway_lab.bench.scenarios.transports): one small gsp run
per worker kind through a gateway process, each row with the hit rate the workers report and
the gateway's own CPU."""

from __future__ import annotations

import argparse

import pytest

from gateway_lab.bench.scenarios import transports


def test_one_row_per_transport_with_the_workers_hit_rate(capsys: pytest.CaptureFixture[str]) -> None:
    fleet, kinds = "zero", ["grpc", "http"]  # the zero-cost workers' two faces, a gateway process in front
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args([
        "--groups", "2", "--prompts", "3", "--system-tokens", "256", "--question-tokens", "16", "--output-tokens", "2",
        "--workers", "2", "--concurrency", "1", "--policies", "cache_aware", "--transports", ",".join(kinds),
        "--fleet", fleet, "--warm", "1",
    ])  # fmt: skip
    assert transports.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gsp 2x3, ideal hit rate")
    rows = [dict(kv.split("=", 1) for kv in line.split()) for line in lines[1:]]
    assert [r["transport"] for r in rows] == kinds
    for r in rows:
        assert r["ok"] == "6" and r["failed"] == "0" and r["fleet"] == fleet
        assert float(r["cpu_ms_per_request"]) > 0
        assert float(r["hit_rate"]) > 0.5  # one at a time: each group's system prompt is reused from its second prompt on (ideal 0.63)


def test_the_zero_fleet_serves_grpc_and_http_only() -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args(["--fleet", "zero", "--transports", "vllm", "--groups", "1", "--prompts", "1", "--warm", "0"])
    with pytest.raises(SystemExit, match="serves grpc, http"):
        transports.main(args)
