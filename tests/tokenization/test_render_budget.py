"""A chat template's render budget: template bombs fail within milliseconds, honest
renders are unchanged and scale with the request."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.tokenization import Tokenizer, render_budget
from gateway.tokenization.chat_template import ChatTemplate, normalize_messages
from gateway.tokenization.errors import ChatTemplateBudgetError, ChatTemplateError

from .test_chat_template import TOOL_TURN, WEATHER_TOOL, _templates

HI = [{"role": "user", "content": "hi"}]

# Each would spin a core, fill memory or run inside one C call for minutes without a budget.
BOMBS = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "loops inside the budget's base": (
        "{% for i in range(4000) %}{% for j in range(4000) %}{{ j }}{% endfor %}{% endfor %}"
    ),
    "loops over iterators": (
        "{% for a in range(3000)|map('string') %}{% for b in range(3000)|map('string') %}{{ b }}"
        "{% endfor %}{% endfor %}"
    ),
    "string multiplication": "{{ 'x' * 1000000000 }}",
    "list multiplication": "{{ ([1] * 100000000)|length }}",
    "power": "{{ 9 ** (9 ** 9) }}",
    "integer squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "self-recursive macro": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "macro doubling its argument": "{% macro f(x) %}{{ f(x ~ x) }}{% endmacro %}{{ f('ab') }}",
    "recursive loop": "{% for x in [[1, 2], [3]] recursive %}{{ loop([x, x]) }}{% endfor %}",
    "recursive block": "{% block b %}{{ self.b() }}{% endblock %}",
    "string doubled in a loop": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}"
    ),
    "shared list doubled then printed": (
        "{% set ns = namespace(x=['abc']) %}{% for i in range(30) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
        "{{ ns.x }}"
    ),
    "new strings kept in a growing list": (
        "{% set ns = namespace(big='x' * 1000000, l=[]) %}{% for i in range(4000) %}"
        "{% set ns.l = ns.l + [ns.big ~ i] %}{% endfor %}{{ ns.l|length }}"
    ),
    "filler repeated by batch": (
        "{% set d = ['x' * 1000000] %}{{ [1]|batch(4000, fill_with=d)|list|string|length }}"
    ),
    "center filter": "{{ 'x'|center(1000000000) }}",
    "ljust method": "{{ 'x'.ljust(1000000000) }}",
    "format width": "{{ '{:>1000000000}'.format(1) }}",
    "format width from an argument": "{{ '{:>{w}}'.format(1, w=1000000000) }}",
    "printf width": "{{ '%01000000000d' % 1 }}",
    "format filter width": "{{ '%01000000000d'|format(1) }}",
    "indent": "{{ 'a\nb'|indent(1000000000) }}",
    "tojson indent": "{{ messages|tojson(indent=1000000000) }}",
    "expandtabs": "{{ '\t\t'.expandtabs(1000000000) }}",
    "replace expansion": "{{ ('x' * 100000)|replace('', 'y' * 100000) }}",
    "join of a repeated string": "{% set l = ['x' * 100000] * 3000 %}{{ l|join }}",
    "wordwrap": "{{ ('ab ' * 10000)|wordwrap(1, wrapstring='y' * 100000) }}",
    "lipsum": "{{ lipsum(100000000) }}",
    "dict.fromkeys": "{{ dict.fromkeys(range(100000))|length }}",
    "sum of lists": "{{ ([[1] * 1000] * 1000)|sum(start=[])|length }}",
    "slice count": "{{ [1]|slice(100000000)|list|length }}",
}


@pytest.fixture(scope="module", autouse=True)
def _renderer_imported() -> None:
    ChatTemplate("{{ 1 }}")  # the first compile imports transformers' renderer (~1 s)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_template_bomb_fails_within_milliseconds(name: str) -> None:
    started = time.process_time()
    template = ChatTemplate(BOMBS[name])  # nothing is evaluated while compiling
    compiled = time.process_time()
    with pytest.raises(ChatTemplateBudgetError, match="chat template"):
        template.render(HI)
    assert compiled - started < 0.5, "compiling ran the template"
    assert time.process_time() - compiled < 0.05, f"{name}: took {time.process_time() - compiled:.3f}s of CPU"
    assert render_budget.active() is None  # the thread's budget ends with the render
    with pytest.raises(ChatTemplateBudgetError):  # and the next attempt fails the same way
        template.render(HI)


def test_the_self_recursive_macro_stops_at_the_depth_limit_without_a_traceback_rewrite() -> None:
    template = ChatTemplate("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}")
    with pytest.raises(ChatTemplateBudgetError, match=f"deeper than {render_budget.MAX_DEPTH}"):
        template.render(HI)
    started = time.perf_counter()
    for _ in range(20):
        with pytest.raises(ChatTemplateBudgetError):
            template.render(HI)
    assert (time.perf_counter() - started) / 20 < 0.01  # it took ~86 ms before


def test_a_template_cannot_catch_or_mute_the_budget() -> None:
    # jinja2 has no try; the budget's exception is a BaseException, so neither the
    # template's callers nor ``default`` or a test swallows it.
    template = ChatTemplate("{{ ('x' * 1000000000) | default('quiet') }}{% if ('y' * 1000000000) is defined %}{% endif %}")
    with pytest.raises(ChatTemplateBudgetError):
        template.render(HI)
    assert issubclass(ChatTemplateBudgetError, ChatTemplateError)
    assert not issubclass(render_budget.BudgetExceeded, Exception)


def test_the_budget_grows_with_the_request() -> None:
    # 20 steps a message: past the base for 500 messages, inside base + STEPS_PER_ITEM each.
    template = ChatTemplate("{% for m in messages %}{% for i in range(20) %}.{% endfor %}{% endfor %}")
    many = [{"role": "user", "content": "x"}] * 500
    assert 20 * len(many) > render_budget.BASE_STEPS
    assert template.render(many) == "." * 20 * len(many)
    # Writing each message 8 times is inside the byte share; 64 times is not.
    writes = ChatTemplate("{% for m in messages %}{% for i in range(n) %}{{ m.content }}{% endfor %}{% endfor %}")
    big = [{"role": "user", "content": "y" * 600_000}] * 2
    assert len(writes.render(big, chat_template_kwargs={"n": 8})) == 8 * 1_200_000
    with pytest.raises(ChatTemplateBudgetError, match="characters"):
        writes.render(big, chat_template_kwargs={"n": 64})


def test_a_large_honest_conversation_renders_as_before(qwen: Tokenizer) -> None:
    turn = copy.deepcopy(TOOL_TURN[1:])
    conversation = [TOOL_TURN[0]] + turn * 300  # 1,500 messages with tool calls and results
    template = qwen.chat_template()
    rendered = template.render(conversation, tools=[WEATHER_TOOL] * 50)
    assert rendered.count("<tool_call>") == rendered.count("</tool_call>") >= 600


def test_a_template_that_scans_ahead_from_every_message_renders_a_long_agent_conversation() -> None:
    # gpt-oss looks ahead over the rest of the conversation from every tool call: its steps
    # grow with the square of the conversation, and its comparisons write nothing.
    source = (Path(__file__).parent.parent / "parsers" / "fixtures" / "gpt-oss-120b.jinja").read_text()
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    conversation = [TOOL_TURN[0]] + copy.deepcopy(TOOL_TURN[1:]) * 600  # 3,001 messages
    rendered = template.render(conversation, tools=[WEATHER_TOOL] * 40)
    assert rendered.count("<|call|>") == 600


def test_a_namespace_accumulator_costs_its_final_size() -> None:
    template = ChatTemplate(
        "{% set ns = namespace(p='') %}{% for m in messages %}{% set ns.p = ns.p + m.content + '|' %}{% endfor %}"
        "{{ ns.p|length }}"
    )
    conversation = [{"role": "user", "content": "y" * 2000}] * 3000  # 6 MB; charged per store: 9 GB
    assert template.render(conversation) == str(2001 * 3000)


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


def test_outside_a_render_the_checks_pass_values_through() -> None:
    assert render_budget.active() is None
    template = ChatTemplate("{% for m in messages %}{{ m.content * 2 }}{% endfor %}")
    assert template._compiled.render(messages=[{"content": "ab"}]) == "abab"


def test_the_sandbox_still_refuses_what_it_refused() -> None:
    for source in ("{{ ''.__class__.__mro__ }}", "{{ messages.append(1) }}", "{{ cycler.__init__.__globals__ }}"):
        template = ChatTemplate(source)
        with pytest.raises(ChatTemplateError) as refused:
            template.render(HI)
        assert not isinstance(refused.value, ChatTemplateBudgetError)
