"""Misses by cause, live: /metrics and /admin/inspect charge each missed prompt token to a cause."""

from __future__ import annotations

import pytest

from tests.e2e.http.conftest import Stack
from tests.e2e.http.test_metrics import scrape, value


def prompt(seed: int, n: int = 320) -> list[int]:
    return [1000 + (seed * 7919 + i * 104_729) % 50_000 for i in range(n)]


@pytest.mark.stack(policy="round_robin", workers=2, sim={"kv_capacity_tokens": 512, "page_size": 16})
async def test_first_sight_elsewhere_and_evicted_show_in_metrics_and_inspect(stack: Stack) -> None:
    a, b, c = prompt(1), prompt(2), prompt(3)
    served = []
    for ids in (a, a, b, c, a):  # round robin: w0, w1, w0, w1, w0
        r = await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": ids, "max_tokens": 2})
        assert r.status_code == 200, r.text
        served.append((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    assert served[1] == 0 and served[4] == 0  # a on the other worker, then a again after b pushed it out
    m = await scrape(stack)
    worker_model = stack.state.registry.all()[0].model
    pool = {"model": worker_model, "pool": "regular"}
    tokens = {c: value(m, "token_gateway_routing_miss_tokens_total", cause=c, **pool)
              for c in ("first_sight", "held_elsewhere", "evicted", "in_prefill", "new_worker", "spilled_for_load")}
    assert tokens["first_sight"] == 3 * 319  # a, b, c: all but each last token
    assert tokens["held_elsewhere"] == 319  # a on w1 while w0 held it
    assert tokens["evicted"] == 319  # a back on w0, which had served it and lost it to b
    assert tokens["in_prefill"] == tokens["new_worker"] == tokens["spilled_for_load"] == 0
    assert value(m, "token_gateway_routing_misses_total", cause="evicted", **pool) == 1
    assert value(m, "token_gateway_routing_misses_total", **pool) == 5

    r = await stack.http.post("/admin/inspect", json={"model": stack.model, "input_ids": a})
    assert r.status_code == 200, r.text
    causes = r.json()["quality"]["miss_causes"]
    assert causes["evicted"] == {"requests": 1, "tokens": 319} and causes["_requests"] == 5
