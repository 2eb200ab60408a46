"""A chat template's render budget: bounded work and bytes, so a template bomb fails in
about a millisecond instead of spinning a core or filling memory.

A chat template is code that usually comes from a worker. jinja2's sandbox keeps it from
reaching outside, but not from multiplying work or memory: nested loops, ``'x' * 10**9``,
``9 ** (9 ** 9)``, a macro calling itself, a string doubled in a loop, or a filter with a
huge width. Some of these would even run at compile time (jinja2 folds constant
expressions while compiling). A CPU deadline alone cannot stop the ones that run inside a
single C call (a 10 GB string multiplication never returns to the bytecode loop).

So the template is compiled through ``budgeted``, which rewrites its syntax tree so that
the points where work or memory can multiply are checked, and nothing is folded at compile
time. The checks sit at boundaries, not on every instruction, so an honest render pays a
few calls:

* **steps**: a ``for`` loop charges its whole length when it starts (one call per loop,
  none per iteration; an iterator without a length is counted as it goes), ``range(n)``
  charges ``n``, a filter that walks its input (``join``, ``map``, ``sort``, ...) charges
  the input's length, and every macro, ``caller()``, block or recursive ``loop()`` call
  charges one and may nest at most ``MAX_DEPTH`` deep;
* **bytes**: every value written to the output or stored (``set``, ``with``, a macro's
  string arguments) is charged its length (a namespace attribute what it grew by); operations that multiply (``*``, ``**``,
  ``%``, ``str.format`` widths, ``center``, ``indent``, ``replace``, ``join``,
  ``tojson(indent=...)``, ``lipsum``) are checked on their predicted size before they run.

Both budgets scale with the request (``start``, ``RenderBudget.short``). Going over either raises
``BudgetExceeded``, a ``BaseException``: template code cannot catch it, and jinja2 does not
rewrite its traceback (for a deep recursion that rewrite alone took tens of milliseconds).
"""

from __future__ import annotations

import functools
import re
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.exceptions import SecurityError
from jinja2.runtime import BlockReference, Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import generate_lorem_ipsum

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

