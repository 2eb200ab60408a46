"""Parsers end to end: scripted sim replies in each model's markup -> gateway -> official openai client.

The simulated worker uses the Qwen3 tokenizer; the scripted text is what a model of
the named family would write, so the parser flag (not the tokenizer) decides.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.http.conftest import Stack

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}},
]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"please answer <<sim-reply>>{text}<</sim-reply>>"}]


async def _stream(stack: Stack, **kwargs: Any) -> tuple[str, str, dict[int, dict[str, str]], str | None]:
    content, reasoning, finish = [], [], None
    calls: dict[int, dict[str, str]] = {}
    stream = await stack.client.chat.completions.create(model=stack.model, stream=True, max_tokens=200, **kwargs)
    async for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            for tc in delta.tool_calls or []:
                if tc.id is not None:
                    assert tc.index not in calls and tc.function.name  # name first, with the id
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(content), "".join(reasoning), calls, finish


@pytest.mark.stack(sections={"parsers": {"tool_call_parser": "mistral"}})
async def test_mistral_calls_stream_and_whole(stack: Stack) -> None:
    text = 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
    whole = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(text), tools=TOOLS, max_tokens=200, extra_body=NO_THINK
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    assert all(c.id.startswith("call_") for c in choice.message.tool_calls)
    content, _, calls, finish = await _stream(stack, messages=_reply(text), tools=TOOLS, extra_body=NO_THINK)
    assert content == "Checking." and finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == got
    # parallel_tool_calls false: only the first call
    content, _, calls, finish = await _stream(stack, messages=_reply(text), tools=TOOLS, extra_body=NO_THINK, parallel_tool_calls=False)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and finish == "tool_calls"
    single = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(text), tools=TOOLS, max_tokens=200, extra_body=NO_THINK, parallel_tool_calls=False
    )
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_weather"]


@pytest.mark.stack(sections={"parsers": {"tool_call_parser": "kimi_k2"}})
async def test_malformed_call_is_content_and_tool_choice_none_parses_nothing(stack: Stack) -> None:
    text = "<|tool_calls_section_begin|>not really a call<|tool_calls_section_end|>"
    whole = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(text), tools=TOOLS, max_tokens=200, extra_body=NO_THINK
    )
    assert whole.choices[0].message.content == text
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    content, _, calls, _ = await _stream(stack, messages=_reply(text), tools=TOOLS, extra_body=NO_THINK)
    assert content == text and not calls
    good = '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>'
    off = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(good), tools=TOOLS, tool_choice="none", max_tokens=200, extra_body=NO_THINK
    )
    assert off.choices[0].message.content == good and off.choices[0].message.tool_calls is None


@pytest.mark.stack(sections={"parsers": {"tool_call_parser": "gpt-oss", "reasoning_parser": "gpt-oss"}})
async def test_harmony_reasoning_and_call(stack: Stack) -> None:
    text = (
        "<|channel|>analysis<|message|>User wants the time.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}<|call|>'
    )
    whole = await stack.client.chat.completions.create(model=stack.model, messages=_reply(text), tools=TOOLS, max_tokens=200)
    msg = whole.choices[0].message
    assert getattr(msg, "reasoning_content", None) == "User wants the time."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("get_time", {"zone": "CET"})]
    assert not msg.content
    content, reasoning, calls, finish = await _stream(stack, messages=_reply(text), tools=TOOLS)
    assert (content, reasoning, finish) == ("", "User wants the time.", "tool_calls")
    assert calls[0]["name"] == "get_time" and json.loads(calls[0]["arguments"]) == {"zone": "CET"}
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello there.<|return|>"
    content, reasoning, calls, finish = await _stream(stack, messages=_reply(final))
    assert (content, reasoning, calls, finish) == ("Hello there.", "Easy.", {}, "stop")


async def test_allowed_tools_limits_what_counts_as_a_call(stack: Stack) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}
    resp = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(call), tools=TOOLS, tool_choice=allowed, max_tokens=200, extra_body=NO_THINK  # type: ignore[arg-type]
    )
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].message.content == call
    allowed["allowed_tools"]["tools"] = [{"type": "function", "function": {"name": "get_weather"}}]  # type: ignore[index]
    resp = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(call), tools=TOOLS, tool_choice=allowed, max_tokens=200, extra_body=NO_THINK  # type: ignore[arg-type]
    )
    assert resp.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError):
        await stack.client.chat.completions.create(
            model=stack.model, messages=_reply("x"), tools=TOOLS, max_tokens=5,
            tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]}},  # type: ignore[arg-type]
        )


async def test_models_list_shows_the_chosen_parsers(stack: Stack) -> None:
    resp = await stack.http.get("/v1/models")
    card = resp.json()["data"][0]
    assert (card["tool_call_parser"], card["reasoning_parser"]) == ("hermes", "qwen3")  # auto, Qwen3 tokenizer


@pytest.mark.stack(server={"api_keys": ["k1"]})
async def test_parse_endpoints(stack: Stack) -> None:
    auth = {"Authorization": "Bearer k1"}
    body = {"text": 'Hi [TOOL_CALLS]get_time[ARGS]{"zone": "CET"}', "parser": "mistral", "tools": TOOLS}
    resp = await stack.http.post("/parse/tool_calls", json=body, headers=auth)
    assert resp.status_code == 200
    assert resp.json() == {"content": "Hi", "tool_calls": [{"name": "get_time", "arguments": '{"zone": "CET"}'}]}
    resp = await stack.http.post("/parse/reasoning", json={"text": "<think>hmm</think>yes", "parser": "qwen3"}, headers=auth)
    assert resp.json() == {"reasoning_content": "hmm", "content": "yes"}
    resp = await stack.http.post("/parse/reasoning", json={"text": "hmm</think>yes", "parser": "deepseek-r1"}, headers=auth)
    assert resp.json() == {"reasoning_content": "hmm", "content": "yes"}
    resp = await stack.http.post("/parse/tool_calls", json={**body, "parser": "nope"}, headers=auth)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "parser" and "qwen3_coder" in err["message"] and err["type"] == "invalid_request_error"
    resp = await stack.http.post("/parse/reasoning", json={"text": "x", "parser": "nope"}, headers=auth)
    assert resp.status_code == 400 and "deepseek-r1" in resp.json()["error"]["message"]
    assert (await stack.http.post("/parse/tool_calls", json=body)).status_code == 401
    assert (await stack.http.post("/parse/tool_calls", json={"text": 5}, headers=auth)).status_code == 400
    assert (await stack.http.post("/parse/reasoning", content=b"{bad", headers=auth)).status_code == 400


TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "<<sim-reply>>effort={{ reasoning_effort | default('unset') }} mood={{ mood | default('unset') }}<</sim-reply>>"
)


@pytest.fixture
def template_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tpl") / "echo.jinja"
    path.write_text(TEMPLATE)
    return str(path)


async def test_chat_template_flag_and_template_inputs(tmp_path: Any, template_file: str) -> None:
    from tests.e2e.http.conftest import StackOptions, start_stack

    opts = StackOptions(sections={"parsers": {"chat_template": template_file, "reasoning_parser": "none"}})
    async with start_stack(opts, tmp_path) as stack:
        resp = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=30,
            reasoning_effort="high", extra_body={"chat_template_kwargs": {"mood": "calm"}},
        )
        assert resp.choices[0].message.content == "effort=high mood=calm"
        plain = await stack.client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=30)
        assert plain.choices[0].message.content == "effort=unset mood=unset"
        card = (await stack.http.get("/v1/models")).json()["data"][0]
        assert card["tool_call_parser"] == "hermes"  # no markup in this template: model_type qwen3 decides
        assert "reasoning_parser" not in card  # none: no reasoning splitting
