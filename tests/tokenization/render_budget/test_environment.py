"""Making an environment budgeted: its class, its filters and globals, no folding."""

from __future__ import annotations

import pytest
from jinja2 import Environment
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.tokenization.render_budget import BudgetSandbox, install
from gateway.tokenization.render_budget.checks import CHECKS


def test_install_budgets_a_fresh_sandbox() -> None:
    environment = ImmutableSandboxedEnvironment()
    plain_range = environment.globals["range"]
    install(environment)
    assert isinstance(environment, BudgetSandbox) and environment.optimized is False
    assert all(environment.filters[name] is check for name, check in CHECKS.items())
    assert environment.globals["range"] is not plain_range
    install(environment)  # a budgeted one stays budgeted


def test_install_refuses_an_environment_that_is_not_the_sandbox() -> None:
    with pytest.raises(TypeError, match="cannot budget"):
        install(Environment())
