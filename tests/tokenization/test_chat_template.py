"""Chat templates render exactly what transformers' apply_chat_template renders."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.tokenization import ChatTemplate, ChatTemplateError, Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time", "parameters": {"type": "object"}},
}


def call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds en français 😀."}
TOOL_TURN = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two tools are needed.",
        "tool_calls": [
            call("get_weather", {"city": "Paris", "unit": "C"}),
            call("get_time", {"city": "東京"}, "call_2"),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "09:30"},
]
MULTI_TURN_REASONING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n6"},
    {"role": "user", "content": "Thanks!"},
]

CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("plain", [SYSTEM, {"role": "user", "content": "Hi"}], {}),
    ("no system", [{"role": "user", "content": "Hi\n\nthere"}], {}),
    ("thinking off", [{"role": "user", "content": "Hi"}], {"enable_thinking": False}),
    ("thinking on", [{"role": "user", "content": "Hi"}], {"enable_thinking": True}),
    (
        "tools",
        [SYSTEM, {"role": "user", "content": "Weather?"}],
        {"tools": [WEATHER_TOOL, TIME_TOOL]},
    ),
    ("tool results", TOOL_TURN, {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    ("tool results, thinking off", TOOL_TURN, {"tools": [WEATHER_TOOL], "enable_thinking": False}),
    ("multi-turn reasoning", MULTI_TURN_REASONING, {}),
    ("multi-turn reasoning, thinking off", MULTI_TURN_REASONING, {"enable_thinking": False}),
    ("no generation prompt", MULTI_TURN_REASONING, {"add_generation_prompt": False}),
    (
        "continue final message",
        [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],
        {"add_generation_prompt": False, "continue_final_message": True},
    ),
]


@pytest.mark.parametrize(("messages", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_qwen3_matches_transformers(
    qwen: Tokenizer, hf_qwen: Any, messages: list[dict[str, Any]], options: dict[str, Any]
) -> None:
    options = dict(options)
    tools = options.pop("tools", None)
    add_generation_prompt = options.pop("add_generation_prompt", True)
    continue_final_message = options.pop("continue_final_message", False)
    original = copy.deepcopy(messages)
    ours = qwen.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template_kwargs=options,
    )
    reference = hf_qwen.apply_chat_template(
        copy.deepcopy(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **options,
    )
    assert ours == reference
    assert messages == original  # the caller's messages are never modified
    # The rendered prompt is tokenized without adding special tokens, as transformers does.
    ids = qwen.encode(ours, add_special_tokens=False)
    assert ids == hf_qwen.apply_chat_template(
        copy.deepcopy(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=True,
        return_dict=False,
        **options,
    )


def test_thinking_off_inserts_an_empty_think_block(qwen: Tokenizer) -> None:
    text = qwen.apply_chat_template(
        [{"role": "user", "content": "Hi"}], chat_template_kwargs={"enable_thinking": False}
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_arguments_as_json_text_render_like_objects(qwen: Tokenizer, hf_qwen: Any) -> None:
    """OpenAI clients send tool-call arguments as JSON text; they are parsed to objects."""
    as_text = copy.deepcopy(TOOL_TURN)
    for message in as_text:
        for tool_call in message.get("tool_calls", []):
            tool_call["function"]["arguments"] = json.dumps(tool_call["function"]["arguments"])
    ours = qwen.apply_chat_template(as_text, tools=[WEATHER_TOOL])
    assert ours == qwen.apply_chat_template(TOOL_TURN, tools=[WEATHER_TOOL])
    assert ours == hf_qwen.apply_chat_template(
        copy.deepcopy(TOOL_TURN), tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert '"arguments": {"city": "Paris", "unit": "C"}' in ours


def test_null_content_and_empty_arguments(qwen: Tokenizer) -> None:
    """An OpenAI tool-call turn: content null, arguments "" -> content "", arguments {}."""
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [call("get_time", "")]},
    ]
    text = qwen.apply_chat_template(messages, add_generation_prompt=False)
    assert '{"name": "get_time", "arguments": {}}' in text
    assert "None" not in text
    assert text == qwen.apply_chat_template(
        [messages[0], {**messages[1], "content": "", "tool_calls": [call("get_time", {})]}],
        add_generation_prompt=False,
    )


def test_content_parts_are_joined_for_a_string_template(qwen: Tokenizer) -> None:
    assert qwen.chat_template().content_format == "string"
    parts = [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "this."},
    ]
    joined = qwen.apply_chat_template([{"role": "user", "content": parts}])
    assert joined == qwen.apply_chat_template([{"role": "user", "content": "Describe this."}])


def test_content_parts_are_kept_for_a_template_that_loops_over_them() -> None:
    source = (
        "{% for message in messages %}{{ message.role }}:"
        "{% for part in message['content'] %}[{{ part.type }}]{% endfor %}\n{% endfor %}"
    )
    template = ChatTemplate(source)
    assert template.content_format == "openai"
    parts = [{"type": "text", "text": "a"}, {"type": "image"}]
    assert template.render([{"role": "user", "content": parts}]) == "user:[text][image]"


def test_transformers_helpers_are_available() -> None:
    """raise_exception, tojson (no HTML escaping, with indent), strftime_now, loopcontrols,
    namespace and documents behave as in transformers."""
    source = (
        "{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'skip' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
        "{{ m.content | tojson }};{% endfor %}"
        "n={{ ns.n }} year={{ strftime_now('%Y') | length }} "
        "{{ documents | tojson(indent=1) }} {{ bos_token }}"
    )
    template = ChatTemplate(source, special_tokens={"bos_token": "<s>"})
    messages = [
        {"role": "skip", "content": "x"},
        {"role": "user", "content": "<b>&'"},
        {"role": "user", "content": "never"},
    ]
    text = template.render(messages, documents=[{"title": "t", "text": "d"}])
    assert text == '"<b>&\'";n=1 year=4 [\n {\n  "title": "t",\n  "text": "d"\n }\n] <s>'
    failing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        failing.render([{"role": "user", "content": "x"}])


def test_arbitrary_template_kwargs_reach_the_template() -> None:
    template = ChatTemplate("{{ greeting | default('none') }}|{{ level }}")
    rendered = template.render(
        [{"role": "user", "content": ""}], chat_template_kwargs={"greeting": "hi", "level": 3}
    )
    assert rendered == "hi|3"


@pytest.mark.parametrize(
    ("messages", "kwargs", "message"),
    [
        ([], {}, "empty conversation"),
        ("hello", {}, "list of message objects"),
        ([{"content": "no role"}], {}, "needs a string 'role'"),
        (["not a dict"], {}, "must be an object"),
        ([{"role": "user", "content": 5}], {}, "content must be a string"),
        ([{"role": "user", "content": [{"type": "text"}]}], {}, "needs a string 'text'"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [call("f", "{not json")]}],
            {},
            "not valid JSON",
        ),
        (
            [{"role": "user", "content": "x"}],
            {"add_generation_prompt": True, "continue_final_message": True},
            "cannot both",
        ),
        (
            [{"role": "user", "content": "x"}],
            {"chat_template_kwargs": {"messages": []}},
            "may not set messages",
        ),
    ],
)
def test_bad_inputs_raise_chat_template_error(
    qwen: Tokenizer, messages: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        qwen.apply_chat_template(messages, **kwargs)


def test_template_failures_raise_chat_template_error(qwen: Tokenizer) -> None:
    # Qwen's template calls content.startswith(): a user message without content breaks it.
    with pytest.raises(ChatTemplateError, match="chat template error"):
        qwen.apply_chat_template([{"role": "user"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for x in %}")
    with pytest.raises(ChatTemplateError, match="empty"):
        ChatTemplate("  ")
    with pytest.raises(ChatTemplateError, match="no chat template 'tool_use'"):
        qwen.chat_template("tool_use")


def test_compiled_once_per_tokenizer(qwen: Tokenizer) -> None:
    assert qwen.chat_template() is qwen.chat_template()
