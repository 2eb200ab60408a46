"""Budgeted filters and globals: a template that serializes the conversation again and
again without writing anything runs out of work at once; walking, widening and filling
filters are charged; honest filters give what jinja2's give."""

from __future__ import annotations

import time

import pytest

from gateway.tokenization import render_budget
from gateway.tokenization.chat_template import ChatTemplate
from gateway.tokenization.errors import ChatTemplateBudgetError
from gateway.tokenization.render_budget.filters import budgeted_filters, budgeted_globals

# Inside the step budget (3,000 steps) and writing nothing: each step serializes the messages.
SLOW = "{% for i in range(3000) %}{% if (messages|tojson|length) < 0 %}x{% endif %}{% endfor %}"


def test_serializing_the_conversation_in_a_loop_runs_out_of_work_in_milliseconds() -> None:
    template = ChatTemplate(SLOW)
    started = time.process_time()
    with pytest.raises(ChatTemplateBudgetError, match="read or made more than"):
        template.render([{"role": "user", "content": "x" * 800_000}])
    assert time.process_time() - started < 0.5  # it ran to the 2 s deadline before
    assert template.render([{"role": "user", "content": "hi"}]) == ""  # a short conversation fits


def test_filters_charge_what_they_read_and_make_inside_a_render_only() -> None:
    filters = budgeted_filters({"upper": str.upper, "wordcount": len, "length": len})
    assert filters["upper"]("ab") == "AB" and filters["upper"].__name__ == "upper"
    render_budget.start([{"role": "user", "content": ""}], None, None)
    try:
        budget = render_budget.active()
        assert budget is not None
        before = budget.work
        filters["upper"]("x" * 100)  # 100 read, 100 made
        filters["wordcount"]("y" * 50)  # 50 read
        filters["length"]("z" * 1000)  # picks a count: nothing walked
        assert before - budget.work == 250
    finally:
        render_budget.stop()


def test_walking_and_widening_filters_keep_their_checks() -> None:
    template = ChatTemplate("{{ messages|map(attribute='content')|join(', ') }}|{{ 'ab'|center(6) }}")
    assert template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a, b|  ab  "
    with pytest.raises(ChatTemplateBudgetError):
        ChatTemplate("{{ 'x'|center(1000000000) }}").render([{"role": "user", "content": "hi"}])


def test_range_lipsum_and_dict_are_budgeted_globals() -> None:
    names = budgeted_globals({"range": range, "lipsum": None, "dict": dict, "other": 1})
    assert names["other"] == 1 and names["range"] is not range and names["dict"](a=1) == {"a": 1}
    render_budget.start([{"role": "user", "content": ""}], None, None)
    try:
        with pytest.raises(render_budget.BudgetExceeded, match="loop steps"):
            names["range"](50_000)
    finally:
        render_budget.stop()