# jinja2 runtime objects whose call runs template code again (recursion).
_REENTRANT = (Macro, LoopContext, BlockReference)
# String methods whose result can be much longer than their inputs.
_WIDENING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate"})
_NUMBER = re.compile(r"\d+")
# A printf conversion's flags, width and precision (``%-10.3s``, ``%*d``).
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?([#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[hlL]?[a-zA-Z%]")



class _Local(threading.local):
    budget: RenderBudget | None = None  # the render running on this thread
    spare: RenderBudget | None = None  # this thread's budget object, reused render after render


_tls = _Local()


class BudgetExceeded(BaseException):
    """The render went over its budget. A ``BaseException`` so that neither template code
    nor the ``except Exception`` around a render swallows it."""


class RenderBudget:
    """What one render may still spend: ``BASE_STEPS`` and ``BASE_BYTES``, plus a share
    proportional to the request, worked out only when a render runs past the base (most
    never do, and the count is a walk over the messages)."""

    __slots__ = ("bytes", "depth", "request", "steps", "total_bytes", "total_steps", "weights")

    def __init__(self, steps: int = BASE_STEPS, bytes_: int = BASE_BYTES, request: tuple[Any, ...] | None = None) -> None:
        self.steps = self.total_steps = steps
        self.bytes = self.total_bytes = bytes_
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
        if self.steps < 0:
            raise _over("steps", self)
        if self.bytes < need:
            raise _over("bytes", self)


def start(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, documents: Sequence[Any] | None) -> None:
    """Give this thread's next render the base budget, to grow by this request's share
    when needed (``RenderBudget.short``: its items for steps, its text for bytes, a tool or
    document counting as ``CHARS_PER_TOOL``), reusing the thread's budget object: a
    render's fixed cost stays a few attribute writes."""
    budget = _tls.spare
    if budget is None:
        budget = _tls.spare = RenderBudget()
    budget.steps = budget.total_steps = BASE_STEPS
    budget.bytes = budget.total_bytes = BASE_BYTES
    budget.depth = 0
    budget.request = (messages, tools, documents)
    _tls.budget = budget


def stop() -> None:
    """End this thread's render budget (its remembered containers are let go)."""
    budget: RenderBudget | None = _tls.budget
    _tls.budget = None
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
    return _tls.budget


def _over(what: str, budget: RenderBudget) -> BudgetExceeded:
    if what == "steps":
        return BudgetExceeded(f"the chat template ran past its budget of {budget.total_steps} loop steps and calls")
    if what == "depth":
        return BudgetExceeded(f"the chat template nested calls deeper than {MAX_DEPTH}")
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


def _admit(budget: RenderBudget, value: Any, weight: int) -> Any:
    """Remember a container the template built, its weight charged: what it holds may be
    new (``[big ~ i]`` in a loop keeps a new string each time) and writing it out costs
    that much."""
    budget.bytes -= weight
    if budget.bytes < 0:
        budget.short("bytes")
    budget.weights[id(value)] = (value, weight)
    return value


# ----------------------------------------------------------- checks the tree calls
@pass_context
def _made(context: Context | None, value: Any) -> Any:
    """A list, tuple or dict literal holding values computed at run time: weighed, so a
    structure that repeats itself (``[x, x]`` in a loop) cannot grow without bound."""
    budget = _tls.budget
    if budget is None:
        return value
    items = value.items() if type(value) is dict else value
    return _admit(budget, value, 2 + sum(_weight(budget, item) for item in items))


@pass_context
def _loop(context: Context, iterable: Any, body_chars: int) -> Any:
    """A ``for`` loop's iterable: its length charged once, as steps and as the loop body's
    literal text times the iterations (an iterator without a length is counted as it goes)."""
    budget = _tls.budget
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
def _out(context: Context, value: Any) -> Any:
    """A value written to the output: its text charged."""
    text = value if type(value) is str else str(value)
    budget = _tls.budget
    if budget is not None:
        budget.bytes -= len(text)
        if budget.bytes < 0:
            budget.short("bytes")
    return text


@pass_context
def _keep(context: Context, value: Any) -> Any:
    """A value computed and stored (``set``, ``with``): its size charged."""
    budget = _tls.budget
    if budget is not None:
        kind = type(value)
        budget.bytes -= len(value) if kind is str else _size(value)
        if budget.bytes < 0:
            budget.short("bytes")
    return value


@pass_context
def _grow(context: Context, value: Any, before: Any) -> Any:
    """A value stored in a namespace attribute: what it is larger than the attribute's
    previous value charged."""
    budget = _tls.budget
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
def _mul(context: Context, left: Any, right: Any) -> Any:
    budget = _tls.budget
    if budget is not None:
        length = _sequence_product(left, right)
        if length is not None:
            if isinstance(left, list | tuple) or isinstance(right, list | tuple):
                times, sequence = (right, left) if isinstance(right, int) else (left, right)
                budget.bytes -= 8 * length
                if budget.bytes < 0:
                    budget.short("bytes")
                return _admit(budget, left * right, 2 + max(0, times) * _weight(budget, sequence))
            budget.bytes -= length
            if budget.bytes < 0:
                budget.short("bytes")
        elif type(left) is int and type(right) is int and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _over("int", budget)
    return left * right


@pass_context
def _pow(context: Context, left: Any, right: Any) -> Any:
    if (
        _tls.budget is not None and type(left) is int and type(right) is int and right > 0
        and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS
    ):  # fmt: skip
        raise _over("int", _tls.budget)
    return left**right


@pass_context
def _mod(context: Context, left: Any, right: Any) -> Any:
    if _tls.budget is not None and isinstance(left, str):
        _check_printf(left, right)
    return left % right


def _check_printf(fmt: str, args: Any) -> None:
    """``fmt % args`` writes at most the widths and precisions its conversions name, each
    checked before it runs (a ``*`` takes its width from the arguments)."""
    if "%" not in fmt:
        return
    widths = 0
    for spec in _PRINTF_SPEC.findall(fmt):
        if "*" in spec:
            values = args if isinstance(args, tuple) else (args,)
            widths += sum(abs(v) for v in values if type(v) is int)
        widths += sum(int(n) if len(n) < 12 else 1 << 62 for n in _NUMBER.findall(spec))
    charge_bytes(widths)


def _check_format(fmt: str) -> None:
    """``fmt.format(...)``: each field's width and precision checked before it runs; one
    taken from the arguments (``{:{w}}``) cannot be, and counts as the whole budget."""
    widths = 0
    for _, _, spec, _ in _formatter_parse(fmt):
        if spec:
            if "{" in spec:
                widths += 1 << 62
            widths += sum(int(n) if len(n) < 12 else 1 << 62 for n in _NUMBER.findall(spec))
    charge_bytes(widths)


def _formatter_parse(fmt: str) -> Iterable[tuple[str, str | None, str | None, str | None]]:
    import _string  # the parser str.format itself uses

    try:
        return list(_string.formatter_parser(fmt))
    except ValueError:
        return []  # str.format raises the same error itself


def _check_widening(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """A string method whose result may be much longer than the string: its size predicted."""
    owner = method.__self__
    name = method.__name__
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else 0
        if type(width) is int:
            charge_bytes(width)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if type(size) is int:
            charge_bytes(owner.count("\t" if isinstance(owner, str) else b"\t") * size)
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str | bytes) and isinstance(new, str | bytes):
            charge_bytes((len(owner) // max(1, len(old)) + 1) * len(new))
    elif name == "join" and args:
        _check_join(args[0], owner)
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str | bytes)), default=1)
        charge_bytes(len(owner) * longest)


def _check_join(items: Any, separator: Any) -> None:
    try:
        n = len(items)
    except TypeError:
        return  # counted by whatever made the iterator
    charge_steps(n)
    charge_bytes(n * len(separator) + sum(len(x) for x in items if isinstance(x, str)) if n else 0)


# --------------------------------------------------------------------- the sandbox
class BudgetSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, with calls that re-enter template code counted and
    nested at most ``MAX_DEPTH`` deep, and widening string methods checked."""

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        kind = type(__obj)
        if kind is types.BuiltinMethodType or kind is types.MethodType:
            if __obj.__name__ in _WIDENING and _tls.budget is not None and isinstance(__obj.__self__, str | bytes):
                _check_widening(__obj, args, kwargs)  # a str method, or a str subclass's (Markup)
        elif isinstance(__obj, _REENTRANT):
            budget = _tls.budget
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
                raise _over("depth", budget)
            if budget.steps < 0:
                budget.short("steps")
            for value in args:
                if type(value) is str:
                    budget.bytes -= len(value)
            if budget.bytes < 0:
                budget.short("bytes")
            if type(obj) is LoopContext and args:
                _loop(context, args[0], 0)  # a recursive loop's next level
            if not self.is_safe_callable(obj):
                raise SecurityError(f"{obj!r} is not safely callable")
            return context.call(obj, *args, **kwargs)
        finally:
            budget.depth -= 1

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if type(value) is not types.BuiltinMethodType and type(value) is not types.MethodType:
            return None  # most values read are data: jinja2's own answer, without its checks
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _tls.budget is not None and isinstance(value.__self__, str):
            _check_format(value.__self__)
        return wrapped


# --------------------------------------------------------- filters and globals
def _value_at(f: Callable[..., Any]) -> int:
    """Where a filter's value argument is (after the context/environment jinja2 passes)."""
    return 1 if getattr(f, "jinja_pass_arg", None) is not None else 0


def _walking(f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that walks its input: the input's length charged as steps."""
    at = _value_at(f)

    @functools.wraps(f)
    def walk(*args: Any, **kwargs: Any) -> Any:
        if _tls.budget is not None and len(args) > at:
            try:
                n = len(args[at])
            except TypeError:
                n = 0
            charge_steps(n)
        return f(*args, **kwargs)

    return walk


def _widening(f: Callable[..., Any], predict: Callable[..., int]) -> Callable[..., Any]:
    """A filter whose result may be much longer than its input: its size predicted."""
    at = _value_at(f)

    @functools.wraps(f)
    def widen(*args: Any, **kwargs: Any) -> Any:
        if _tls.budget is not None:
            charge_bytes(predict(*args[at:], **kwargs))
        return f(*args, **kwargs)

    return widen


def _text_len(s: Any) -> int:
    return len(s) if isinstance(s, str) else len(str(s))


def _predict_center(s: Any, width: Any = 80, *_: Any, **__: Any) -> int:
    return width if type(width) is int else 0


def _predict_indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> int:
    text = s if isinstance(s, str) else ""
    per_line = width if type(width) is int else len(width) if isinstance(width, str) else 0
    return (text.count("\n") + 1) * per_line


def _predict_wordwrap(s: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None, **kw: Any) -> int:
    wrap = kw.get("wrapstring", wrapstring)
    text = _text_len(s)
    return text * (len(wrap) if isinstance(wrap, str) else 1) // max(1, width if type(width) is int else 1)


def _predict_replace(s: Any, old: Any = "", new: Any = "", *_: Any, **__: Any) -> int:
    return (_text_len(s) // max(1, _text_len(old)) + 1) * _text_len(new)


def _predict_format(s: Any, *args: Any, **kwargs: Any) -> int:
    if isinstance(s, str):
        _check_printf(s, tuple(args))
    return 0


def _predict_join(items: Any, d: Any = "", *_: Any, **__: Any) -> int:
    _check_join(items, d if isinstance(d, str) else "")
    return 0


def _predict_tojson(value: Any, ensure_ascii: Any = False, indent: Any = None, *_: Any, **kw: Any) -> int:
    indent = kw.get("indent", indent)
    if (type(indent) is int and indent > MAX_INDENT) or (isinstance(indent, str) and len(indent) > MAX_INDENT):
        return 1 << 62
    return 0


def _predict_slice(value: Any, slices: Any = 1, *_: Any, **__: Any) -> int:
    if type(slices) is int:
        charge_steps(slices)
    return 0


def _filling(f: Callable[..., Any]) -> Callable[..., Any]:
    """``batch``/``slice`` with ``fill_with``: the filler is repeated, so the result is
    built and weighed like a literal."""
    at = _value_at(f)

    @functools.wraps(f)
    def fill(*args: Any, **kwargs: Any) -> Any:
        result = f(*args, **kwargs)
        if _tls.budget is None or (len(args) <= at + 2 and kwargs.get("fill_with") is None):
            return result
        count = args[at + 1] if len(args) > at + 1 else kwargs.get("linecount", kwargs.get("slices", 0))
        charge_steps(count if type(count) is int else 0)
        return _made(None, [list(chunk) for chunk in result])

    return fill


def _predict_sum(iterable: Any, attribute: Any = None, start: Any = 0, **kw: Any) -> int:
    start = kw.get("start", start)
    if isinstance(start, int | float):
        return 0
    try:  # sequences added one after another: each partial result is a new copy
        sizes = [len(x) for x in iterable]
    except TypeError:
        return 0
    total, copied = len(start) if hasattr(start, "__len__") else 0, 0
    for size in sizes:
        total += size
        copied += total
    charge_steps(copied // 64)
    return 8 * total


_WALKING_FILTERS = (
    "batch", "dictsort", "groupby", "list", "map", "max", "min", "reject", "rejectattr", "reverse",
    "select", "selectattr", "sort", "unique", "items",
)  # fmt: skip
_WIDENING_FILTERS: dict[str, Callable[..., int]] = {
    "center": _predict_center,
    "indent": _predict_indent,
    "wordwrap": _predict_wordwrap,
    "replace": _predict_replace,
    "format": _predict_format,
    "join": _predict_join,
    "tojson": _predict_tojson,
    "slice": _predict_slice,
    "sum": _predict_sum,
}


def _range(*args: Any) -> range:
    rng = safe_range(*args)
    charge_steps(len(rng))
    return rng


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if _tls.budget is not None:
        charge_steps(n if type(n) is int else 0)
        charge_bytes((n if type(n) is int else 0) * (max if type(max) is int else 0) * 12)
    return str(generate_lorem_ipsum(n, html, min, max))


class _Dict:
    """The template's ``dict``: ``dict(...)`` and ``dict.fromkeys(keys, value)`` (which
    repeats ``value``) weighed like a literal."""

    def __init__(self, made: Any) -> None:
        self._made = made

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _made(None, self._made(*args, **kwargs))

    def fromkeys(self, *args: Any, **kwargs: Any) -> Any:
        return _made(None, self._made.fromkeys(*args, **kwargs))


# Names of the checks in the environment's filters: not valid template identifiers' usual
# spelling, and harmless if a template calls them itself (they only check and pass through).
LOOP, OUT, KEEP, GROW, MUL, POW, MOD, MADE = (
    f"__render_budget_{n}" for n in ("loop", "out", "keep", "grow", "mul", "pow", "mod", "made")
)


def install(environment: ImmutableSandboxedEnvironment) -> None:
    """Make ``environment`` (a fresh one, owned by one template) budgeted: its class, the
    checks its rewritten templates call, its widening filters and globals wrapped, and no
    constant folding at compile time."""
    if type(environment) is ImmutableSandboxedEnvironment:
        environment.__class__ = BudgetSandbox
    elif not isinstance(environment, BudgetSandbox):
        raise TypeError(f"cannot budget a {type(environment).__name__}")
    environment.optimized = False
    filters = dict(environment.filters)
    for name in _WALKING_FILTERS:
        if name in filters:
            filters[name] = _walking(filters[name])
    for name, predict in _WIDENING_FILTERS.items():
        if name in filters:
            filters[name] = _widening(filters[name], predict)
    for name in ("batch", "slice"):
        if name in filters:
            filters[name] = _filling(filters[name])
    filters.update({LOOP: _loop, OUT: _out, KEEP: _keep, GROW: _grow, MUL: _mul, POW: _pow, MOD: _mod, MADE: _made})
    environment.filters = filters
    global_names = dict(environment.globals)
    global_names["range"] = _range
    global_names["lipsum"] = _lipsum
    if "dict" in global_names:
        global_names["dict"] = _Dict(global_names["dict"])
    environment.globals = global_names


# ------------------------------------------------------------- the tree rewrite
_BINOPS: dict[type[nodes.BinExpr], str] = {nodes.Mul: MUL, nodes.Pow: POW, nodes.Mod: MOD}


def _check(node: nodes.Node, name: str, *args: nodes.Expr) -> nodes.Filter:
    return nodes.Filter(node, name, list(args), [], None, None, lineno=node.lineno)


def _literal_chars(body: Sequence[nodes.Node]) -> int:
    """The most literal text a loop body can write per iteration: the template data and
    constant strings of its outputs, every branch counted (nested loops charge their own;
    computed outputs are charged as they are written)."""
    total = 0
    stack: list[nodes.Node] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if isinstance(child, nodes.TemplateData):
                    total += len(child.data)
                elif isinstance(child, nodes.Const) and isinstance(child.value, str):
                    total += len(child.value)
        elif isinstance(node, nodes.Stmt) and not isinstance(node, nodes.For | nodes.Macro):
            stack.extend(node.iter_child_nodes())
    return total


# Methods and filters whose result is never larger than what they are given.
_SHRINKING = frozenset({
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "lower", "upper", "title", "capitalize",
    "startswith", "endswith", "removeprefix", "removesuffix", "count", "find", "rfind", "index", "get", "keys",
    "values", "items", "length", "int", "float", "abs", "round", "trim", "first", "last", "default", "d", "e",
    "bool", "wordcount", "truncate", "striptags",
})  # fmt: skip


def _refers(node: nodes.Node) -> bool:
    """True when storing the expression's value cannot grow anything across a loop: it picks
    existing values (a name, an item, an attribute, a slice), computes a number or a test,
    or calls a method or filter whose result is no larger than its inputs. (``string`` and
    ``tojson`` are no larger than the value's weight, which ``_made`` bounds.)"""
    if isinstance(node, nodes.Const | nodes.Name | nodes.Not | nodes.Compare | nodes.Test):
        return True
    if isinstance(node, nodes.Getattr):
        return _refers(node.node)
    if isinstance(node, nodes.Getitem):
        return _refers(node.node) and (isinstance(node.arg, nodes.Slice) or _refers(node.arg))
    if isinstance(node, nodes.And | nodes.Or):
        return _refers(node.left) and _refers(node.right)
    if isinstance(node, nodes.Sub | nodes.Div | nodes.FloorDiv | nodes.Neg | nodes.Pos):
        return True  # numbers only: str and list have no such operators
    if isinstance(node, nodes.CondExpr):
        return _refers(node.expr1) and (node.expr2 is None or _refers(node.expr2))
    if isinstance(node, nodes.Filter):
        return node.name in _SHRINKING and node.node is not None and _refers(node.node) and all(
            _refers(a) for a in node.args)
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        return node.node.attr in _SHRINKING and _refers(node.node.node) and all(_refers(a) for a in node.args)
    return False


class _Rewriter:
    """Rewrites a parsed template in place so every check above is called where it applies."""

    def visit(self, node: nodes.Node) -> nodes.Node:
        for field, old in node.iter_fields():
            if isinstance(old, list):
                setattr(node, field, [self.visit(n) if isinstance(n, nodes.Node) else n for n in old])
            elif isinstance(old, nodes.Node):
                setattr(node, field, self.visit(old))
        return self._rewrite(node)

    def _rewrite(self, node: nodes.Node) -> nodes.Node:
        if isinstance(node, nodes.BinExpr) and type(node) in _BINOPS:
            return _check(node.left, _BINOPS[type(node)], node.right)
        if isinstance(node, nodes.List | nodes.Dict) or (isinstance(node, nodes.Tuple) and node.ctx == "load"):
            items = [i.value if isinstance(i, nodes.Pair) else i for i in node.items]
            items += [i.key for i in node.items if isinstance(i, nodes.Pair)]
            if not all(isinstance(i, nodes.Const) for i in items):
                return _check(node, MADE)
        if isinstance(node, nodes.Output):
            node.nodes = [n if isinstance(n, nodes.TemplateData | nodes.Const) else _check(n, OUT) for n in node.nodes]
        elif isinstance(node, nodes.For):
            node.iter = _check(node.iter, LOOP, nodes.Const(_literal_chars(node.body)))
        elif isinstance(node, nodes.Assign):
            if isinstance(node.target, nodes.NSRef) and not _refers(node.node):
                # a namespace attribute outlives the iteration: what it grows by is charged,
                # so an accumulator costs its final size and a doubling its final size too
                before = nodes.Getattr(nodes.Name(node.target.name, "load"), node.target.attr, "load")
                node.node = _check(node.node, GROW, before)
            elif not _refers(node.node):
                node.node = _check(node.node, KEEP)
        elif isinstance(node, nodes.With):
            node.values = [v if _refers(v) else _check(v, KEEP) for v in node.values]
        elif isinstance(node, nodes.EvalContextModifier):
            for option in node.options:  # never evaluated at compile time
                option.value = _check(option.value, KEEP)
        return node


def budgeted(template: nodes.Template) -> nodes.Template:
    """``template`` (parsed by a budgeted environment) rewritten with its checks."""
    rewritten = _Rewriter().visit(template)
    assert isinstance(rewritten, nodes.Template)
    return rewritten
