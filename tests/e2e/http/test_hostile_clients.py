"""Hostile clients and tenants on the HTTP door (issue 16): a request's cost is bounded
before work starts (batches take a slot per prompt, tokenizing takes a slot, hopeless
prompts are refused before the tokenizer runs), /metrics is not public off loopback,
one worker cannot be registered twice under two spellings, and client aborts are their
own outcome."""

from __future__ import annotations

import asyncio

import pytest

from gateway.server.http.app import metrics_guard
from gateway.workers.client import BadWorkerUrl, parse_worker_url
from tests.e2e.http.conftest import Stack

KEY, ADMIN = "sk-tenant", "sk-admin"
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
CAP = {"admission": {"max_concurrent_requests": 4, "max_queued_requests": 0}, "security": {"admin_api_key": ADMIN}}


@pytest.mark.stack(workers=1, server={"api_keys": [KEY]}, sections=CAP)
async def test_a_batch_takes_one_slot_per_prompt(stack: Stack) -> None:
    body = {"model": stack.model, "max_tokens": 1}
    over = await stack.http.post("/v1/completions", json={**body, "prompt": ["hi"] * 5}, headers=AUTH)
    assert over.status_code == 400 and over.json()["error"]["code"] == "batch_too_large"
    for path, payload in (("/v1/completions", {**body, "prompt": ["hi"] * 4}),
                          ("/generate", {"text": ["hi"] * 4, "sampling_params": {"max_new_tokens": 1}}),
                          ("/v1/embeddings", {"input": ["hi"] * 4})):
        ok = await stack.http.post(path, json=payload, headers=AUTH)
        assert ok.status_code == 200, (path, ok.text)
    held = await stack.state.admission.acquire("someone")  # one slot busy: a batch of 4 no longer fits
    try:
        full = await stack.http.post("/v1/completions", json={**body, "prompt": ["hi"] * 4}, headers=AUTH)
        assert full.status_code == 429
        # tokenizing costs CPU like a prompt: it takes a slot too (3 of 4 are free)
        assert (await stack.http.post("/v1/tokenize", json={"prompt": "hi"}, headers=AUTH)).status_code == 200
    finally:
        held.release()
    assert stack.state.admission.in_flight == 0


@pytest.mark.stack(workers=1, server={"api_keys": [KEY]},
                   sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0},
                             "security": {"admin_api_key": ADMIN}})
async def test_tokenize_detokenize_and_inspect_are_admitted(stack: Stack) -> None:
    held = await stack.state.admission.acquire("someone")
    try:
        for path, body, headers in (("/v1/tokenize", {"prompt": "hi"}, AUTH), ("/v1/detokenize", {"tokens": [1]}, AUTH),
                                    ("/admin/inspect", {"prompt": "hi"}, ADMIN_AUTH)):
            r = await stack.http.post(path, json=body, headers=headers)
            assert r.status_code == 429, (path, r.text)
    finally:
        held.release()
    assert (await stack.http.post("/v1/tokenize", json={"prompt": "hi"}, headers=AUTH)).status_code == 200


