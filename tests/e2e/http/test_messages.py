"""Anthropic Messages end to end: the official ``anthropic`` client against the gateway
over simulated workers (scripted replies in Qwen3's markup for tools and thinking)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest

from tests.e2e.http.conftest import Stack

WEATHER = {"name": "get_weather", "description": "weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _scripted(text: str) -> str:
    return f"please answer <<sim-reply>>{text}<</sim-reply>>"


@pytest.fixture
async def claude(stack: Stack) -> AsyncIterator[anthropic.AsyncAnthropic]:
    key = (stack.state.config.server.api_keys or ["none"])[0]
    client = anthropic.AsyncAnthropic(base_url=stack.url, api_key=key, max_retries=0, timeout=30)
    try:
        yield client
    finally:
        await client.close()


async def test_whole_message_with_system_and_history(stack: Stack, claude: anthropic.AsyncAnthropic) -> None:
    msg = await claude.messages.create(
        model=stack.model, max_tokens=40, system="You are terse.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": _scripted("Sure thing.")}]},
        ],
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == stack.model
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "Sure thing."  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    count = await claude.messages.count_tokens(
        model=stack.model, system="You are terse.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": _scripted("Sure thing.")}]},
        ],
    )
    assert count.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 10
    assert msg.usage.output_tokens > 0


async def test_stop_sequences_and_max_tokens(stack: Stack, claude: anthropic.AsyncAnthropic) -> None:
    msg = await claude.messages.create(
        model=stack.model, max_tokens=40, stop_sequences=["STOP"],
        messages=[{"role": "user", "content": _scripted("one two STOP three")}],
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"
    assert msg.content[0].text == "one two "  # type: ignore[union-attr]
    cut = await claude.messages.create(model=stack.model, max_tokens=3, messages=[{"role": "user", "content": "Tell me a story."}])
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


async def test_streamed_text_matches_whole(stack: Stack, claude: anthropic.AsyncAnthropic) -> None:
    messages = [{"role": "user", "content": _scripted("Streaming works fine.")}]
    kinds: list[str] = []
    async with claude.messages.stream(model=stack.model, max_tokens=40, messages=messages) as stream:  # type: ignore[arg-type]
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].text == "Streaming works fine."  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_use_and_tool_result(stack: Stack, claude: anthropic.AsyncAnthropic, stream: bool) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    messages = [{"role": "user", "content": _scripted(call)}]
    if stream:
        async with claude.messages.stream(model=stack.model, max_tokens=80, tools=[WEATHER], messages=messages) as s:  # type: ignore[arg-type, list-item]
            msg = await s.get_final_message()
    else:
        msg = await claude.messages.create(model=stack.model, max_tokens=80, tools=[WEATHER], messages=messages)  # type: ignore[arg-type, list-item]
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) == 1
    assert uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}
    # the client runs the tool and sends the result back: the turn continues from it
    follow = await claude.messages.create(
        model=stack.model, max_tokens=40, tools=[WEATHER],  # type: ignore[list-item]
        messages=[
            *messages,  # type: ignore[list-item]
            {"role": "assistant", "content": [b.model_dump() for b in msg.content]},  # type: ignore[misc]
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"},
                {"type": "text", "text": _scripted("It is sunny.")},
            ]},
        ],
    )
    assert follow.content[-1].text == "It is sunny." and follow.stop_reason == "end_turn"  # type: ignore[union-attr]


async def test_thinking_blocks(stack: Stack, claude: anthropic.AsyncAnthropic) -> None:
    text = "<think>\nweighing it\n</think>\n\nThe answer."
    messages = [{"role": "user", "content": _scripted(text)}]
    msg = await claude.messages.create(
        model=stack.model, max_tokens=60, thinking={"type": "enabled", "budget_tokens": 1024}, messages=messages,  # type: ignore[arg-type]
    )
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking.strip() == "weighing it"  # type: ignore[union-attr]
    assert msg.content[1].text.strip() == "The answer."  # type: ignore[union-attr]
    async with claude.messages.stream(
        model=stack.model, max_tokens=60, thinking={"type": "enabled", "budget_tokens": 1024}, messages=messages,  # type: ignore[arg-type]
    ) as s:
        streamed = await s.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in msg.content
    ]


@pytest.mark.stack(server={"api_keys": ["k1"]})
async def test_errors_in_anthropic_shape(stack: Stack, claude: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude.messages.create(model=stack.model, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as image:
        await claude.messages.create(
            model=stack.model, max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}],
        )
    assert "not supported" in image.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    wrong = anthropic.AsyncAnthropic(base_url=stack.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        await wrong.messages.create(model=stack.model, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    await wrong.close()
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    ok = await claude.messages.create(model=stack.model, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert ok.usage.output_tokens == 2  # the gateway is still up, the key works
