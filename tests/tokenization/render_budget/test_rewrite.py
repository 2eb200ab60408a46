"""The tree rewrite puts each check where it applies and leaves nothing to fold."""

from __future__ import annotations

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.tokenization.render_budget import budgeted, install
from gateway.tokenization.render_budget.checks import KEEP, LOOP, MADE, MUL, OUT, SCAN


def _checks(source: str) -> list[str]:
    environment = ImmutableSandboxedEnvironment()
    install(environment)
    tree = budgeted(environment.parse(source))
    return sorted(f.name for f in tree.find_all(nodes.Filter))


def test_each_check_sits_where_work_or_memory_can_multiply() -> None:
    assert _checks("{% for m in messages %}{{ m }}{% endfor %}") == [LOOP, OUT]
    assert _checks("{% set x = a * 2 %}") == sorted([KEEP, MUL])
    assert _checks("{% if 'x' in a %}{% endif %}") == [SCAN]
    assert _checks("{% if 'x' not in a %}{% endif %}") == [SCAN]
    assert _checks("{% set y = [a, b] %}") == sorted([KEEP, MADE])


def test_what_only_picks_or_compares_is_left_alone() -> None:
    assert _checks("{% set x = a.b %}{% if a == 'c' %}text{% endif %}") == []
    assert _checks("{{ 'constant' }}") == []  # constants are written as they are


def test_nothing_is_evaluated_at_compile_time() -> None:
    environment = ImmutableSandboxedEnvironment()
    install(environment)
    # folded, this would build a 10 GB string while compiling
    environment.from_string(budgeted(environment.parse("{{ 'x' * 10000000000 }}")))