@pytest.mark.stack(workers=1, sim={"context_length": 2048})
async def test_a_hopeless_prompt_is_refused_before_the_tokenizer_runs(stack: Stack) -> None:
    entry = stack.state.catalog.get(None)
    tokenizer = entry.tokenizer
    assert (await stack.http.post("/v1/tokenize", json={"prompt": "word " * 500})).status_code == 200  # long enough to be checked
    for _ in range(400):  # the bound is computed once, off the event loop (bounded wait)
        if tokenizer.length_bound_ready:
            break
        await asyncio.sleep(0.05)
    assert tokenizer.length_bound_ready
    # A chat asks the tokenizer once per model for its think tags (memoized): ask it now,
    # so that what is counted below is only the work spent on the hopeless prompts.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert (await stack.http.post("/v1/chat/completions", json=chat)).status_code == 200
    calls: list[int] = []
    cache = entry.prompt_cache
    real_encode, real_cached, real_prompt = tokenizer.encode, cache.encode, cache.encode_prompt
    tokenizer.encode = lambda *a, **k: (calls.append(1), real_encode(*a, **k))[1]  # type: ignore[method-assign]
    cache.encode = lambda *a, **k: (calls.append(1), real_cached(*a, **k))[1]  # type: ignore[method-assign]
    cache.encode_prompt = lambda *a, **k: (calls.append(1), real_prompt(*a, **k))[1]  # type: ignore[method-assign]
    try:
        hopeless = " " * (128 * 2048 + 1000)  # at least 2055 tokens for a 2048-token model
        for path, body in (("/v1/completions", {"prompt": hopeless, "max_tokens": 1}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": hopeless}]}),
                           ("/v1/tokenize", {"prompt": hopeless})):
            r = await stack.http.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long", (path, r.text)
        assert calls == []
        ok = await stack.http.post("/v1/completions", json={"prompt": "short", "max_tokens": 1})
        assert ok.status_code == 200 and calls
    finally:
        del tokenizer.encode
        del cache.encode
        del cache.encode_prompt


@pytest.mark.stack(workers=1, server={"api_keys": [KEY], "host": "0.0.0.0"}, sections={"security": {"admin_api_key": ADMIN}})
async def test_metrics_need_a_key_off_loopback(stack: Stack) -> None:
    r = await stack.http.get("/metrics")
    assert r.status_code == 401 and "worker" not in r.text
    assert (await stack.http.get("/metrics", headers=AUTH)).status_code == 200
    assert (await stack.http.get("/metrics", headers=ADMIN_AUTH)).status_code == 200


@pytest.mark.stack(workers=1)
async def test_metrics_are_open_on_loopback_and_aborts_are_their_own_outcome(stack: Stack) -> None:
    assert metrics_guard(stack.state) is None
    body = {"model": stack.model, "prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
    stack.fleet.workers[0].config.time_scale = 1.0
    stack.fleet.workers[0].config.step_base_s = 0.01
    async with stack.http.stream("POST", "/v1/completions", json=body) as r:
        async for _ in r.aiter_lines():
            break  # leave mid-stream
    for _ in range(200):
        text = (await stack.http.get("/metrics")).text
        if 'outcome="aborted"' in text:
            break
        await asyncio.sleep(0.02)
    assert 'token_gateway_worker_streams_total{outcome="aborted"' in text or 'outcome="aborted"' in text


def test_worker_urls_have_one_spelling_and_ports_are_checked() -> None:
    assert parse_worker_url("grpc://localhost:5000").target == parse_worker_url("grpc://127.0.0.1:5000").target
    assert parse_worker_url("grpc://[0:0::1]:5000").target == "[::1]:5000"
    assert parse_worker_url("grpcs://LocalHost:5000").host == "localhost"  # TLS checks the name: kept
    for bad in ("grpc://127.0.0.1:99999", "grpc://127.0.0.1:0"):
        with pytest.raises(BadWorkerUrl):
            parse_worker_url(bad)


@pytest.mark.stack(workers=1, sections={"security": {"admin_api_key": ADMIN}})
async def test_worker_registration_and_flush_bodies_are_bounded(stack: Stack) -> None:
    port = stack.fleet.urls[0].rsplit(":", 1)[1]
    again = await stack.http.post("/workers", json={"url": f"grpc://localhost:{port}"}, headers=ADMIN_AUTH)
    assert again.status_code == 200 and again.json()["created"] is False  # the same worker, not a second one
    assert len(stack.state.registry.all()) == 1
    bad = await stack.http.post("/workers", json={"url": "grpc://127.0.0.1:99999"}, headers=ADMIN_AUTH)
    assert bad.status_code == 400
    big = await stack.http.post("/flush_cache", content=b" " * (1 << 20), headers=ADMIN_AUTH)
    assert big.status_code == 413


@pytest.mark.stack(workers=1, server={"api_keys": ["sk-one", "sk-two"]}, sections={"security": {"cache_salt_per_key": True}})
async def test_cache_salt_keeps_tenants_from_sharing_prefix_cache(stack: Stack) -> None:
    prompt = "the secret board minutes of ACME corporation, item seven: " * 20

    async def cached(key: str, salt: str | None = None) -> tuple[int, int]:
        body = {"model": stack.model, "prompt": prompt, "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
        r = await stack.http.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    first, tokens = await cached("sk-one")
    assert first == 0
    again, _ = await cached("sk-one")
    assert again > 0  # the same tenant shares its own cache
    other, other_tokens = await cached("sk-two")
    assert other == 0 and other_tokens == tokens  # the other tenant sees none of it
    salted, _ = await cached("sk-one", salt="project-x")
    assert salted == 0  # a per-request salt isolates further
    assert (await cached("sk-one", salt="project-x"))[0] > 0


def test_salt_prefix_is_stable_distinct_and_never_special() -> None:
    from gateway.pipeline.tenancy import SALT_TOKENS, effective_salt, salt_prefix

    class Tok:
        vocab_size = 1000
        added_tokens = {i: None for i in range(990, 1000)}

    a, b = salt_prefix("a", Tok()), salt_prefix("b", Tok())  # type: ignore[arg-type]
    assert len(a) == SALT_TOKENS and a == salt_prefix("a", Tok()) and a != b  # type: ignore[arg-type]
    assert all(0 <= t < 990 for t in a + b)
    assert effective_salt(None, None) is None and effective_salt("k", None) == "k"
    assert effective_salt("k", "r") not in ("k", "r")
