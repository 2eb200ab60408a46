"""`token-gateway serve` may start with no workers and take them later through POST /workers."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import httpx
import openai
import pytest

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from tests.e2e.http.conftest import ZERO_COST

pytestmark = pytest.mark.slow


async def test_serve_with_no_workers_then_register_one(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
            "--tokenizer-cache-dir", str(tmp_path / "tok")]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        async with asyncio.timeout(60):
            ready = json.loads(await proc.stdout.readline())  # type: ignore[union-attr]
        assert ready["event"] == "ready" and ready["workers"] == 0
        url = ready["url"]
        async with httpx.AsyncClient(base_url=url, timeout=30) as http, SimFleet.start(1, SimConfig(**ZERO_COST)) as fleet:
            assert (await http.get("/readiness")).status_code == 503
            added = await http.post("/workers", json={"url": fleet.urls[0]})
            assert added.status_code == 201, added.text
            assert (await http.get("/readiness")).status_code == 200
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            model = (await client.models.list()).data[0].id
            done = await client.completions.create(model=model, prompt="hello", max_tokens=3)
            assert done.usage is not None and done.usage.completion_tokens == 3
            await client.close()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await proc.wait()
    stderr = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert "no workers yet" in stderr
    assert proc.returncode == 0
