"""A worker that lies about its output cannot make the gateway return more than was
asked, hold a request forever or pass on ids no model has; /health answers meanwhile."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import openai
import pytest

from tests.e2e.hostile_worker import HostilePlan, gateway, health_probe, hostile_worker


@pytest.mark.parametrize("stream", [False, True])
async def test_a_flood_past_max_tokens_is_cut_at_max_tokens(tmp_path: Path, stream: bool) -> None:
    plan = HostilePlan(flood_tokens=300_000)
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw, health_probe(gw.url) as lat:
        if stream:
            chunks = await gw.client.completions.create(
                model=gw.model, prompt="hello", max_tokens=40, stream=True, stream_options={"include_usage": True})
            events = [c async for c in chunks]
            usage = events[-1].usage
            finish = [c.choices[0].finish_reason for c in events if c.choices and c.choices[0].finish_reason]
        else:
            resp = await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=40)
            usage, finish = resp.usage, [resp.choices[0].finish_reason]
        assert usage is not None and usage.completion_tokens == 40
        assert finish == ["length"]
        assert plan.sent == [300_000]
        assert all(w.load.in_flight == 0 for w in gw.state.registry.all())
    assert max(lat) < 0.1, f"/health took {max(lat):.3f}s"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_endless_stream_ends_at_max_tokens(tmp_path: Path, stream: bool) -> None:
    plan = HostilePlan(endless=True)
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw:
        body = {"model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        if stream:
            chunks = await gw.client.chat.completions.create(**body, stream=True)
            events = [c async for c in chunks]
            finish = [c.choices[0].finish_reason for c in events if c.choices and c.choices[0].finish_reason]
        else:
            resp = await asyncio.wait_for(gw.client.chat.completions.create(**body), 10)
            assert resp.usage is not None and resp.usage.completion_tokens == 16
            finish = [resp.choices[0].finish_reason]
        assert finish == ["length"]
        for _ in range(100):  # the worker's stream is cancelled: it stops sending
            if all(w.load.in_flight == 0 for w in gw.state.registry.all()):
                break
            await asyncio.sleep(0.01)
        sent = plan.sent[-1]
        await asyncio.sleep(0.05)
        assert plan.sent[-1] == sent < 100


@pytest.mark.parametrize("bad", [2**32 - 1, 10**9, 151_700])
async def test_ids_outside_the_vocabulary_are_a_worker_error(tmp_path: Path, bad: int, caplog: pytest.LogCaptureFixture) -> None:
    plan = HostilePlan(flood_tokens=3, token_id=bad)
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw:
        with caplog.at_level(logging.INFO):
            caplog.clear()
            with pytest.raises(openai.APIStatusError) as err:
                await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=8)
            assert err.value.status_code == 502
            assert "vocabulary" in err.value.message
            chunks = await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=8, stream=True)
            with pytest.raises(openai.APIError, match="vocabulary"):
                async for _ in chunks:
                    pass
        guard = [r for r in caplog.records if r.name == "gateway.pipeline.output_guard"]
        assert len(guard) == 2, [r.getMessage() for r in caplog.records]  # one line a request
        assert not any(r.exc_info for r in caplog.records)
        assert all(w.load.in_flight == 0 for w in gw.state.registry.all())
