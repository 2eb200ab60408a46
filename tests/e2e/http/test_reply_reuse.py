"""Reply token reuse end to end: the second turn's prompt carries the first turn's
generated ids, so the worker (which cached prompt + output) hits the whole reply."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.http.conftest import Stack

SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 12}
PAGE = 16  # the simulated worker's page size


async def _turn(stack: Stack, messages: list[dict[str, str]], *, stream: bool, seed: int) -> tuple[str, Any]:
    body: dict[str, Any] = {"max_tokens": 64, "seed": seed, "extra_body": {"ignore_eos": True}}
    if not stream:
        resp = await stack.client.chat.completions.create(model=stack.model, messages=messages, **body)  # type: ignore[call-overload]
        return resp.choices[0].message.content or "", resp.usage
    parts: list[str] = []
    usage = None
    chunks = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, stream=True, stream_options={"include_usage": True}, **body
    )  # type: ignore[call-overload]
    async for chunk in chunks:
        usage = chunk.usage or usage
        parts.extend(c.delta.content or "" for c in chunk.choices)
    return "".join(parts), usage


async def _two_turns(stack: Stack, *, stream: bool, seed: int = 5) -> tuple[Any, Any, str]:
    turn1 = [SYSTEM, {"role": "user", "content": "Tell me a story."}]
    reply, u1 = await _turn(stack, turn1, stream=stream, seed=seed)
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    _, u2 = await _turn(stack, turn2, stream=stream, seed=seed + 1)
    return u1, u2, reply


def _round_trips(stack: Stack, reply: str) -> bool:
    """Whether re-encoding the reply's text happens to give the generated ids back."""
    tok = stack.state.catalog.get(stack.model).tokenizer
    return len(tok.encode(reply, add_special_tokens=False)) == 64


@pytest.mark.stack(workers=1)
@pytest.mark.parametrize("stream", [False, True])
async def test_second_turn_hits_prompt_and_reply(stack: Stack, stream: bool) -> None:
    u1, u2, reply = await _two_turns(stack, stream=stream)
    assert u1.completion_tokens == 64 and not _round_trips(stack, reply)
    covered = (u1.prompt_tokens + u1.completion_tokens) // PAGE * PAGE  # what the worker cached
    assert u2.prompt_tokens_details.cached_tokens >= covered
    entry = stack.state.catalog.get(stack.model)
    assert entry.reply_cache is not None
    st = entry.reply_cache.stats()
    assert (st.recorded, st.spliced_spans, st.spliced_tokens) == (2, 1, 64)

    # /admin/inspect tokenizes the conversation as the chat endpoint does
    turn2 = [SYSTEM, {"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    r = await stack.http.post("/admin/inspect", json={"model": stack.model, "messages": turn2})
    assert r.status_code == 200, r.text
    assert r.json()["token_count"] == u2.prompt_tokens
    metrics = (await stack.http.get("/metrics")).text
    assert 'token_gateway_reply_cache_spliced_tokens_total{model="' in metrics


@pytest.mark.stack(workers=1, server={"reply_token_reuse": False})
async def test_off_switch_re_encodes_the_reply(stack: Stack) -> None:
    u1, u2, reply = await _two_turns(stack, stream=False)
    assert stack.state.catalog.get(stack.model).reply_cache is None
    assert not _round_trips(stack, reply)
    covered = (u1.prompt_tokens + u1.completion_tokens) // PAGE * PAGE
    # the re-encoded reply diverges from the generated ids: the worker's hit stops inside it
    assert u1.prompt_tokens // PAGE * PAGE <= u2.prompt_tokens_details.cached_tokens < covered


@pytest.mark.stack(workers=1, server={"api_keys": ["key-a", "key-b"]}, sections={"security": {"cache_salt_per_key": True}})
async def test_replies_do_not_cross_tenants(stack: Stack) -> None:
    import openai

    a = stack.client
    b = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="key-b", max_retries=0, timeout=30)
    try:
        turn1 = [SYSTEM, {"role": "user", "content": "Tell me a story."}]
        reply = (await a.chat.completions.create(model=stack.model, messages=turn1, max_tokens=64, seed=5, extra_body={"ignore_eos": True})).choices[0].message.content  # type: ignore[arg-type]
        turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        await b.chat.completions.create(model=stack.model, messages=turn2, max_tokens=4)  # type: ignore[arg-type]
        replies = stack.state.catalog.get(stack.model).reply_cache
        assert replies is not None and replies.stats().spliced_spans == 0  # key b never sees key a's ids
        await a.chat.completions.create(model=stack.model, messages=turn2, max_tokens=4)  # type: ignore[arg-type]
        assert replies.stats().spliced_spans == 1
    finally:
        await b.close()
