"""Graceful shutdown of `token-gateway serve`: SIGTERM stops intake, lets in-flight
requests finish within the grace period, aborts the rest on the workers, and exits 0."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet

# 20 ms per scheduler step: a 30-token answer takes ~0.6 s, a 400-token one ~8 s.
SLOW = SimConfig(step_base_s=0.02, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=1.0)


async def _gateway(fleet: SimFleet, tmp_path: Path, grace: float) -> ServeProcess:
    return await ServeProcess.start(
        fleet.urls, "round_robin",
        extra_args=["--shutdown-grace-s", str(grace), "--tokenizer-cache-dir", str(tmp_path / "tok")],
        log_dir=tmp_path,
    )


def _body(model: str, tokens: int) -> dict[str, object]:
    return {"model": model, "prompt": "tell me", "max_tokens": tokens, "stream": True, "ignore_eos": True}


async def _model(http: httpx.AsyncClient, url: str) -> str:
    return str((await http.get(url + "/v1/models")).json()["data"][0]["id"])


@pytest.mark.slow
async def test_sigterm_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    async with SimFleet.start(1, SLOW) as fleet:
        gw = await _gateway(fleet, tmp_path, grace=20)
        try:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
                async with http.stream("POST", gw.url + "/v1/completions", json=_body(model, 30)) as resp:
                    assert resp.status_code == 200
                    lines = resp.aiter_lines()
                    first = await anext(lines)
                    assert first.startswith("data:")
                    gw.process.send_signal(signal.SIGTERM)
                    await asyncio.sleep(0.2)
                    # No new work is accepted while the old finishes.
                    try:
                        late = await http.post(gw.url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
                        assert late.status_code == 503  # reached it on a kept-alive connection
                    except httpx.TransportError:
                        pass  # the listening socket is closed: refused
                    rest = [line async for line in lines]
            assert rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest
            assert sum(1 for line in [first, *rest] if line.startswith("data: {")) >= 30
            code = await asyncio.wait_for(gw.process.wait(), 15)
            assert code == 0
            assert fleet.workers[0].counters.finished == 1 and fleet.workers[0].counters.aborted == 0
        finally:
            await gw.stop()


@pytest.mark.slow
async def test_requests_past_the_grace_period_are_aborted(tmp_path: Path) -> None:
    async with SimFleet.start(1, SLOW) as fleet:
        gw = await _gateway(fleet, tmp_path, grace=0.5)
        try:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = await _model(http, gw.url)
                async with http.stream("POST", gw.url + "/v1/completions", json=_body(model, 400)) as resp:
                    lines = resp.aiter_lines()
                    await anext(lines)
                    sent = time.monotonic()
                    gw.process.send_signal(signal.SIGTERM)
                    got: list[str] = []
                    try:
                        async for line in lines:
                            got.append(line)
                    except httpx.HTTPError:
                        pass  # the connection is cut when the grace period ends
            assert "data: [DONE]" not in got or len(got) < 400
            code = await asyncio.wait_for(gw.process.wait(), 15)
            assert code == 0
            assert time.monotonic() - sent < 10
            worker = fleet.workers[0]
            deadline = time.monotonic() + 5
            # The counter lives in another object of this process; no event to wait on.
            while worker.counters.aborted == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            assert worker.counters.aborted == 1 and worker.counters.finished == 0
        finally:
            await gw.stop()
