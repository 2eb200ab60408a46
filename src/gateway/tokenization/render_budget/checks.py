"""The checks a budgeted template's rewritten tree calls (``rewrite``), and the weights
they charge.

Each is a filter of the template's environment under a name no template spells by
accident (``LOOP``, ``OUT``, ...). Outside a render (``local.budget`` is None) each
passes its value through. They sit at boundaries, not on every instruction: a ``for``
loop charges its whole length once, a value is charged when written out or stored, an
operation that multiplies (``*``, ``**``, ``%``) is checked on its predicted size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context

from gateway.tokenization.render_budget.budget import MAX_INT_BITS, RenderBudget, local, over
from gateway.tokenization.render_budget.widths import check_printf


def _size(value: Any) -> int:
    """What storing ``value`` costs: a string its length, a container 8 per item."""
    kind = type(value)
    if kind is str or kind is bytes:
        return len(value)
    if kind is list or kind is tuple or kind is dict:
        return 8 * len(value)
    return 0


def _weight(budget: RenderBudget, value: Any) -> int:
    """About how many characters ``str(value)`` or ``tojson`` would write: counted through
    shared references, so a list holding the same list twice weighs twice that list. The
    request's own data are trees bounded by its size; a container the template built is
    weighed once and remembered (by identity, for this render)."""
    kind = type(value)
    if kind is str or kind is bytes:
        return len(value) + 2
    if kind is int:
        return value.bit_length() // 3 + 1
    if kind is not list and kind is not tuple and kind is not dict:
        return 4
    found = budget.weights.get(id(value))
    if found is not None:
        return found[1]
    total = 2
    for child in value.items() if kind is dict else value:
        total += _weight(budget, child)
    budget.weights[id(value)] = (value, total)
    return total


def admit(budget: RenderBudget, value: Any, weight: int) -> Any:
    """Remember a container the template built, its weight charged: what it holds may be
    new (``[big ~ i]`` in a loop keeps a new string each time) and writing it out costs
    that much."""
    budget.bytes -= weight
    if budget.bytes < 0:
        budget.short("bytes")
    budget.weights[id(value)] = (value, weight)
    return value


@pass_context
def made(context: Context | None, value: Any) -> Any:
    """A list, tuple or dict literal holding values computed at run time: weighed, so a
    structure that repeats itself (``[x, x]`` in a loop) cannot grow without bound."""
    budget = local.budget
    if budget is None:
        return value
    items = value.items() if type(value) is dict else value
    return admit(budget, value, 2 + sum(_weight(budget, item) for item in items))


@pass_context
def for_loop(context: Context, iterable: Any, body_chars: int) -> Any:
    """A ``for`` loop's iterable: its length charged once, as steps and as the loop body's
    literal text times the iterations (an iterator without a length is counted as it goes)."""
    budget = local.budget
    if budget is None:
        return iterable
    try:
        n = len(iterable)
    except TypeError:
        return _counted(iterable, budget, body_chars)
    if type(iterable) is not range:  # a range paid its steps when it was made
        budget.steps -= n
    budget.bytes -= n * body_chars
    if budget.steps < 0:
        budget.short("steps")
    if budget.bytes < 0:
        budget.short("bytes")
    return iterable


def _counted(iterable: Iterable[Any], budget: RenderBudget, body_chars: int) -> Iterator[Any]:
    for item in iterable:
        budget.steps -= 1
        budget.bytes -= body_chars
        if budget.steps < 0:
            budget.short("steps")
        if budget.bytes < 0:
            budget.short("bytes")
        yield item


@pass_context
def out(context: Context, value: Any) -> Any:
    """A value written to the output: its text charged."""
    text = value if type(value) is str else str(value)
    budget = local.budget
    if budget is not None:
        budget.bytes -= len(text)
        if budget.bytes < 0:
            budget.short("bytes")
    return text


@pass_context
def keep(context: Context, value: Any) -> Any:
    """A value computed and stored (``set``, ``with``): its size charged."""
    budget = local.budget
    if budget is not None:
        kind = type(value)
        budget.bytes -= len(value) if kind is str else _size(value)
        if budget.bytes < 0:
            budget.short("bytes")
    return value


@pass_context
def grow(context: Context, value: Any, before: Any) -> Any:
    """A value stored in a namespace attribute: what it is larger than the attribute's
    previous value charged."""
    budget = local.budget
    if budget is not None:
        budget.bytes -= max(0, _size(value) - _size(before))
        if budget.bytes < 0:
            budget.short("bytes")
    return value


def _sequence_product(left: Any, right: Any) -> int | None:
    """The length of ``left * right`` when it repeats a sequence, else None."""
    if isinstance(right, int) and isinstance(left, str | bytes | list | tuple):
        return len(left) * max(0, right)
    if isinstance(left, int) and isinstance(right, str | bytes | list | tuple):
        return len(right) * max(0, left)
    return None


@pass_context
def mul(context: Context, left: Any, right: Any) -> Any:
    budget = local.budget
    if budget is not None:
        length = _sequence_product(left, right)
        if length is not None:
            if isinstance(left, list | tuple) or isinstance(right, list | tuple):
                times, sequence = (right, left) if isinstance(right, int) else (left, right)
                budget.bytes -= 8 * length
                if budget.bytes < 0:
                    budget.short("bytes")
                return admit(budget, left * right, 2 + max(0, times) * _weight(budget, sequence))
            budget.bytes -= length
            if budget.bytes < 0:
                budget.short("bytes")
        elif type(left) is int and type(right) is int and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise over("int", budget)
    return left * right


@pass_context
def power(context: Context, left: Any, right: Any) -> Any:
    if (
        local.budget is not None and type(left) is int and type(right) is int and right > 0
        and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS
    ):  # fmt: skip
        raise over("int", local.budget)
    return left**right


@pass_context
def mod(context: Context, left: Any, right: Any) -> Any:
    if local.budget is not None and isinstance(left, str):
        check_printf(left, right)
    return left % right


@pass_context
def scan(context: Context, value: Any) -> Any:
    """A container searched (``needle in value``): its length charged as work, however
    short the needle (a search returns nothing to charge otherwise)."""
    budget = local.budget
    if budget is not None:
        kind = type(value)
        if kind is str or kind is bytes or kind is list or kind is tuple or kind is dict:
            budget.work -= len(value)
            if budget.work < 0:
                budget.short("work")
    return value


# Names of the checks in the environment's filters: not valid template identifiers' usual
# spelling, and harmless if a template calls them itself (they only check and pass through).
LOOP, OUT, KEEP, GROW, MUL, POW, MOD, MADE, SCAN = (
    f"__render_budget_{n}" for n in ("loop", "out", "keep", "grow", "mul", "pow", "mod", "made", "scan")
)

CHECKS: dict[str, Callable[..., Any]] = {
    LOOP: for_loop, OUT: out, KEEP: keep, GROW: grow, MUL: mul, POW: power, MOD: mod, MADE: made, SCAN: scan,
}
"""Each check under the filter name the rewritten tree calls it by."""
