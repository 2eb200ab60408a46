"""A chat template's render budget: bounded work and bytes, so a template bomb fails in
about a millisecond instead of spinning a core or filling memory.

A chat template is code that usually comes from a worker. jinja2's sandbox keeps it from
reaching outside, but not from multiplying work or memory: nested loops, ``'x' * 10**9``,
``9 ** (9 ** 9)``, a macro calling itself, a string doubled in a loop, a filter with a
huge width, or the conversation serialized again and again without writing anything.
Some of these would even run at compile time (jinja2 folds constant expressions while
compiling). A CPU deadline alone cannot stop the ones that run inside a single C call
(a 10 GB string multiplication never returns to the bytecode loop).

So the template is compiled through ``budgeted`` (``rewrite``), which rewrites its syntax
tree so that the points where work or memory can multiply are checked (``checks``), in an
environment whose filters, globals and calls are budgeted too (``environment``,
``filters``, ``sandbox``, ``widths``); every render runs under the budget of its thread
(``budget``), sized by the request:

* **steps**: loop iterations (a ``for`` charges its length once), ``range(n)``, walking
  filters, and calls that re-enter template code (nested at most ``MAX_DEPTH`` deep);
* **bytes**: what is written out or stored, and the predicted size of operations that
  multiply, before they run;
* **work**: characters read or made whether kept or not (a string a method or filter
  walks, a filter's result, a container searched with ``in``).
"""

from gateway.tokenization.render_budget.budget import (
    BASE_BYTES,
    BASE_STEPS,
    BASE_WORK,
    BYTES_PER_CHAR,
    CHARS_PER_TOOL,
    MAX_DEPTH,
    MAX_INDENT,
    MAX_INT_BITS,
    QUADRATIC_ITEMS,
    STEPS_PER_ITEM,
    WORK_PER_CHAR,
    BudgetExceeded,
    RenderBudget,
    active,
    start,
    stop,
)
from gateway.tokenization.render_budget.environment import install
from gateway.tokenization.render_budget.rewrite import budgeted
from gateway.tokenization.render_budget.sandbox import BudgetSandbox

__all__ = [
    "BASE_BYTES", "BASE_STEPS", "BASE_WORK", "BYTES_PER_CHAR", "CHARS_PER_TOOL", "MAX_DEPTH", "MAX_INDENT",
    "MAX_INT_BITS", "QUADRATIC_ITEMS", "STEPS_PER_ITEM", "WORK_PER_CHAR", "BudgetExceeded", "BudgetSandbox",
    "RenderBudget", "active", "budgeted", "install", "start", "stop",
]
