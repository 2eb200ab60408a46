"""`token-gateway bench transports` (gateway_lab.bench.scenarios.transports): one small gsp run
per worker kind through a gateway process, each row with the hit rate the workers report and
the gateway's own CPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway_lab.bench.scenarios import transports


def test_one_row_per_transport_with_the_workers_hit_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, kinds = "zero", ["grpc", "http", "vllm"]  # the zero-cost workers' three faces, a gateway process in front
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    out_json, out_md = tmp_path / "t.json", tmp_path / "t.md"
    args = parser.parse_args([
        "--groups", "8", "--prompts", "3", "--system-tokens", "256", "--question-tokens", "16", "--output-tokens", "2",
        "--workers", "2", "--concurrency", "1", "--policies", "cache_aware", "--transports", ",".join(kinds),
        "--fleet", fleet, "--warm", "1", "--json", str(out_json), "--markdown", str(out_md),
    ])  # fmt: skip
    # 24 requests: enough gateway CPU to pass the process clock's tick (10 ms) on a fast host
    assert transports.main(args) == 0
    printed = capsys.readouterr().out
    assert "gsp 8x3, ideal hit rate" in printed and "machine:" in printed
    report = json.loads(out_json.read_text())
    rows = report["rows"]
    assert [r["transport"] for r in rows] == kinds
    assert list(rows[0]) == list(transports.COLUMNS)
    for r, raw in zip(rows, report["runs"], strict=True):
        assert r["ok"] == "24" and r["failed"] == "0" and r["fleet"] == fleet
        assert float(r["cpu_ms_per_request"]) > 0 and r["cpu_ms_per_request"] == f"{raw['cpu_ms_per_request']:.3f}"
        assert float(r["hit_rate"]) > 0.5  # one at a time: each group's system prompt is reused from its second prompt on (ideal 0.63)
    assert 0.5 < report["ideal_hit_rate"] < 0.7 and "load_avg_end" in report["machine"]
    markdown = out_md.read_text().splitlines()
    assert markdown[0] == "| " + " | ".join(transports.COLUMNS) + " |" and len(markdown) == 2 + len(kinds)


def test_the_table_formats_floats_and_keeps_the_columns_order() -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args(["--groups", "4", "--prompts", "2"])
    run = {
        "transport": "http", "gateway": "ours", "fleet": "sim", "step_ms": 0.0, "kv_events": False,
        "policy": "cache_aware", "ok": 8, "failed": 0, "hit_rate": 0.66049, "cpu_ms_per_request": 2.4213,
        "requests_per_s": 51.25,
    }  # fmt: skip
    result = transports.result([dict(reversed(run.items()))], 0.625, args)
    (table,) = result.tables
    assert table.title == "gsp 4x2, ideal hit rate 0.625" and table.labels == transports.LABELS
    assert table.rows == (("http", "ours", "sim", "0.000", "False", "cache_aware", "8", "0", "0.660", "2.421", "51.250"),)
    assert result.data["runs"][0]["hit_rate"] == 0.66049 and result.data["ideal_hit_rate"] == 0.625


def test_the_zero_fleet_serves_no_other_engines_grpc() -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args(["--fleet", "zero", "--transports", "vllm-grpc", "--groups", "1", "--prompts", "1", "--warm", "0"])
    with pytest.raises(SystemExit, match="serves grpc, http, vllm, not vllm-grpc"):
        transports.main(args)


def test_a_run_with_failed_requests_exits_non_zero(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    async def one(transport: str, policy: str, *_: object) -> dict[str, object]:
        failed = 1 if transport == "http" else 0
        return {
            "transport": transport, "gateway": "ours", "fleet": "sim", "step_ms": 0.0, "kv_events": False,
            "policy": policy, "ok": 6 - failed, "failed": failed, "hit_rate": 0.5, "cpu_ms_per_request": 1.0,
            "requests_per_s": 10.0,
        }  # fmt: skip

    monkeypatch.setattr(transports, "one", one)
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args(["--groups", "1", "--prompts", "2", "--policies", "cache_aware", "--warm", "1"])
    assert transports.main(args) == 1
    assert "INVALID run: http ours cache_aware: 1 of 6 requests failed" in capsys.readouterr().out
    monkeypatch.setattr(transports, "one", lambda *a, **k: one("grpc", "cache_aware"))
    assert transports.main(args) == 0
