"""``/v1/chat/completions``' request (protocol/chat.py): per-role message rules, messages
as templates take them, and the tool/tool_choice consistency rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol import limits
from gateway.protocol.chat import ChatCompletionRequest, ChatMessage
from gateway.protocol.errors import validation_error_to_gateway

USER = {"role": "user", "content": "hi"}


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def _chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], **fields})


def _error(**fields: Any) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as exc:
        _chat(**fields)
    err = validation_error_to_gateway(exc.value)
    return err.param, err.message


@pytest.mark.parametrize(
    ("message", "param", "text"),
    [
        ({"role": "assistant"}, "messages.[1].content", "content or tool_calls"),
        ({"role": "system"}, "messages.[1].content", "required for a 'system'"),
        ({"role": "tool", "content": "42"}, "messages.[1].tool_call_id", "needs tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}, "messages.[1].tool_calls", "only assistant"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages.[1].content", "not supported"),
        ({"role": "robot", "content": "x"}, "messages.[1].role", ""),
    ],
)
def test_role_rules_point_at_the_message_field(message: dict[str, Any], param: str, text: str) -> None:
    got, msg = _error(messages=[USER, message])
    assert got == param and text in msg


def test_a_message_as_the_template_takes_it() -> None:
    parts = ChatMessage.model_validate({"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]})
    assert parts.text() == "ab" and parts.to_template() == {"role": "user", "content": "ab"}
    call = ChatMessage.model_validate({
        "role": "assistant", "reasoning_content": "think",
        "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": {"city": "Paris"}}},  # an object, not its text
            {"id": "c2", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c3", "function": {"name": "h", "arguments": "[1, 2]"}},
        ],
    })
    out = call.to_template()
    assert out["content"] == "" and out["reasoning_content"] == "think"
    assert [c["function"]["arguments"] for c in out["tool_calls"]] == [{"city": "Paris"}, "not json", "[1, 2]"]
    tool = ChatMessage.model_validate({"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"})
    assert tool.to_template() == {"role": "tool", "content": "42", "name": "f", "tool_call_id": "c1"}


def test_deeply_nested_arguments_or_template_kwargs_are_refused() -> None:
    deep = "[" * (limits.MAX_JSON_DEPTH + 1) + "]" * (limits.MAX_JSON_DEPTH + 1)
    param, _ = _error(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}])
    assert param is not None and param.endswith("arguments")
    nested: Any = 1
    for _ in range(limits.MAX_JSON_DEPTH + 1):
        nested = {"k": nested}
    assert _error(chat_template_kwargs=nested)[0] == "chat_template_kwargs"


def test_max_new_tokens_prefers_max_completion_tokens() -> None:
    assert _chat().max_new_tokens is None
    assert _chat(max_tokens=5).max_new_tokens == 5
    assert _chat(max_tokens=5, max_completion_tokens=9).max_new_tokens == 9
    assert _error(max_completion_tokens=3, min_tokens=4)[0] == "min_tokens"


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"messages": []}, "messages", "at least one"),
        ({"top_logprobs": 2}, "top_logprobs", "requires logprobs"),
        ({"tools": [_tool("f"), _tool("f")]}, "tools", "unique"),
        ({"tool_choice": "auto"}, "tool_choice", "needs a non-empty tools list"),
        ({"tool_choice": "sometimes", "tools": [_tool("f")]}, "tool_choice", "must be 'none'"),
        ({"tools": [_tool("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g', which is not in tools"),
        ({"tools": [_tool("f")], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": [{"name": "g"}]}}},
         "tool_choice", "allowed_tools names function 'g'"),
    ],
)
def test_request_rules(fields: dict[str, Any], param: str, text: str) -> None:
    got, msg = _error(**fields)
    assert got == param and text in msg


def test_tool_choice_defaults_and_allowed_tools_narrow_what_the_model_sees() -> None:
    assert _chat().effective_tool_choice == "none" and _chat().template_tools() is None
    with_tools = _chat(tools=[_tool("f"), _tool("g")])
    assert with_tools.effective_tool_choice == "auto" and with_tools.tool_choice_json() == "auto"
    assert [t["function"]["name"] for t in with_tools.template_tools() or []] == ["f", "g"]
    assert _chat(tools=[_tool("f")], tool_choice="none").template_tools() is None
    named = _chat(tools=[_tool("f")], tool_choice={"type": "function", "function": {"name": "f"}})
    assert named.tool_choice_json() == {"type": "function", "function": {"name": "f"}}
    allowed = _chat(tools=[_tool("f"), _tool("g")],
                    tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"name": "g"}]}})
    assert allowed.effective_tool_choice == "required"
    assert [t["function"]["name"] for t in allowed.tools_json()] == ["g"]
    assert allowed.template_messages() == [{"role": "user", "content": "hi"}]


def test_a_chat_of_more_messages_than_the_bound_is_refused_before_they_are_validated() -> None:
    at_most = [{"role": "user", "content": "hi"}] * limits.MAX_MESSAGES
    assert len(ChatCompletionRequest.model_validate({"model": "m", "messages": at_most}).messages) == limits.MAX_MESSAGES
    over = [*at_most, {"no role": 1}]  # an invalid extra item: the count is what refuses it
    with pytest.raises(ValidationError, match=f"at most {limits.MAX_MESSAGES} messages, not {limits.MAX_MESSAGES + 1}"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": over})
