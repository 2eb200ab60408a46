"""The budgeted sandbox: jinja2's immutable sandbox whose calls are counted.

A call that re-enters template code (a macro, ``caller()``, a block, a recursive
``loop()``) charges a step and may nest at most ``MAX_DEPTH`` deep; a ``str`` method
charges the string it walks as work, and one that widens (``center``, ``replace``,
``join``, ...) is checked on its predicted size before it runs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.runtime import BlockReference, Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.tokenization.render_budget.budget import MAX_DEPTH, RenderBudget, local, over
from gateway.tokenization.render_budget.checks import for_loop
from gateway.tokenization.render_budget.widths import WIDENING, check_format, check_widening

# jinja2 runtime objects whose call runs template code again (recursion).
_REENTRANT = (Macro, LoopContext, BlockReference)


class BudgetSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, with calls that re-enter template code counted and
    nested at most ``MAX_DEPTH`` deep, and widening string methods checked."""

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        kind = type(__obj)
        if kind is types.BuiltinMethodType or kind is types.MethodType:
            budget = local.budget
            if budget is not None:
                owner = __obj.__self__
                if type(owner) is str or isinstance(owner, str | bytes):  # a str method, or a str subclass's (Markup)
                    budget.work -= len(owner)  # it walks the string, whatever it returns
                    if budget.work < 0:
                        budget.short("work")
                    if __obj.__name__ in WIDENING:
                        check_widening(__obj, args, kwargs)
        elif isinstance(__obj, _REENTRANT):
            budget = local.budget
            if budget is not None:
                return __self._reenter(budget, __context, __obj, args, kwargs)
        if not __self.is_safe_callable(__obj):  # jinja2's own call, inlined: it is on every method call
            raise SecurityError(f"{__obj!r} is not safely callable")
        return __context.call(__obj, *args, **kwargs)

    def _reenter(
        self, budget: RenderBudget, context: Context, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        budget.steps -= 1
        budget.depth += 1
        try:
            if budget.depth > MAX_DEPTH:
                raise over("depth", budget)
            if budget.steps < 0:
                budget.short("steps")
            for value in args:
                if type(value) is str:
                    budget.bytes -= len(value)
            if budget.bytes < 0:
                budget.short("bytes")
            if type(obj) is LoopContext and args:
                for_loop(context, args[0], 0)  # a recursive loop's next level
            if not self.is_safe_callable(obj):
                raise SecurityError(f"{obj!r} is not safely callable")
            return context.call(obj, *args, **kwargs)
        finally:
            budget.depth -= 1

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if type(value) is not types.BuiltinMethodType and type(value) is not types.MethodType:
            return None  # most values read are data: jinja2's own answer, without its checks
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and local.budget is not None and isinstance(value.__self__, str):
            check_format(value.__self__)
        return wrapped
