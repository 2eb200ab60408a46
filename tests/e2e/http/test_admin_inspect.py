"""``POST /admin/inspect`` against a live in-process gateway over simulated workers."""

from __future__ import annotations

import pytest

from gateway.policies.hashing import block_hashes, prefix_key
from gateway.policies.ring import HashRing
from tests.e2e.http.conftest import Stack

SYSTEM = "You are a careful assistant. " * 40


@pytest.mark.stack(workers=3, policy="cache_aware")
async def test_inspect_predicts_the_cache_of_the_worker_that_served(stack: Stack) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
    resp = await stack.http.post("/v1/chat/completions", json={"model": stack.model, "messages": messages, "max_tokens": 4})
    assert resp.status_code == 200
    served = resp.headers["x-worker-id"]

    follow = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And 3+3?"}]
    r = await stack.http.post("/admin/inspect", json={"model": stack.model, "messages": follow})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["source"] == "gateway" and out["policy"] == "cache_aware" and out["tree"] is True

    # the ids are what the chat endpoint would route: same template, same tokenizer
    tok = await stack.http.post("/v1/tokenize", json={"model": stack.model, "messages": follow})
    ids = tok.json()["tokens"]
    assert [t["id"] for t in out["tokens"]] == ids and out["token_count"] == len(ids)
    assert out["text"].startswith("<|im_start|>system")
    assert [b["hash"] for b in out["blocks"]] == [b.hash for b in block_hashes(ids, 16)]

    rows = {w["worker_id"]: w for w in out["workers"]}
    assert set(rows) == {w.id for w in stack.state.registry.all()}
    page = rows[served]["page_size"]
    assert rows[served]["predicted_cached_tokens"] > 200 and rows[served]["predicted_cached_tokens"] % page == 0
    assert all(rows[w]["predicted_cached_tokens"] == 0 for w in rows if w != served)
    assert out["decision"]["choice"] == served and out["decision"]["reason"] == "cache_hit"
    # the pool's live routing quality rides along: one prompt offered, one stream finished
    quality = out["quality"]
    assert quality["offered_prompts"] == 1 and quality["finished"] == 1
    assert quality["prompt_tokens"] == quality["offered_prompt_tokens"] > 0
    assert quality["ideal_hit_rate"] == 0 and quality["achieved_hit_rate"] == 0  # nothing to reuse yet
    assert quality["load_only"] is False and quality["tokenizer_mismatches"] == 0
    assert quality["under_predicted"] == 0 and quality["hot_prefixes"] == [] and quality["load_only_models"] == []
    assert quality["hottest_prefix_load"] is None and quality["queued_prefill_weight"] == 1.0  # too few seen yet
    assert quality["decode_fill"] == 1.0  # one finish: too few to trust a fill below 1

    # the prediction is what the worker then reports as cached
    again = await stack.client.chat.completions.create(model=stack.model, messages=follow, max_tokens=2)  # type: ignore[arg-type]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == rows[served]["predicted_cached_tokens"]

    ring = out["ring"]
    assert ring["key"] == prefix_key(ids, 16, 256)
    assert ring["owner"] == HashRing(160, list(rows)).owner(ring["key"])


@pytest.mark.stack(workers=2, policy="prefix_hash")
async def test_inspect_text_and_ids_with_overrides_on_a_ring_policy(stack: Stack) -> None:
    r = await stack.http.post("/admin/inspect", json={"prompt": "hello world " * 30, "block_size": 8, "depth_tokens": 32})
    assert r.status_code == 200, r.text
    out = r.json()
    ids = [t["id"] for t in out["tokens"]]
    assert out["block_size"] == 8 and out["ring"]["depth_tokens"] == 32
    assert out["ring"]["key"] == prefix_key(ids, 8, 32)
    assert out["tree"] is False and out["workers"] == [] and out["notes"]
    # the live policy uses its own depth (256), so its decision may differ from the override
    assert out["decision"]["policy"] == "prefix_hash" and "ring_position" in out["decision"]

    by_ids = await stack.http.post("/admin/inspect", json={"input_ids": ids, "include_tokens": False})
    o2 = by_ids.json()
    assert o2["tokens"] == [] and o2["token_count"] == len(ids) and o2["text"] is None
    assert o2["ring"]["key"] == prefix_key(ids, 16, 256)
    assert o2["decision"]["choice"] == o2["ring"]["owner"]


