"""`token-gateway bench latency-timeline` (gateway_lab.bench.scenarios.latency_timeline): one tiny real run (a simulated worker process and a
probed gateway process) reports every stage of a request in order; no timing is asserted."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = [sys.executable, "-m", "gateway", "bench", "latency-timeline"]


@pytest.mark.slow
def test_tiny_run_reports_the_stages_in_order(tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    argv = [*COMMAND, "--requests", "6", "--warm", "20", "--workers", "1", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    steps = [k for k in report if "->" in k]
    assert steps[0] == "client_send->recv"
    chain = [k.split("->") for k in steps if k != "written->client_recv"]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))  # each stage starts where the last ended
    for stage in ("parsed", "template", "tokenize", "selected", "call", "first_msg", "built", "written"):
        assert any(k.endswith("->" + stage) for k in steps), stage
    assert report["gateway_p50_us"] > 0 and report["direct_p50_us"] > 0 and report["inside_gateway_p50_us"] > 0
