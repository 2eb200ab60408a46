"""jinja2's filters and globals, budgeted: what they walk, widen or build is charged.

A filter that walks its input (``map``, ``sort``, ...) charges the input's length as
steps; one whose result may be much longer than its input (``center``, ``indent``,
``replace``, ``join``, ``tojson(indent=...)``) is checked on its predicted size; one that
walks or builds a string (``tojson``, ``string``, ``trim``, ...) charges what it reads and
makes as work, so a template that serializes
the conversation again and again without writing anything (``messages|tojson`` in a
loop) runs out of work in milliseconds. ``range``, ``lipsum`` and ``dict`` are the
globals that can multiply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jinja2.sandbox import safe_range
from jinja2.utils import generate_lorem_ipsum

from gateway.tokenization.render_budget.budget import MAX_INDENT, charge_bytes, charge_steps, local
from gateway.tokenization.render_budget.checks import made
from gateway.tokenization.render_budget.widths import check_join, check_printf


def _value_at(f: Callable[..., Any]) -> int:
    """Where a filter's value argument is (after the context/environment jinja2 passes)."""
    return 1 if getattr(f, "jinja_pass_arg", None) is not None else 0


def _walking(f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that walks its input: the input's length charged as steps."""
    at = _value_at(f)

    @functools.wraps(f)
    def walk(*args: Any, **kwargs: Any) -> Any:
        if local.budget is not None and len(args) > at:
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
        if local.budget is not None:
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
        check_printf(s, tuple(args))
    return 0


def _predict_join(items: Any, d: Any = "", *_: Any, **__: Any) -> int:
    check_join(items, d if isinstance(d, str) else "")
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
        if local.budget is None or (len(args) <= at + 2 and kwargs.get("fill_with") is None):
            return result
        count = args[at + 1] if len(args) > at + 1 else kwargs.get("linecount", kwargs.get("slices", 0))
        charge_steps(count if type(count) is int else 0)
        return made(None, [list(chunk) for chunk in result])

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
    if local.budget is not None:
        charge_steps(n if type(n) is int else 0)
        charge_bytes((n if type(n) is int else 0) * (max if type(max) is int else 0) * 12)
    return str(generate_lorem_ipsum(n, html, min, max))


class _Dict:
    """The template's ``dict``: ``dict(...)`` and ``dict.fromkeys(keys, value)`` (which
    repeats ``value``) weighed like a literal."""

    def __init__(self, made: Any) -> None:
        self.made = made

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return made(None, self.made(*args, **kwargs))

    def fromkeys(self, *args: Any, **kwargs: Any) -> Any:
        return made(None, self.made.fromkeys(*args, **kwargs))


# Filters that walk a string or build one as long as their input (the rest pick, count or
# convert, or are charged as walking, widening or filling filters below).
_READING_FILTERS = (
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "lower", "pprint", "replace",
    "safe", "string", "striptags", "title", "tojson", "trim", "truncate", "upper", "urlencode", "urlize",
    "wordcount", "wordwrap", "xmlattr",
)  # fmt: skip


def _reading(f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose cost is the string it is given and the string it returns: both
    charged as work (what it builds costs as much even when dropped)."""
    at = _value_at(f)

    @functools.wraps(f)
    def read(*args: Any, **kwargs: Any) -> Any:
        budget = local.budget
        if budget is None:
            return f(*args, **kwargs)
        if len(args) > at:
            value = args[at]
            if isinstance(value, str | bytes):
                budget.work -= len(value)
        result = f(*args, **kwargs)
        if isinstance(result, str | bytes):
            budget.work -= len(result)
        if budget.work < 0:
            budget.short("work")
        return result

    return read


def budgeted_filters(filters: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """``filters`` with the string-reading ones charging their work, and the walking,
    widening and filling ones checked (the checks of ``checks`` are added by the caller)."""
    out = dict(filters)
    for name in _READING_FILTERS:
        if name in out:
            out[name] = _reading(out[name])
    for name in _WALKING_FILTERS:
        if name in out:
            out[name] = _walking(out[name])
    for name, predict in _WIDENING_FILTERS.items():
        if name in out:
            out[name] = _widening(out[name], predict)
    for name in ("batch", "slice"):
        if name in out:
            out[name] = _filling(out[name])
    return out


def budgeted_globals(names: dict[str, Any]) -> dict[str, Any]:
    """The template's globals with ``range``, ``lipsum`` and ``dict`` budgeted."""
    out = dict(names)
    out["range"] = _range
    out["lipsum"] = _lipsum
    if "dict" in out:
        out["dict"] = _Dict(out["dict"])
    return out
