"""Peer gateways launched for comparison (gateway_lab/bench/peers.py): the peer's command
line for one of our policies, and a child that dies before it is ready reported with its
log instead of waited on."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from gateway_lab.bench.peers import PEER_POLICIES, PeerProcess, peer_argv
from gateway_lab.bench.ports import free_port


def test_the_peers_command_line() -> None:
    argv = peer_argv("python3", "smg", ["grpc://a:1", "grpc://b:1"], "cache_aware", "/tok", 8000, 9000)
    assert argv[:4] == ["python3", "-m", "smg", "launch"]
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == ["grpc://a:1", "grpc://b:1"]
    assert argv[argv.index("--port") + 1] == "8000" and argv[argv.index("--prometheus-port") + 1] == "9000"
    assert "cache_aware" in PEER_POLICIES
    with pytest.raises(ValueError, match="unknown peer"):
        peer_argv("python3", "nginx", [], "cache_aware", "/tok", 1, 2)
    with pytest.raises(ValueError, match="no peer equivalent"):
        peer_argv("python3", "smg", [], "least_load_oracle", "/tok", 1, 2)


async def test_a_peer_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "peer.log"
    log.write_text("error: cannot bind port\n")
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
    await process.wait()
    peer = PeerProcess(process, f"http://127.0.0.1:{free_port()}", log)
    with pytest.raises(RuntimeError, match=r"peer exited \(code 3\)") as err:
        await peer.wait_ready(time.monotonic() + 5)
    assert "cannot bind port" in str(err.value)
    assert await peer.stop() == 3
    peer.remove_log()
    assert not log.exists()
    peer.remove_log()  # already gone: fine
