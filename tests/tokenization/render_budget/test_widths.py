"""Predicted sizes of string operations, charged before they run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.tokenization import render_budget
from gateway.tokenization.render_budget.widths import (
    check_format,
    check_join,
    check_printf,
    check_widening,
)


@pytest.fixture
def budget() -> Iterator[render_budget.RenderBudget]:
    render_budget.start([{"role": "user", "content": ""}], None, None)
    found = render_budget.active()
    assert found is not None
    try:
        yield found
    finally:
        render_budget.stop()


def test_printf_and_format_widths_are_charged(budget: render_budget.RenderBudget) -> None:
    before = budget.bytes
    check_printf("%10s|%-5.3d|%%", ("a", 1))
    assert before - budget.bytes == 10 + 5 + 3
    check_printf("%*d", (7, 1))
    assert before - budget.bytes >= 18 + 7  # a width from the arguments: every integer argument counted
    with pytest.raises(render_budget.BudgetExceeded):
        check_format("{:>1000000000}")
    budget.bytes = budget.total_bytes
    with pytest.raises(render_budget.BudgetExceeded):
        check_format("{:>{w}}")  # a width from the arguments cannot be predicted: refused


def test_widening_methods_and_join_are_predicted(budget: render_budget.RenderBudget) -> None:
    before = budget.bytes
    check_widening("ab".center, (40,), {})
    check_widening("xx".replace, ("x", "yyy"), {})
    assert before - budget.bytes == 40 + 3 * 3
    steps = budget.steps
    check_join(["ab", "cd"], "--")
    assert steps - budget.steps == 2
    with pytest.raises(render_budget.BudgetExceeded):
        check_widening("\t".expandtabs, (10**9,), {})
