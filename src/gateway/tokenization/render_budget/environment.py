"""Making a template's environment budgeted."""

from __future__ import annotations

from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.tokenization.render_budget.checks import CHECKS
from gateway.tokenization.render_budget.filters import budgeted_filters, budgeted_globals
from gateway.tokenization.render_budget.sandbox import BudgetSandbox


def install(environment: ImmutableSandboxedEnvironment) -> None:
    """Make ``environment`` (a fresh one, owned by one template) budgeted: its class, the
    checks its rewritten templates call, its filters and globals wrapped, and no
    constant folding at compile time."""
    if type(environment) is ImmutableSandboxedEnvironment:
        environment.__class__ = BudgetSandbox
    elif not isinstance(environment, BudgetSandbox):
        raise TypeError(f"cannot budget a {type(environment).__name__}")
    environment.optimized = False
    filters = budgeted_filters(dict(environment.filters))
    filters.update(CHECKS)
    environment.filters = filters
    environment.globals = budgeted_globals(dict(environment.globals))
