"""--prometheus-port: /metrics on a port of its own, in the ready line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


async def test_metrics_on_their_own_port(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0",
        "--tokenizer-cache-dir", str(tmp_path / "tok"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            ready = json.loads(await proc.stdout.readline())  # type: ignore[union-attr]
        metrics_url = ready["metrics_url"]
        assert metrics_url.endswith("/metrics") and metrics_url != ready["url"] + "/metrics"
        async with httpx.AsyncClient(timeout=10) as http:
            got = await http.get(metrics_url)
            assert got.status_code == 200 and "token_gateway_requests_total" in got.text
            assert got.headers["content-type"].startswith("text/plain")
            assert (await http.get(metrics_url.replace("/metrics", "/v1/models"))).status_code == 404
            assert (await http.get(ready["url"] + "/health")).status_code == 200
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await proc.wait()
    assert proc.returncode == 0