@pytest.mark.stack(workers=1)
@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "text"),
        ({"prompt": "a", "input_ids": [1]}, 400, "text"),
        ({"input_ids": []}, 400, "input_ids"),
        ({"input_ids": [-1]}, 400, "input_ids"),
        ({"input_ids": [10**9]}, 400, "input_ids"),
        ({"messages": []}, 400, "messages"),
        ({"prompt": "a", "block_size": 0}, 400, "block_size"),
        ({"prompt": "a", "pool": "nope"}, 400, "pool"),
        ({"prompt": "a", "model": "no-such-model"}, 404, None),
    ],
)
async def test_inspect_bad_input_is_a_clear_4xx(stack: Stack, body: dict[str, object], status: int, param: str | None) -> None:
    r = await stack.http.post("/admin/inspect", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.stack(workers=1, server={"api_keys": ["sekret"]})
async def test_inspect_needs_the_key(stack: Stack) -> None:
    r = await stack.http.post("/admin/inspect", json={"prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["type"]
    ok = await stack.http.post("/admin/inspect", json={"prompt": "hi"}, headers={"authorization": "Bearer sekret"})
    assert ok.status_code == 200 and ok.json()["token_count"] >= 1


@pytest.mark.stack(workers=1, server={"api_keys": ["tenant"]}, sections={"security": {"admin_api_key": "adm"}})
async def test_inspect_is_admin_only_when_there_is_an_admin_key(stack: Stack) -> None:
    """The tree's answers reveal which prefixes other tenants sent (prefix probing)."""
    r = await stack.http.post("/admin/inspect", json={"prompt": "hi"}, headers={"authorization": "Bearer tenant"})
    assert r.status_code == 403 and r.json()["error"]["type"]
    ok = await stack.http.post("/admin/inspect", json={"prompt": "hi"}, headers={"authorization": "Bearer adm"})
    assert ok.status_code == 200


@pytest.mark.stack(workers=1, server={"api_keys": ["tenant"]},
                   sections={"security": {"admin_api_key": "adm", "inspect_access": "any"}})
async def test_inspect_access_any_lets_inference_keys_inspect(stack: Stack) -> None:
    ok = await stack.http.post("/admin/inspect", json={"prompt": "hi"}, headers={"authorization": "Bearer tenant"})
    assert ok.status_code == 200


@pytest.mark.stack(workers=3, policy="prefix_hash", server={"api_keys": ["k1"]})
async def test_cli_against_a_live_gateway_and_offline_agree_with_routing(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import json

    from gateway.cli import main

    prompt = "Summarise the history of the printing press in detail. " * 10
    resp = await stack.http.post(
        "/v1/completions", json={"model": stack.model, "prompt": prompt, "max_tokens": 2},
        headers={"authorization": "Bearer k1"},
    )
    assert resp.status_code == 200, resp.text
    served = resp.headers["x-worker-id"]

    argv = ["inspect", prompt, "--gateway", stack.url, "--api-key", "k1", "--json"]
    assert await asyncio.to_thread(main, argv) == 0
    live = json.loads(capsys.readouterr().out)
    assert live["source"] == "gateway" and live["ring"]["owner"] == served
    assert live["decision"]["choice"] == served

    offline = ["inspect", prompt, "--json", "--workers", *stack.fleet.urls]
    assert await asyncio.to_thread(main, offline) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["tokens"] == live["tokens"] and off["ring"] == live["ring"]

    # tables, and the gateway's own error message on a bad key
    assert await asyncio.to_thread(main, ["inspect", prompt, "--gateway", stack.url, "--api-key", "k1"]) == 0
    assert served in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["inspect", prompt, "--gateway", stack.url, "--api-key", "bad"]) == 2
    assert "401" in capsys.readouterr().err


@pytest.mark.stack(workers=2, policy="cache_aware")
async def test_cli_gateway_tables_show_predicted_cache(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from gateway.cli import main

    ids = list(range(5000, 5100))
    r = await stack.http.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text
    argv = ["inspect", "--input-ids", ",".join(map(str, ids)), "--gateway", stack.url, "--rows", "3"]
    assert await asyncio.to_thread(main, argv) == 0
    out = capsys.readouterr().out
    assert "what the radix tree predicts is cached" in out and "cache_hit" in out
    assert " 96 " in out  # 100 tokens held, 6 whole pages of 16 predicted


@pytest.mark.stack(workers=2, policy="cache_aware")
async def test_the_decode_fill_is_exactly_one_with_ignore_eos_and_below_with_eos(stack: Stack) -> None:
    """Finished requests teach the policy how much of max_tokens they decode (``on_output``):
    with ignore_eos exactly all of it, streamed or not, so the decode term is as before."""
    async def fill() -> float:
        r = await stack.http.post("/admin/inspect", json={"model": stack.model, "prompt": "x"})
        assert r.status_code == 200, r.text
        return float(r.json()["quality"]["decode_fill"])

    for i in range(20):
        body = {"model": stack.model, "prompt": f"question {i}", "max_tokens": 6, "ignore_eos": True, "stream": i % 2 == 1}
        resp = await stack.http.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
    assert await fill() == 1.0
    for i in range(40):  # answers that end at EOS long before a generous cap
        body = {"model": stack.model, "prompt": f"more {i}", "max_tokens": 400}
        assert (await stack.http.post("/v1/completions", json=body)).status_code == 200
    assert 0 < await fill() < 0.8
