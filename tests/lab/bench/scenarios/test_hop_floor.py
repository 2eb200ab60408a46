"""`token-gateway bench hop-floor` (gateway_lab.bench.scenarios.hop_floor): one tiny real run (a simulated worker process behind nginx's
gRPC proxy) reports both legs; no timing is asserted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = [sys.executable, "-m", "gateway", "bench", "hop-floor"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="nginx is not installed")
def test_tiny_run_reports_both_legs(tmp_path: Path) -> None:
    out = tmp_path / "hop.json"
    done = subprocess.run(
        [*COMMAND, "--calls", "4", "--json", str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(out.read_text())
    assert row["calls"] == 4 and row["direct_p50_ms"] > 0 and row["nginx_p50_ms"] > 0
    assert set(row) >= {"added_p50_ms", "added_p99_ms", "nginx_cpu_us_per_call", "load_1min"}
