"""A long conversation validated in steps (endpoints/long_lists.py): the same model and the
same error as one ``parse_model`` call, with loop turns between the steps."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gateway.endpoints.long_lists import (
    STEP_ITEMS,
    has_long_list,
    map_in_steps,
    needs_steps,
    parse_model,
    parse_model_in_steps,
)
from gateway.protocol import limits
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import GatewayError, InvalidRequestError
from gateway.protocol.messages import MessagesRequest
from gateway.protocol.tokens import TokenizeRequest
from gateway.server.config import GatewayConfig
from tests.fake_transport import complete
from tests.server.http.gateway_app import gateway


def _conversation(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        kind = rnd.randrange(4)
        if kind == 0:
            out.append({"role": "user", "content": f"question {i}"})
        elif kind == 1:
            out.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}], "name": None})
        elif kind == 2:
            out.append({"role": "assistant", "tool_calls": [{"id": f"c{i}", "function": {"name": "f", "arguments": {"x": i}}}]})
        else:
            out.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": "42"})
    return out


def _error(call: Any) -> tuple[str | None, str]:
    try:
        call()
    except GatewayError as exc:
        return exc.param, str(exc)
    raise AssertionError("no error")


async def _steps_error(model: Any, data: Any) -> tuple[str | None, str]:
    with pytest.raises(GatewayError) as err:
        await parse_model_in_steps(model, data)
    return err.value.param, str(err.value)


async def test_a_long_conversation_gives_the_model_one_call_gives() -> None:
    for count in (1, STEP_ITEMS, STEP_ITEMS + 1, 3 * STEP_ITEMS + 7):
        data = {"messages": _conversation(count, seed=count), "max_tokens": 5, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ]}
        assert needs_steps(ChatCompletionRequest, data) == (count > STEP_ITEMS)
        stepped = await parse_model_in_steps(ChatCompletionRequest, data)
        assert stepped == parse_model(ChatCompletionRequest, data)
        assert stepped.template_messages() == parse_model(ChatCompletionRequest, data).template_messages()
    data = {"messages": _conversation(2 * STEP_ITEMS)}
    assert await parse_model_in_steps(TokenizeRequest, data) == parse_model(TokenizeRequest, data)
    anthropic = {"max_tokens": 4, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": str(i)}]}
        for i in range(2 * STEP_ITEMS + 1)
    ]}
    assert needs_steps(MessagesRequest, anthropic)
    assert await parse_model_in_steps(MessagesRequest, anthropic) == parse_model(MessagesRequest, anthropic)


async def test_a_bad_message_is_named_at_its_place_in_the_whole_list() -> None:
    count = 4 * STEP_ITEMS
    for index in (0, 1, STEP_ITEMS - 1, STEP_ITEMS, 2 * STEP_ITEMS + 5, count - 1):
        for bad in (
            {"role": "user"},  # a model validator's ParamError
            {"role": "robot", "content": "x"},  # a field's type
            {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},  # a field validator
            {"role": "tool", "content": "x"},
            "not a message",
        ):
            messages = _conversation(count)
            messages[index] = bad
            data = {"messages": messages}
            expected = _error(lambda d=data: parse_model(ChatCompletionRequest, d))
            assert await _steps_error(ChatCompletionRequest, data) == expected
            assert expected[0] is not None and expected[0].startswith(f"messages.[{index}]")


async def test_other_fields_and_the_cap_are_checked_as_before() -> None:
    messages = _conversation(2 * STEP_ITEMS)
    bad_field = {"messages": messages, "n": 0}
    assert await _steps_error(ChatCompletionRequest, bad_field) == _error(lambda: parse_model(ChatCompletionRequest, bad_field))
    over = {"messages": [{"role": "user", "content": "x"}] * (limits.MAX_MESSAGES + 1)}
    assert not needs_steps(ChatCompletionRequest, over)  # refused before any message is validated
    param, text = await _steps_error(ChatCompletionRequest, over)
    assert param == "messages" and f"at most {limits.MAX_MESSAGES}" in text
    tokenize_over = {"messages": over["messages"]}
    with pytest.raises(InvalidRequestError, match=f"at most {limits.MAX_MESSAGES}"):
        parse_model(TokenizeRequest, tokenize_over)
    assert has_long_list(ChatCompletionRequest) and has_long_list(TokenizeRequest) and not has_long_list(CompletionRequest)
    assert not needs_steps(CompletionRequest, {"prompt": "x", "messages": messages})
    assert not needs_steps(ChatCompletionRequest, {"messages": "text"})
    assert not needs_steps(ChatCompletionRequest, [1, 2])


async def test_the_loop_turns_between_steps() -> None:
    """Another task runs between the steps: the validation does not hold the loop whole."""
    data = {"messages": [{"role": "user", "content": "x"}] * (8 * STEP_ITEMS)}
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = turns
    req = await parse_model_in_steps(ChatCompletionRequest, data)
    task.cancel()
    assert len(req.messages) == 8 * STEP_ITEMS and turns - before >= 8


async def test_long_conversations_through_the_doors() -> None:
    """Chat, tokenize and Responses with more than a step's messages: the worker gets the
    prompt the tokenizer gives, and a bad message is named at its place."""
    count = 3 * STEP_ITEMS + 1
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(count)]
    async with gateway(GatewayConfig()) as (state, client):
        await state.add_worker("grpc://w1:1")
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        tokens = (await client.post("/v1/tokenize", json={"messages": messages})).json()["tokens"]
        worker.script(complete([9707], finish="length", prompt=len(tokens)))
        r = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert list(worker.requests[-1].tokenized.input_ids) == tokens
        worker.script(complete([9707], finish="length", prompt=len(tokens)))
        r = await client.post("/v1/responses", json={"input": messages, "max_output_tokens": 1, "store": False})
        assert r.status_code == 200, r.text
        assert list(worker.requests[-1].tokenized.input_ids) == tokens
        bad = [*messages[:1200], {"role": "user", "content": 5}, *messages[1201:]]
        r = await client.post("/v1/chat/completions", json={"messages": bad, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages.[1200].content"), r.text
        over = [{"role": "user", "content": "x"}] * (limits.MAX_MESSAGES + 1)
        r = await client.post("/v1/tokenize", json={"messages": over})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        assert len(worker.requests) == 2


async def test_map_in_steps_is_the_list_comprehension_with_turns_between() -> None:
    for count in (0, 1, STEP_ITEMS, STEP_ITEMS + 1, 3 * STEP_ITEMS + 2):
        items = list(range(count))
        assert await map_in_steps(str, items) == [str(i) for i in items]
    req = parse_model(ChatCompletionRequest, {"messages": _conversation(2 * STEP_ITEMS + 3)})
    assert await map_in_steps(type(req.messages[0]).to_template, req.messages) == req.template_messages()
