"""`token-gateway demo` end to end: a simulated fleet, the gateway, the gsp workload, per policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Four workers that each hold about three of the eight groups' system prompts; requests go
# one at a time so every policy's outcome is reproducible; the simulated GPU costs nothing.
TINY = [
    "--workers", "4", "--groups", "8", "--prompts-per-group", "4", "--system-tokens", "256",
    "--question-tokens", "16", "--output-tokens", "4", "--kv-capacity-tokens", "896",
    "--concurrency", "1",
]  # fmt: skip


def _demo(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


def _children(pid: int) -> dict[int, str]:
    """Live (non-zombie) child processes of ``pid``: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            out[int(entry.name)] = cmdline
    return out


def test_demo_prefix_policies_beat_round_robin(tmp_path) -> None:
    out = tmp_path / "demo.json"
    proc = _demo(*TINY, "--time-scale", "0", "--json", str(out), "--plot", str(tmp_path / "demo.png"))
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, text
    for policy in ("round_robin", "prefix_hash", "cache_aware"):
        assert policy in text
    assert "cache hit rate" in text and "ideal (infinite cache)" in text
    runs = {r["label"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["round_robin", "prefix_hash", "cache_aware"]
    for r in runs.values():
        assert r["ok"] == 32 and r["errors"] == 0 and r["not_sent"] == 0
        assert r["completion_tokens"] == 32 * 4 and r["prompt_tokens"] == 32 * 272
        assert r["worker_hit_rate"] == pytest.approx(r["hit_rate"])  # usage agrees with the sims
        assert sum(r["spread"]["per_worker"].values()) == 32
    assert runs["cache_aware"]["hit_rate"] > runs["round_robin"]["hit_rate"] + 0.2
    assert runs["prefix_hash"]["hit_rate"] > runs["round_robin"]["hit_rate"] + 0.2
    assert runs["cache_aware"]["hit_rate"] <= runs["cache_aware"]["ideal_hit_rate"] + 1e-9
    assert (tmp_path / "demo.png").stat().st_size > 0


def test_ctrl_c_stops_every_process_it_started() -> None:
    # real sim costs: the run is still going when the interrupt comes
    proc = _demo(*TINY, "--policies", "round_robin", "cache_aware", start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        children: dict[int, str] = {}
        while time.monotonic() < deadline and not any(" serve " in c for c in children.values()):
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
            children = _children(proc.pid)
        assert any(" sim-worker " in c for c in children.values()), children
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        text, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, text
    assert "interrupted" in text
    assert _children_alive(children) == []


def _children_alive(pids: dict[int, str]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive
