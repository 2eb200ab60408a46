"""Anthropic Messages -> chat completion: the mapping each block type and option gets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.endpoints.messages import _stop_reason, to_chat
from gateway.endpoints.turn import TurnEnd
from gateway.protocol.errors import GatewayError, InvalidRequestError
from gateway.protocol.messages import MessagesRequest, anthropic_error


def _req(**kw: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **kw})


def test_system_history_tool_use_and_results() -> None:
    req = _req(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}],
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "need a tool", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                {"type": "text", "text": "thanks"},
            ]},
        ],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        stop_sequences=["END"], temperature=0.5, top_k=5,
    )
    chat = to_chat(req)
    msgs = chat.template_messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert msgs[0]["content"] == "Be kind."
    assert msgs[2]["content"] == "Checking." and msgs[2]["reasoning_content"] == "need a tool"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert (msgs[3]["tool_call_id"], msgs[3]["content"]) == ("toolu_1", "sunny")
    assert msgs[4]["content"] == "Error: boom"
    assert chat.tool_choice_json() == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.parallel_tool_calls is False
    assert (chat.stop, chat.temperature, chat.top_k, chat.max_tokens) == (["END"], 0.5, 5, 10)
    assert json.loads(json.dumps(chat.tools_json()))[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(("thinking", "enabled"), [(None, False), ({"type": "disabled"}, False), ({"type": "enabled", "budget_tokens": 2000}, True)])
def test_thinking_turns_the_template_switch(thinking: Any, enabled: bool) -> None:
    chat = to_chat(_req(thinking=thinking))
    assert chat.chat_template_kwargs == {"enable_thinking": enabled}


@pytest.mark.parametrize(("choice", "expect"), [("any", "required"), ("none", "none"), ("auto", "auto")])
def test_tool_choice_kinds(choice: str, expect: str) -> None:
    chat = to_chat(_req(tools=[{"name": "f"}], tool_choice={"type": choice}))
    assert chat.tool_choice == expect


def test_bad_inputs_are_clear() -> None:
    with pytest.raises(InvalidRequestError, match="needs a name"):
        to_chat(_req(tools=[{"name": "f"}], tool_choice={"type": "tool"}))
    with pytest.raises(ValueError, match="'image' is not supported"):
        MessagesRequest.model_validate({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]})


def test_stop_reasons() -> None:
    req = _req(stop_sequences=["END"])
    assert _stop_reason(TurnEnd("stop", "END"), req, False) == ("stop_sequence", "END")
    assert _stop_reason(TurnEnd("stop", 151645), req, False) == ("end_turn", None)
    assert _stop_reason(TurnEnd("length", None), req, False) == ("max_tokens", None)
    assert _stop_reason(TurnEnd("stop", None), req, True) == ("tool_use", None)


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"), (429, "rate_limit_error"), (503, "overloaded_error"), (500, "api_error")])
def test_error_shape(status: int, kind: str) -> None:
    assert anthropic_error(GatewayError("m", status=status)) == {"type": "error", "error": {"type": kind, "message": "m"}}
