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
    table, notes = out_md.read_text().split("\n\n")
    markdown = table.splitlines()
    assert markdown[0] == "| " + " | ".join(transports.COLUMNS) + " |" and len(markdown) == 2 + len(kinds)
    assert notes.startswith("round 1: load ") and "at the end" in notes  # one round: no per-cell table


def test_the_table_formats_floats_and_keeps_the_columns_order() -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    args = parser.parse_args(["--groups", "4", "--prompts", "2"])
    run = {
        "round": 1, "transport": "http", "gateway": "ours", "fleet": "sim", "step_ms": 0.0, "kv_events": False,
        "policy": "cache_aware", "ok": 8, "failed": 0, "hit_rate": 0.66049, "cpu_ms_per_request": 2.4213,
        "requests_per_s": 51.25,
    }  # fmt: skip
    result = transports.result([dict(reversed(run.items()))], 0.625, args)
    (table,) = result.tables
    assert table.title == "gsp 4x2, ideal hit rate 0.625" and table.labels == transports.LABELS
    assert table.rows == (("1", "http", "ours", "sim", "0.000", "False", "cache_aware", "8", "0", "0.660", "2.421", "-", "51.250"),)
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


def test_rounds_rotate_the_transports_so_each_runs_in_every_place_both_ways() -> None:
    kinds = ["grpc", "http", "vllm"]
    orders = [transports.rotated(kinds, rnd) for rnd in range(1, 7)]
    assert orders == [
        ["grpc", "http", "vllm"], ["vllm", "http", "grpc"], ["http", "vllm", "grpc"],
        ["grpc", "vllm", "http"], ["vllm", "grpc", "http"], ["http", "grpc", "vllm"],
    ]  # fmt: skip
    for kind in kinds:
        assert sorted(order.index(kind) for order in orders) == [0, 0, 1, 1, 2, 2]
    assert transports.rotated(["grpc"], 2) == ["grpc"]


def test_repeat_reports_each_cells_range_and_its_ratio_to_grpc_within_each_round(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cpu = {("grpc", 1): 2.0, ("http", 1): 2.6, ("grpc", 2): 3.0, ("http", 2): 3.3}  # the host got busier in round 2
    calls: list[str] = []

    async def one(transport: str, policy: str, *_: object) -> dict[str, object]:
        calls.append(transport)
        rnd = 1 + (len(calls) - 1) // 2
        return {
            "transport": transport, "gateway": "ours", "fleet": "zero", "step_ms": 0.0, "kv_events": False,
            "policy": policy, "ok": 6, "failed": 0, "hit_rate": 0.5, "cpu_ms_per_request": cpu[(transport, rnd)],
            "requests_per_s": 10.0 * rnd,
        }  # fmt: skip

    monkeypatch.setattr(transports, "one", one)
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    out_json = tmp_path / "t.json"
    args = parser.parse_args([
        "--groups", "1", "--prompts", "2", "--policies", "cache_aware", "--warm", "1", "--transports", "grpc,http",
        "--repeat", "2", "--json", str(out_json),
    ])  # fmt: skip
    assert transports.main(args) == 0
    assert calls == ["grpc", "http", "http", "grpc"]
    printed = capsys.readouterr().out
    assert "round 1: load" in printed and "round 2: load" in printed
    report = json.loads(out_json.read_text())
    runs_table, cells = report["rows"].values()
    assert [(r["round"], r["transport"], r["cpu_vs_grpc"]) for r in runs_table] == [
        ("1", "grpc", "1.000"), ("1", "http", "1.300"), ("2", "http", "1.100"), ("2", "grpc", "1.000"),
    ]  # fmt: skip
    assert list(cells[0]) == list(transports.SUMMARY)
    http = next(c for c in cells if c["transport"] == "http")
    assert http["cpu_ms_per_request"] == "2.950 (2.600-3.300)" and http["requests_per_s"] == "15.0 (10.0-20.0)"
    assert http["cpu_vs_grpc"] == "1.20 (1.10-1.30)" and http["cpu_vs_grpc_per_round"] == "1.30 1.10"


def test_without_a_grpc_run_there_is_no_ratio() -> None:
    run = {"round": 1, "transport": "http", "gateway": "ours", "policy": "cache_aware", "cpu_ms_per_request": 2.0, "requests_per_s": 9.0}
    assert transports.with_ratios([run])[0]["cpu_vs_grpc"] is None
    (row,) = transports.summary(transports.with_ratios([run, run | {"round": 2}])).records()
    assert row["cpu_vs_grpc"] == "-" and row["cpu_vs_grpc_per_round"] == "-"


def test_repeat_takes_one_round_or_more() -> None:
    parser = argparse.ArgumentParser()
    transports.add_arguments(parser)
    with pytest.raises(SystemExit, match="1 or more"):
        transports.main(parser.parse_args(["--repeat", "0"]))
