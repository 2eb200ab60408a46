"""The prefill gate through the whole stack (HTTP, engine, dispatch, a simulated worker):
requests sharing a long prefix with one still in prefill wait for its first token, then
find the prefix cached; /metrics shows the holds."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.http.conftest import Stack
from tests.e2e.http.test_metrics import scrape, value

SLOW_PREFILL = {"prefill_token_s": 4e-4, "time_scale": 1.0}  # ~0.4 s for the shared 1024 tokens
SYSTEM = list(range(1000, 1000 + 1024))


def prompt(n: int) -> list[int]:
    return [*SYSTEM, *range(20_000 + 100 * n, 20_000 + 100 * n + 32)]


@pytest.mark.stack(workers=1, policy="cache_aware", sim=SLOW_PREFILL)
async def test_followers_wait_for_the_first_prefill_and_hit_the_cache(stack: Stack) -> None:
    first = asyncio.ensure_future(stack.client.completions.create(model=stack.model, prompt=prompt(0), max_tokens=2))
    await asyncio.sleep(0.05)  # the first is in prefill on the worker
    followers = await asyncio.gather(*(
        stack.client.completions.create(model=stack.model, prompt=prompt(n), max_tokens=2) for n in (1, 2, 3)
    ))
    done = await first
    assert done.usage.prompt_tokens_details.cached_tokens == 0
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in followers]
    assert all(c >= 1024 - 16 for c in cached), cached  # the shared prefix, computed once
    m = await scrape(stack)
    model = stack.state.catalog.worker_model(stack.model)
    pool = {"model": model, "pool": "regular"}
    assert value(m, "token_gateway_prefill_gate_held_total", **pool) >= 1
    assert value(m, "token_gateway_prefill_gate_timeouts_total", **pool) == 0
    assert value(m, "token_gateway_prefill_gate_waiting", **pool) == 0
    assert value(m, "token_gateway_prefill_gate_in_prefill") == 0
    assert value(m, "token_gateway_prefill_gate_hold_seconds_total", **pool) > 0


@pytest.mark.stack(workers=1, policy="cache_aware", sim=SLOW_PREFILL, dispatch={"prefill_gate": False})
async def test_with_the_gate_off_nothing_is_held(stack: Stack) -> None:
    first = asyncio.ensure_future(stack.client.completions.create(model=stack.model, prompt=prompt(0), max_tokens=2))
    await asyncio.sleep(0.05)
    await asyncio.gather(*(
        stack.client.completions.create(model=stack.model, prompt=prompt(n), max_tokens=2) for n in (1, 2)
    ))
    await first
    m = await scrape(stack)
    assert value(m, "token_gateway_prefill_gate_held_total") == 0
