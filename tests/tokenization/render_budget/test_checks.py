"""The checks the rewritten tree calls: every template bomb fails within milliseconds,
values pass through outside a render, a searched container is charged."""

from __future__ import annotations

import time

import pytest

from gateway.tokenization import render_budget
from gateway.tokenization.chat_template import ChatTemplate
from gateway.tokenization.errors import ChatTemplateBudgetError
from gateway.tokenization.render_budget import checks

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


def test_outside_a_render_the_checks_pass_values_through() -> None:
    assert render_budget.active() is None
    template = ChatTemplate("{% for m in messages %}{{ m.content * 2 }}{% endfor %}")
    assert template._compiled.render(messages=[{"content": "ab"}]) == "abab"


def test_a_container_searched_in_a_loop_runs_out_of_work_in_milliseconds() -> None:
    template = ChatTemplate("{% for i in range(4000) %}{% if 'zz' in messages[0].content %}x{% endif %}{% endfor %}")
    big = [{"role": "user", "content": "y" * 1_000_000}]
    started = time.process_time()
    with pytest.raises(ChatTemplateBudgetError, match="read or made more than"):
        template.render(big)
    assert time.process_time() - started < 0.5
    assert template.render(HI) == ""  # a short text searched as often is fine


def test_scan_charges_what_it_searches_and_passes_it_through() -> None:
    render_budget.start(HI, None, None)
    try:
        budget = render_budget.active()
        assert budget is not None
        before = budget.work
        assert checks.scan(None, "abc" * 10) == "abc" * 10
        assert checks.scan(None, 7) == 7
        assert before - budget.work == 30
    finally:
        render_budget.stop()
