"""How long a string operation's result will be, predicted before it runs.

``'x' * 10**9`` or ``'%999999999s' % x`` never return to the bytecode loop once started,
so their size is charged (``charge_bytes``) from their arguments first: printf and
``str.format`` widths and precisions, the widening ``str`` methods (``center``,
``replace``, ``join``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.tokenization.render_budget.budget import charge_bytes, charge_steps

WIDENING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate"})
"""String methods whose result can be much longer than their inputs."""
_NUMBER = re.compile(r"\d+")
# A printf conversion's flags, width and precision (``%-10.3s``, ``%*d``).
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?([#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[hlL]?[a-zA-Z%]")


def check_printf(fmt: str, args: Any) -> None:
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


def check_format(fmt: str) -> None:
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


def check_widening(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
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
        check_join(args[0], owner)
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str | bytes)), default=1)
        charge_bytes(len(owner) * longest)


def check_join(items: Any, separator: Any) -> None:
    try:
        n = len(items)
    except TypeError:
        return  # counted by whatever made the iterator
    charge_steps(n)
    charge_bytes(n * len(separator) + sum(len(x) for x in items if isinstance(x, str)) if n else 0)
