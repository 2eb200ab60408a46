"""What one render may still spend, kept per thread: loop steps and calls, characters
written or stored, characters read or made (``work``), and call depth.

The checks (``checks``, ``filters``, ``sandbox``) subtract from the budget of the render
running on their thread (``local.budget``); only when one runs short does the budget add
the request's share (``RenderBudget.short``), so an honest render pays a few attribute
writes. Going over raises ``BudgetExceeded``, a ``BaseException``: template code cannot
catch it, and jinja2 does not rewrite its traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

BASE_STEPS = 4096
"""Loop iterations, calls and walked items any render may take."""

STEPS_PER_ITEM = 32
"""More per message, tool, document, content part and tool call in the request."""

BASE_BYTES = 4 << 20
"""Characters any render may write or store."""

BYTES_PER_CHAR = 8
"""More per character of the messages' text."""

QUADRATIC_ITEMS = 4096
"""Steps also grow by items x min(items, this) / 2: honest templates scan the conversation
once per message (gpt-oss looks ahead from every tool call), so long conversations need
quadratic room; a bomb sent with thousands of tiny messages is left to the CPU deadline."""

CHARS_PER_TOOL = 16 << 10
"""Characters a tool or document counts for in the byte budget."""

MAX_DEPTH = 64
"""Nested macro, block and recursive-loop calls."""

MAX_INT_BITS = 8192
"""Largest integer ``*`` or ``**`` may produce."""

MAX_INDENT = 64
"""Largest ``tojson`` indent."""

BASE_WORK = 16 << 20
"""Characters any render may read or make (a string a method or filter walks, a value a
filter builds, a container searched with ``in``), stored or not."""

WORK_PER_CHAR = 32
"""More per character of the messages' text (a tool or document: ``CHARS_PER_TOOL``)."""


class _Local(threading.local):
    budget: RenderBudget | None = None  # the render running on this thread
    spare: RenderBudget | None = None  # this thread's budget object, reused render after render


local = _Local()
"""This thread's render: ``local.budget`` is None outside a render (every check passes)."""


class BudgetExceeded(BaseException):
    """The render went over its budget. A ``BaseException`` so that neither template code
    nor the ``except Exception`` around a render swallows it."""


class RenderBudget:
    """What one render may still spend: ``BASE_STEPS`` and ``BASE_BYTES``, plus a share
    proportional to the request, worked out only when a render runs past the base (most
    never do, and the count is a walk over the messages)."""

    __slots__ = ("bytes", "depth", "request", "steps", "total_bytes", "total_steps", "total_work", "weights", "work")

    def __init__(
        self, steps: int = BASE_STEPS, bytes_: int = BASE_BYTES, request: tuple[Any, ...] | None = None,
        work: int = BASE_WORK,
    ) -> None:
        self.steps = self.total_steps = steps
        self.bytes = self.total_bytes = bytes_
        self.work = self.total_work = work
        self.depth = 0
        self.request = request  # (messages, tools, documents) until their share is added
        self.weights: dict[int, tuple[Any, int]] = {}  # id -> (container, weight); the container kept alive

    def short(self, what: str, need: int = 0) -> None:
        """The render ran out of ``what``: add the request's share once, then refuse if
        still short (``need``: bytes about to be spent)."""
        if self.request is not None:
            messages, tools, documents = self.request
            self.request = None
            extra = len(tools or ()) + len(documents or ())
            items, chars = len(messages) + extra, CHARS_PER_TOOL * extra
            for message in messages:
                n, c = _measure(message, 4)
                items += n
                chars += c
            steps = STEPS_PER_ITEM * items + items * min(items, QUADRATIC_ITEMS) // 2
            self.steps += steps
            self.total_steps += steps
            self.bytes += BYTES_PER_CHAR * chars
            self.total_bytes += BYTES_PER_CHAR * chars
            self.work += WORK_PER_CHAR * chars
            self.total_work += WORK_PER_CHAR * chars
        if self.steps < 0:
            raise over("steps", self)
        if self.work < 0:
            raise over("work", self)
        if self.bytes < need:
            raise over("bytes", self)


def start(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, documents: Sequence[Any] | None) -> None:
    """Give this thread's next render the base budget, to grow by this request's share
    when needed (``RenderBudget.short``: its items for steps, its text for bytes, a tool or
    document counting as ``CHARS_PER_TOOL``), reusing the thread's budget object: a
    render's fixed cost stays a few attribute writes."""
    budget = local.spare
    if budget is None:
        budget = local.spare = RenderBudget()
    budget.steps = budget.total_steps = BASE_STEPS
    budget.bytes = budget.total_bytes = BASE_BYTES
    budget.work = budget.total_work = BASE_WORK
    budget.depth = 0
    budget.request = (messages, tools, documents)
    local.budget = budget


def stop() -> None:
    """End this thread's render budget (its remembered containers are let go)."""
    budget: RenderBudget | None = local.budget
    local.budget = None
    if budget is not None:
        budget.request = None
        if budget.weights:
            budget.weights.clear()


def _measure(value: Any, depth: int) -> tuple[int, int]:
    """(list items, characters) in ``value``, ``depth`` levels down (below: 256 characters
    per container, a generous guess for JSON a client sent as an object)."""
    kind = type(value)
    if kind is str:
        return 0, len(value)
    if kind is not dict and kind is not list:
        return 0, 8
    if depth == 0:
        return 0, 256
    items, chars = (len(value), 0) if kind is list else (0, 0)
    for child in value.values() if kind is dict else value:
        n, c = _measure(child, depth - 1)
        items += n
        chars += c
    return items, chars


def active() -> RenderBudget | None:
    """The budget of the render running on this thread, if any."""
    return local.budget


def over(what: str, budget: RenderBudget) -> BudgetExceeded:
    if what == "steps":
        return BudgetExceeded(f"the chat template ran past its budget of {budget.total_steps} loop steps and calls")
    if what == "depth":
        return BudgetExceeded(f"the chat template nested calls deeper than {MAX_DEPTH}")
    if what == "work":
        return BudgetExceeded(
            f"the chat template read or made more than its budget of {budget.total_work} characters"
        )
    if what == "int":
        return BudgetExceeded(f"the chat template made an integer larger than {MAX_INT_BITS} bits")
    return BudgetExceeded(f"the chat template wrote or stored more than its budget of {budget.total_bytes} characters")


def charge_steps(n: int) -> None:
    budget = active()
    if budget is not None:
        budget.steps -= n
        if budget.steps < 0:
            budget.short("steps")


def charge_bytes(n: int) -> None:
    budget = active()
    if budget is not None:
        budget.bytes -= n
        if budget.bytes < 0:
            budget.short("bytes")


def charge_work(n: int) -> None:
    """``n`` characters read or made: a string walked, a value built and dropped."""
    budget = local.budget
    if budget is not None:
        budget.work -= n
        if budget.work < 0:
            budget.short("work")
