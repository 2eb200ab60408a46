"""`token-gateway bench peer-cost` (gateway_lab.bench.scenarios.peer_cost): its figures, its
stall verdict, its run orders and table, and one tiny real run (zero-cost workers and a
gateway process; no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway_lab.bench.scenarios import peer_cost
from gateway_lab.bench.scenarios.overhead import Reply

COMMAND = [sys.executable, "-m", "gateway", "bench", "peer-cost"]


def test_load_row_divides_cpu_by_requests_and_tokens() -> None:
    done = [Reply(total_s=0.010 * (i + 1), ttft_s=0.005, tokens=8, prompt_tokens=32, cached_tokens=16, events=4) for i in range(4)]
    row = peer_cost.load_row(done, wall=2.0, cpu=0.004)
    assert row["requests"] == 4 and row["requests_per_s"] == 2.0 and row["tokens_per_event"] == 2.0
    assert peer_cost.load_row(done[:1] and [Reply(0.01, 0.01, 8)], wall=1.0, cpu=0.001)["tokens_per_event"] is None
    assert row["cpu_ms_per_request"] == 1.0 and row["cpu_us_per_token"] == 125.0
    assert row["p50_ms"] == 25.0 and row["ttft_p50_ms"] == 5.0 and row["ttft_p99_ms"] == 5.0 and row["hit_rate"] == 0.5


def test_stalls_name_a_long_tail_and_a_collapsed_rate() -> None:
    fine = {"requests_per_s": 500.0, "p50_ms": 100.0, "p99_ms": 300.0}
    assert peer_cost.stalls({"ours": fine, "smg": dict(fine, requests_per_s=700.0)}, 10.0) == []
    tail = dict(fine, p99_ms=5000.0)
    slow = dict(fine, requests_per_s=15.0)
    why = peer_cost.stalls({"ours": fine, "smg": tail, "before": slow}, 10.0)
    assert len(why) == 2 and why[0].startswith("smg: p99 5000") and why[1].startswith("before: 15 requests/s")


def test_rounds_alternate_the_order() -> None:
    assert peer_cost.ordered(["ours", "smg"], 1) == ["ours", "smg"]
    assert peer_cost.ordered(["ours", "smg"], 2) == ["smg", "ours"]


def test_table_gives_median_range_ratio_and_a_verdict_per_round() -> None:
    def row(rate: float, cpu: float, p99: float = 30.0) -> dict[str, float | None]:
        return {"requests_per_s": rate, "p50_ms": 10.0, "p99_ms": p99, "ttft_p50_ms": 10.0, "cpu_ms_per_request": cpu,
                "cpu_us_per_token": cpu * 125, "system_share": 0.1, "hit_rate": None}  # fmt: skip

    rounds = [
        {"round": 1, "order": ["ours", "smg"], "gateways": {"ours": {"short": row(500, 0.6)}, "smg": {"short": row(800, 0.3)}}},
        {"round": 2, "order": ["smg", "ours"], "gateways": {"smg": {"short": row(900, 0.4, p99=500.0)}, "ours": {"short": row(600, 0.8)}}},
    ]
    lines = peer_cost.table(rounds, ["ours", "smg"], ["short"], 10.0).markdown().splitlines()
    assert lines[0] == "| load | figure | ours | smg | ours / smg |"
    assert "| short | CPU ms/request | 0.7 (0.6-0.8) | 0.35 (0.3-0.4) | 2.00x |" in lines
    assert not any("hit rate" in line for line in lines)  # no gateway had one
    assert "round 1 (ours then smg), short: no stall" in lines
    assert any(line.startswith("round 2 (smg then ours), short: STALLED: smg: p99 500") for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_tiny_run_reports_every_load(tmp_path: Path, transport: str) -> None:
    out = tmp_path / "peer.json"
    argv = [
        *COMMAND, "--gateways", "ours", "--worker-transport", transport, "--repeat", "1", "--workers", "2", "--fleet-processes", "1",
        "--requests", "48", "--warm", "4", "--concurrency", "4", "--short-max-tokens", "3", "--stream-max-tokens", "5",
        "--gsp-workers", "2", "--gsp-groups", "1", "--gsp-prompts-per-group", "3", "--gsp-system-tokens", "64",
        "--gsp-question-tokens", "8", "--gsp-output-tokens", "4", "--gsp-warm", "1", "--worker-step-s", "0.001",
        "--gsp-concurrency", "2", "--gsp-kv-tokens", "4096", "--gsp-prefill-token-s", "0.0001",
        "--cap-s", "30", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    figures = report["rounds"][0]["gateways"]["ours"]
    assert figures["short"]["requests"] == 48 and figures["short-stream"]["requests"] == 48
    assert figures["gsp-paced"]["requests"] == 3 and figures["gsp-paced"]["hit_rate"] > 0
    assert figures["short"]["cpu_ms_per_request"] > 0
    verdicts = [line for line in report["table"].splitlines() if line.startswith("round 1 (ours), ")]
    assert [v.split(", ")[1].split(":")[0] for v in verdicts] == ["short", "short-stream", "gsp-paced"]



@pytest.mark.slow
def test_the_grpc_door_and_the_think_load(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    argv = [
        *COMMAND, "--gateways", "ours", "smg", "--door", "grpc", "--loads", "short", "short-stream", "short-stream-think",
        "--repeat", "1", "--workers", "2", "--fleet-processes", "1", "--requests", "48", "--warm", "4", "--concurrency", "4",
        "--short-max-tokens", "3", "--stream-max-tokens", "24", "--cap-s", "30", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["gateways"] == ["ours"]  # SMG has no such door: not run
    figures = report["rounds"][0]["gateways"]["ours"]
    for load in ("short", "short-stream", "short-stream-think"):
        assert figures[load]["requests"] == 48 and figures[load]["cpu_ms_per_request"] > 0, load
    assert figures["short-stream-think"]["cpu_us_per_token"] > 0


def test_cpu_counts_the_process_and_its_children() -> None:
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while sum(peer_cost.user_system_s(child.pid)) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = os.times()
        total = sum(peer_cost.user_system_s(os.getpid()))
        assert total >= mine.user + mine.system - 0.02 + 0.29  # this process, and its child's busy loop
    finally:
        child.kill()
        child.wait()
