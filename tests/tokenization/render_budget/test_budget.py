"""The render budget itself: it grows with the request (steps, bytes, work), a template
cannot catch it, and honest renders of long conversations fit."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gateway.tokenization import Tokenizer, render_budget
from gateway.tokenization.chat_template import ChatTemplate
from gateway.tokenization.errors import ChatTemplateBudgetError, ChatTemplateError
from gateway.tokenization.render_budget.budget import RenderBudget, charge_work
from tests.tokenization.test_chat_template import TOOL_TURN, WEATHER_TOOL

HI = [{"role": "user", "content": "hi"}]


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
    source = (Path(__file__).parents[2] / "parsers" / "fixtures" / "gpt-oss-120b.jinja").read_text()
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


def test_the_work_budget_adds_the_requests_share_once_then_refuses() -> None:
    budget = RenderBudget(request=([{"role": "user", "content": "x" * 1000}], None, None))
    budget.work = -1
    budget.short("work")  # the request's share arrives: no longer short
    assert budget.total_work == render_budget.BASE_WORK + render_budget.WORK_PER_CHAR * (1000 + len("user"))
    budget.work = -1
    with pytest.raises(render_budget.BudgetExceeded, match=f"budget of {budget.total_work} characters"):
        budget.short("work")


def test_work_is_charged_only_inside_a_render() -> None:
    charge_work(1 << 40)  # no render on this thread: nothing to charge
    render_budget.start(HI, None, None)
    try:
        with pytest.raises(render_budget.BudgetExceeded, match="read or made more than"):
            charge_work(1 << 40)
    finally:
        render_budget.stop()
    assert render_budget.active() is None
