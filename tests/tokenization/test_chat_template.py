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


# ------------------------------------------------ the direct render against transformers' wrapper

from pathlib import Path  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gateway.tokenization.chat_template import normalize_messages, plain  # noqa: E402

from .helpers import PROPERTY  # noqa: E402

_FIXTURES = Path(__file__).parent.parent / "parsers" / "fixtures"
_PARTS_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}[{{ p.type }}:{{ p.text | default('') }}]{% endfor %}{% endif %}"
    "{% if m.reasoning_content %}(r:{{ m.reasoning_content }}|t:{{ m.thinking }}){% endif %}"
    "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% if documents %}{{ documents | tojson }}{% endif %}"
    "{{ bos_token }}{{ extra | default('') }}{% if add_generation_prompt %}<gen>{% endif %}"
)


def _wrapper_render(template: ChatTemplate, messages: list[dict[str, Any]], **options: Any) -> str:
    """What the previous code rendered: our normalisation, then transformers' wrapper."""
    conversation = normalize_messages(
        copy.deepcopy(messages), template.content_format,
        arguments_text=template.arguments_as_text, content_null_aware=template.content_null_aware,
    )
    kwargs = options.pop("chat_template_kwargs", None) or {}
    from transformers.utils import chat_template_utils

    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[conversation], chat_template=template.source, **options,
        **{**template.special_tokens, **kwargs},
    )
    return str(rendered[0])


def _templates(qwen: Tokenizer) -> dict[str, ChatTemplate]:
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    found = {p.name: ChatTemplate(p.read_text(encoding="utf-8"), specials) for p in sorted(_FIXTURES.glob("*.jinja"))}
    found["qwen3"] = qwen.chat_template()
    found["parts"] = ChatTemplate(_PARTS_TEMPLATE, specials)
    return found


_CONVERSATIONS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"role": "user", "content": "Hi"}], {}),
    ([SYSTEM, {"role": "user", "content": "Hi"}], {"add_generation_prompt": False}),
    ([SYSTEM, {"role": "user", "content": "Weather?"}], {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    (TOOL_TURN, {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    (MULTI_TURN_REASONING, {"chat_template_kwargs": {"enable_thinking": False}}),
    (
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}},
                                      {"type": "text", "text": "b"}]}],
        {"documents": [{"title": "t", "text": "d"}], "chat_template_kwargs": {"extra": {"k": [1, 2.5, None]}}},
    ),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "thinking": "hm",
                                          "tool_calls": [call("get_time", "")]}], {}),
]


@pytest.mark.parametrize("case", range(len(_CONVERSATIONS)))
def test_direct_render_equals_the_wrapper_for_every_template(qwen: Tokenizer, case: int) -> None:
    messages, options = _CONVERSATIONS[case]
    for name, template in _templates(qwen).items():
        for generation in (True, False):
            opts = {**copy.deepcopy(options), "add_generation_prompt": generation and options.get("add_generation_prompt", True)}
            original = copy.deepcopy(messages)
            try:
                expected = _wrapper_render(template, messages, **copy.deepcopy(opts))
            except Exception as exc:  # the template refuses these inputs: ours must refuse too
                with pytest.raises(ChatTemplateError) as refused:
                    template.render(messages, **opts)
                assert str(exc) in str(refused.value)
                continue
            assert template.render(messages, **opts) == expected, (name, generation)
            assert messages == original


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)


@PROPERTY
@given(
    turns=st.lists(st.tuples(st.sampled_from(["user", "assistant", "system"]), _TEXT, st.none() | _TEXT), min_size=1, max_size=4),
    extra=_JSON,
    generation=st.booleans(),
)
def test_direct_render_equals_the_wrapper_on_any_text(
    qwen: Tokenizer, turns: list[tuple[str, str, str | None]], extra: Any, generation: bool
) -> None:
    messages = [{"role": r, "content": c, "reasoning_content": rc} for r, c, rc in turns]
    for template in (qwen.chat_template(), ChatTemplate(_PARTS_TEMPLATE, {"bos_token": "<s>"})):
        opts: dict[str, Any] = {"add_generation_prompt": generation, "chat_template_kwargs": {"extra": extra}}
        try:
            expected = _wrapper_render(template, messages, **copy.deepcopy(opts))
        except Exception:
            with pytest.raises(ChatTemplateError):
                template.render(messages, **opts)
            continue
        assert template.render(messages, **opts) == expected


class _Str(str):
    pass


@PROPERTY
@given(value=_JSON)
def test_plain_is_transformers_plain_template_data(value: Any) -> None:
    from transformers.utils.chat_template_utils import _plain_template_data

    for v in (value, [value, (1, _Str("s"))], {"k": value, "o": object(), "t": (value,)}):
        assert repr(plain(v)) == repr(_plain_template_data(v))


