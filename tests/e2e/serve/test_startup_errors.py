"""What a new operator gets wrong at start is one error line and an exit, before any
worker is probed: impossible limits, an impossible port, a busy port."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

pytestmark = pytest.mark.slow


async def _serve(*flags: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--worker-urls", "grpc://127.0.0.1:9", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
    assert not out
    return proc.returncode or 0, err.decode()


@pytest.mark.parametrize(("flags", "says"), [
    (["--max-n", "-5"], "--max-n must be at least 1, got -5"),
    (["--max-tokens-cap", "-1"], "--max-tokens-cap must be at least 0, got -1"),
    (["--max-batch-size", "0"], "--max-batch-size must be at least 1, got 0"),
    (["--max-concurrent-requests", "-3"], "--max-concurrent-requests must be at least 0, got -3"),
    (["--port", "99999"], "--port must be a port in 0-65535, got 99999"),
])
async def test_impossible_settings_are_one_line_at_parse_time(flags: list[str], says: str) -> None:
    code, err = await _serve(*flags)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and "PyTorch" not in line]
    assert len(lines) == 1 and says in lines[0], err


async def test_a_busy_port_is_one_line_before_any_worker_is_probed() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = await _serve("--port", str(port), "--probe-timeout-s", "30")
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
    assert "not added" not in err  # the worker was never probed
