"""The budgeted sandbox: calls that re-enter template code are counted and nested at most
``MAX_DEPTH`` deep, ``str`` methods charge what they walk, and the sandbox refuses what
jinja2's refuses."""

from __future__ import annotations

import time

import pytest

from gateway.tokenization import render_budget
from gateway.tokenization.chat_template import ChatTemplate
from gateway.tokenization.errors import ChatTemplateBudgetError, ChatTemplateError

HI = [{"role": "user", "content": "hi"}]


def test_the_self_recursive_macro_stops_at_the_depth_limit_without_a_traceback_rewrite() -> None:
    template = ChatTemplate("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}")
    with pytest.raises(ChatTemplateBudgetError, match=f"deeper than {render_budget.MAX_DEPTH}"):
        template.render(HI)
    started = time.process_time()  # CPU: a shared host's waits are not the render's
    for _ in range(20):
        with pytest.raises(ChatTemplateBudgetError):
            template.render(HI)
    assert (time.process_time() - started) / 20 < 0.01  # it took ~86 ms before


def test_the_sandbox_still_refuses_what_it_refused() -> None:
    for source in ("{{ ''.__class__.__mro__ }}", "{{ messages.append(1) }}", "{{ cycler.__init__.__globals__ }}"):
        template = ChatTemplate(source)
        with pytest.raises(ChatTemplateError) as refused:
            template.render(HI)
        assert not isinstance(refused.value, ChatTemplateBudgetError)


def test_a_string_method_walking_a_long_text_in_a_loop_runs_out_of_work() -> None:
    template = ChatTemplate("{% for i in range(4000) %}{% if messages[0].content.count('z') %}x{% endif %}{% endfor %}")
    started = time.process_time()
    with pytest.raises(ChatTemplateBudgetError, match="read or made more than"):
        template.render([{"role": "user", "content": "y" * 1_000_000}])
    assert time.process_time() - started < 0.5
    assert template.render(HI) == ""