def test_an_older_transformers_without_the_helpers_renders_the_same(
    qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from transformers.utils import chat_template_utils

    from gateway.tokenization import chat_template

    expected = qwen.chat_template().render([{"role": "user", "content": "Hi"}])
    older = SimpleNamespace(  # the renderer without 5.x's _plain_template_data and reasoning aliases
        _compile_jinja_template=chat_template_utils._compile_jinja_template,
        render_jinja_template=chat_template_utils.render_jinja_template,
    )
    monkeypatch.setattr(chat_template, "_load_renderer", lambda: older)
    template = ChatTemplate(qwen.chat_template().source)  # its environment: an overlay of the cached one
    assert template._compiled.environment.linked_to is not None
    assert template.render([{"role": "user", "content": "Hi"}]) == expected
    assert plain({"k": (1, "s")}) == {"k": (1, "s")}  # a copy, as before


def _wrapper(template: ChatTemplate, messages: list[dict[str, Any]], **options: Any) -> str:
    from transformers.utils import chat_template_utils

    conversation = normalize_messages(copy.deepcopy(messages), template.content_format)
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[conversation], chat_template=template.source, **options, **template.special_tokens
    )
    return str(rendered[0])


def test_continue_final_message_cuts_where_transformers_cuts(qwen: Tokenizer) -> None:
    cases = [
        [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is "}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [{"type": "text", "text": "A b"}]}],
    ]
    for name, template in _templates(qwen).items():
        for messages in cases:
            options = {"add_generation_prompt": False, "continue_final_message": True}
            try:
                expected = _wrapper(template, messages, **options)
            except Exception:  # the template refuses these inputs: ours must refuse too
                with pytest.raises(ChatTemplateError):
                    template.render(messages, **options)
                continue
            assert template.render(messages, **options) == expected, name


# ------------------------------------------------------------ the common conversation's one pass

from gateway.tokenization.chat_template import string_messages  # noqa: E402

_KEYS = st.sampled_from(["role", "content", "name", "tool_call_id", "reasoning_content", "thinking", "reasoning", "x"])
_VALUES = st.one_of(_TEXT, _TEXT, _TEXT, st.none(), st.integers(), st.lists(_TEXT, max_size=1), st.builds(_Str, _TEXT))


@PROPERTY
@given(messages=st.lists(st.dictionaries(_KEYS, _VALUES, max_size=4), max_size=4), split=st.booleans())
def test_string_messages_is_the_general_path_or_none(qwen: Tokenizer, messages: list[dict[str, Any]], split: bool) -> None:
    template = qwen.chat_template()
    assert template._aliased == frozenset({"reasoning_content", "thinking", "reasoning"})
    original = copy.deepcopy(messages)
    found = string_messages(messages, template._aliased, split)
    common = bool(messages) and all(
        "role" in m and template._aliased.isdisjoint(m) and all(type(v) is str for v in m.values()) for m in messages
    )
    if not common:
        assert found is None
        return
    assert found is not None
    chat, contents, slots = found
    general = template._alias(normalize_messages(messages, template.content_format))
    assert chat == general and [list(m) for m in chat] == [list(m) for m in general]  # same keys, same order
    assert all(c is not m for c, m in zip(chat, messages, strict=True))  # copies: the caller's are never changed
    if split:
        assert template.memo is not None
        shape = template.memo.shape(general, ())
        assert shape is not None
        assert (contents, repr(slots)) == (shape[1], repr(shape[2]))
    else:
        assert (contents, slots) == ([], [])
    assert messages == original


_STRING_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": _TEXT},
    optional={"name": _TEXT, "reasoning_content": _TEXT},
)


@PROPERTY
@given(messages=st.lists(_STRING_MESSAGE, min_size=1, max_size=4), generation=st.booleans())
def test_string_messages_render_as_the_wrapper_and_replay_alike(
    qwen: Tokenizer, messages: list[dict[str, Any]], generation: bool
) -> None:
    for template in (qwen.chat_template(), ChatTemplate(_PARTS_TEMPLATE, {"bos_token": "<s>"})):
        try:
            expected = _wrapper_render(template, messages, add_generation_prompt=generation)
        except Exception:
            with pytest.raises(ChatTemplateError):
                template.render(messages, add_generation_prompt=generation)
            continue
        for _ in range(3):  # seen, probed, replayed
            assert template.render(messages, add_generation_prompt=generation) == expected


def test_a_transformers_that_does_not_name_its_aliased_fields_takes_the_general_path(
    qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from transformers.utils import chat_template_utils

    from gateway.tokenization import chat_template

    unnamed = SimpleNamespace(**{k: getattr(chat_template_utils, k) for k in dir(chat_template_utils) if k != "_REASONING_FIELDS"})
    monkeypatch.setattr(chat_template, "_load_renderer", lambda: unnamed)
    template = ChatTemplate(qwen.chat_template().source)
    assert template._aliased is None
    chat = [{"role": "user", "content": "Hi", "reasoning": "r"}]
    assert template.render(chat) == qwen.chat_template().render(chat)
