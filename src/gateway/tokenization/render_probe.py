"""A chat template rendered once with its message contents held symbolically, so that
later conversations of the same shape can be rendered without running the template.

A template is a program over its inputs. Run it on a conversation whose every
``content`` string is a ``Sym``: an object that holds the real text privately and
lets the template reach it only through operations this module lists. Each such
operation is one of three kinds:

* an *observation* (``startswith``, ``in``, ``==``, ``length``, truthiness, a test such
  as ``is string``): answered from the real text and recorded with its answer;
* a *flow* (``+`` with text, ``strip`` and the like, a store, the value written out):
  answered with another ``Sym`` that records how its text is made from the contents;
* anything else (iteration, indexing, ``str()``, ``~``, ``tojson``, a Sym passed to a
  function or a filter other than a macro or the few listed): ``NotMemoizable``, a
  ``BaseException`` no template or jinja2 code catches.

A Sym written out becomes a ``Piece`` (its real text, and its parts); the probe's
environment joins a buffer holding one (a macro's or a set block's output) into a Sym
again, so text pieces and ``Sym`` pieces reach the render's own output. The render so
run takes the real render's path (every answer is the real one). The result, a ``Variant``,
is exact for any other contents under one condition it checks itself: every recorded
observation gives the same answer on them. The template then sees the same values
(everything but the contents is the same by the memo's key, ``render_memo``) and the
same answers, so it runs the same path and writes the same pieces, with the new
contents in the ``Sym`` places. Templates that read the clock or a random source
(``strftime_now``, ``lipsum``) abort when they call it; ones that use blocks,
``extends`` or imports are not probed at all.

The render budget (``render_budget``) still holds on a replay: the probe runs under a
budget whose checks charge a ``Sym`` as its real text, and counts how many times each
content is charged; a replay is given only when that count times the contents' growth
keeps the render inside the base budget, where the real render could not fail.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2.nodes
from jinja2.runtime import LoopContext, Macro, Undefined
from jinja2.utils import Namespace, _PassArg

from gateway.tokenization import render_budget
from gateway.tokenization.render_budget import BudgetExceeded
from gateway.tokenization.render_budget.budget import charge_bytes, charge_work
from gateway.tokenization.render_budget.checks import (
    GROW,
    KEEP,
    LOOP,
    MADE,
    MOD,
    MUL,
    OUT,
    POW,
    SCAN,
)
from gateway.tokenization.render_budget.sandbox import BudgetSandbox

# str methods that only look at the text: answered and recorded.
_LOOKS = frozenset({
    "startswith", "endswith", "count", "find", "rfind", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
})  # fmt: skip
# str methods that make a new text from the text alone: a new Sym.
_MAKES = frozenset({
    "strip", "lstrip", "rstrip", "lower", "upper", "title", "capitalize", "casefold", "swapcase", "removeprefix",
    "removesuffix",
})  # fmt: skip
# Filters that may take a Sym as their value: observations, or flows with a str method's meaning.
_SYM_FILTERS: dict[str, str | None] = {"length": "len", "count": "len", "trim": "strip", "lower": "lower",
                                       "upper": "upper", "string": None, "default": None, "d": None}  # fmt: skip
# Filters that may take a container holding Syms: they move items without looking at them
# (``map`` and the selects reach items only through the environment's getattr and tests).
_STRUCTURE_FILTERS = frozenset({
    "length", "count", "first", "last", "list", "reverse", "map", "select", "reject", "selectattr", "rejectattr",
    "default", "d", "batch", "slice", "items",
})  # fmt: skip
# Observations' operands and arguments: plain immutable values only.
_PLAIN_ARGS = (str, int, float, bool, type(None))
# Nodes the probe does not follow: blocks render through references that join their output.
_UNSUPPORTED = (jinja2.nodes.Block, jinja2.nodes.Extends, jinja2.nodes.Include, jinja2.nodes.Import,
                jinja2.nodes.FromImport)  # fmt: skip


class NotMemoizable(BaseException):
    """The template did something with a content the probe does not follow. A
    ``BaseException`` so that neither template code nor jinja2's undefined handling
    (which catches ``AttributeError``, ``TypeError`` and ``LookupError``) turns it into
    a different path."""


@dataclass(frozen=True, slots=True)
class Derived:
    """A text made by a str method from another symbolic text."""

    parts: tuple[Part, ...]
    method: str
    args: tuple[Any, ...]


Part = str | int | Derived  # literal text, the content of that index, or a derived text

Look = tuple[int | tuple[Part, ...], Callable[..., Any], tuple[Any, ...], Any]
"""An observation: of the content of that index or of the text of those parts, the
function and its further arguments, and its answer."""


def resolve(parts: tuple[Part, ...], contents: list[str]) -> str:
    """The text ``parts`` stand for with these contents."""
    return "".join([_part(p, contents) for p in parts])


def _part(part: Part, contents: list[str]) -> str:
    kind = type(part)
    if kind is str:
        return part  # type: ignore[return-value]
    if kind is int:
        return contents[part]  # type: ignore[index]
    assert isinstance(part, Derived)
    made: str = getattr(str, part.method)(resolve(part.parts, contents), *part.args)
    return made


def _indices(parts: tuple[Part, ...]) -> Iterator[int]:
    for p in parts:
        if type(p) is int:
            yield p
        elif type(p) is Derived:
            yield from _indices(p.parts)


def _plain(value: Any) -> bool:
    return type(value) in _PLAIN_ARGS or (type(value) is tuple and all(type(v) is str for v in value))


def holds_sym(value: Any, depth: int = 8) -> bool:
    """True when ``value`` is or may hold a ``Sym``, ``depth`` levels down (deeper: taken
    as holding one). Plain data, undefined values, loops and callables are looked into
    or hold none; an iterator (which may yield one unseen) or any other object is taken
    as holding one."""
    kind = type(value)
    if kind is Sym:
        return True
    if kind in _PLAIN_ARGS:
        return False
    if kind is dict:
        items: Any = value.values()
    elif kind is list or kind is tuple:
        items = value
    elif kind is slice:
        items = (value.start, value.stop, value.step)
    elif isinstance(value, Namespace):
        items = object.__getattribute__(value, "_Namespace__attrs").values()
    elif isinstance(value, Undefined | LoopContext) or (callable(value) and not hasattr(kind, "__next__")):
        return False
    else:
        return True
    if depth == 0:
        return bool(items)
    return any(holds_sym(v, depth - 1) for v in items)


class Recorder:
    """What one probe saw: the observations with their answers, and how many times the
    budget was charged each content (for the replay's bound)."""

    __slots__ = ("bytes_per_char", "looks", "work_per_char")

    def __init__(self) -> None:
        self.looks: list[Look] = []
        self.bytes_per_char: dict[int, int] = {}
        self.work_per_char: dict[int, int] = {}

    def look(self, sym: Sym, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn(text, *args)`` on the real text, recorded; the text's reading charged."""
        self.charge_work(sym)
        answer = fn(sym.value, *args)
        parts = sym.parts
        self.looks.append((parts[0] if len(parts) == 1 and type(parts[0]) is int else parts, fn, args, answer))  # type: ignore[arg-type]
        return answer

    def charge_work(self, sym: Sym) -> None:
        for i in _indices(sym.parts):
            self.work_per_char[i] = self.work_per_char.get(i, 0) + 1
        charge_work(len(sym.value))

    def charge_bytes(self, sym: Sym) -> None:
        for i in _indices(sym.parts):
            self.bytes_per_char[i] = self.bytes_per_char.get(i, 0) + 1
        charge_bytes(len(sym.value))


def _refuse(*_: Any, **__: Any) -> Any:
    raise NotMemoizable


class Sym:
    """A symbolic text: its parts (literals, contents, derived texts) and its real value."""

    __slots__ = ("parts", "recorder", "value")

    def __init__(self, parts: tuple[Part, ...], value: str, recorder: Recorder) -> None:
        self.parts = parts
        self.value = value
        self.recorder = recorder

    # flows
    def __add__(self, other: Any) -> Any:
        if type(other) is str:
            return Sym((*self.parts, other), self.value + other, self.recorder)
        if type(other) is Sym:
            return Sym((*self.parts, *other.parts), self.value + other.value, self.recorder)
        raise NotMemoizable

    def __radd__(self, other: Any) -> Any:
        if type(other) is str:
            return Sym((other, *self.parts), other + self.value, self.recorder)
        raise NotMemoizable

    def make(self, method: str, args: tuple[Any, ...]) -> Sym:
        """A str method in ``_MAKES`` applied: a derived text."""
        if not all(_plain(a) for a in args):
            raise NotMemoizable
        self.recorder.charge_work(self)
        value = getattr(str, method)(self.value, *args)
        return Sym((Derived(self.parts, method, args),), value, self.recorder)

    # observations
    def _look(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not all(_plain(a) for a in args):
            raise NotMemoizable
        return self.recorder.look(self, fn, args)

    def __eq__(self, other: object) -> Any:
        return self._look(operator.eq, other)

    def __ne__(self, other: object) -> Any:
        return self._look(operator.ne, other)

    def __lt__(self, other: object) -> Any:
        return self._look(operator.lt, other)

    def __le__(self, other: object) -> Any:
        return self._look(operator.le, other)

    def __gt__(self, other: object) -> Any:
        return self._look(operator.gt, other)

    def __ge__(self, other: object) -> Any:
        return self._look(operator.ge, other)

    def __contains__(self, needle: object) -> bool:
        if type(needle) is not str:
            raise NotMemoizable
        return bool(self._look(operator.contains, needle))

    def __len__(self) -> int:
        return int(self._look(len))

    def __bool__(self) -> bool:
        return bool(self._look(bool))

    def method(self, name: str) -> Callable[..., Any]:
        """The bound str method ``name`` as the template may call it."""
        if name in _LOOKS:
            fn = getattr(str, name)
            return _Bound(lambda *args: self._look(fn, *args))
        if name in _MAKES:
            return _Bound(lambda *args: self.make(name, args))
        raise NotMemoizable

    # everything else reads the text unrecorded, or hides it: refused
    __hash__ = __iter__ = __getitem__ = __str__ = __repr__ = __format__ = __int__ = __float__ = _refuse  # type: ignore[assignment]
    __index__ = __complex__ = __bytes__ = __reversed__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _refuse
    __round__ = __abs__ = __neg__ = __html__ = __fspath__ = __getattr__ = _refuse  # type: ignore[assignment]


class _Bound:
    """A Sym's str method as the template holds it (called only with positional plain arguments)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise NotMemoizable
        return self.fn(*args)


class Piece(str):
    """A top-level output that is symbolic: its text is the real one, ``sym`` its parts.
    ``str()`` of it is itself, so it reaches the render's own output as it is."""

    sym: Sym

    def __str__(self) -> str:
        return self


class ProbeSandbox(BudgetSandbox):
    """The budgeted sandbox whose attribute reads, item reads and calls know ``Sym``."""

    nondeterministic: frozenset[int] = frozenset()  # ids of globals whose answer changes by itself

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is Sym:
            return obj.method(attribute)
        if type(attribute) is Sym:
            raise NotMemoizable
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if type(obj) is Sym or holds_sym(argument):
            raise NotMemoizable
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # jinja2 passes the loop's and block's variables along for callables that take the
        # context; those see every variable (Syms among them): refused, the others never see them.
        scoped: dict[str, Any] = {name: kwargs.pop(name) for name in ("_loop_vars", "_block_vars") if name in kwargs}
        if type(__obj) is _Bound:
            return __obj(*args, **kwargs)
        if type(__obj) is Macro:
            # template code: what it does with a Sym is followed like the rest; the budget
            # charges a call's text arguments as bytes, so a Sym argument is counted so
            for value in (*args, *kwargs.values()):
                if type(value) is Sym:
                    value.recorder.charge_bytes(value)
            kwargs.update(scoped)
            return super().call(__context, __obj, *args, **kwargs)
        if (
            id(__obj) in __self.nondeterministic or holds_sym(args) or holds_sym(kwargs)
            or _takes_context(__obj)
        ):  # fmt: skip
            raise NotMemoizable
        kwargs.update(scoped)
        return super().call(__context, __obj, *args, **kwargs)


def concat(items: Any) -> Any:
    """The environment's join of what a template wrote (a macro's, a set block's, a call's or
    a filter block's output): a Sym when a ``Piece`` is among it, so a written Sym stays
    symbolic wherever the text goes; plain text otherwise."""
    written = list(items)
    pieces = [item for item in written if type(item) is Piece]
    if not pieces:
        return "".join(written)
    parts: list[Part] = []
    for item in written:
        parts.extend(item.sym.parts if type(item) is Piece else (item,))
    return Sym(tuple(parts), "".join(written), pieces[0].sym.recorder)


def _takes_context(obj: Any) -> bool:
    """Whether jinja2 would call ``obj`` with the render's context (as ``Context.call`` decides)."""
    if _PassArg.from_obj(obj) is _PassArg.context:
        return True
    return callable(obj) and _PassArg.from_obj(obj.__call__) is _PassArg.context


def _value_at(fn: Callable[..., Any]) -> int:
    """Where a filter or test gets its value among its positional arguments."""
    return 0 if _PassArg.from_obj(fn) is None else 1


def _probe_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    at = _value_at(fn)
    structure = name in _STRUCTURE_FILTERS

    def run(*args: Any, **kwargs: Any) -> Any:
        value, rest = args[at], args[at + 1 :]
        if type(value) is Sym:
            return _filter_sym(name, value, rest, kwargs)
        if holds_sym(rest) or holds_sym(kwargs) or (not structure and holds_sym(value)):
            raise NotMemoizable
        return fn(*args, **kwargs)

    _copy_pass(fn, run)
    return run


def _filter_sym(name: str, value: Sym, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A filter in ``_SYM_FILTERS`` applied to a Sym, as jinja2's own would be."""
    if name not in _SYM_FILTERS or holds_sym(args) or holds_sym(kwargs):
        raise NotMemoizable
    meaning = _SYM_FILTERS[name]
    if meaning == "len":
        if args or kwargs:
            raise NotMemoizable
        return len(value)
    if meaning is None:  # ``string``, and ``default`` without ``boolean``: the value itself
        if name == "string":
            if args or kwargs:
                raise NotMemoizable
            return value
        boolean = args[1] if len(args) > 1 else kwargs.get("boolean", False)
        if len(args) > 2 or kwargs.keys() - {"default_value", "boolean"} or boolean:
            raise NotMemoizable
        return value
    if kwargs or (meaning != "strip" and args) or len(args) > 1:
        raise NotMemoizable
    return value.make(meaning, args)


def _probe_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    at = _value_at(fn)

    def run(*args: Any, **kwargs: Any) -> Any:
        value, rest = args[at], args[at + 1 :]
        if holds_sym(rest) or holds_sym(kwargs):
            raise NotMemoizable
        if type(value) is Sym:
            if at or kwargs:
                raise NotMemoizable
            return value._look(fn, *rest)
        return fn(*args, **kwargs)

    _copy_pass(fn, run)
    return run


def _copy_pass(source: Callable[..., Any], target: Callable[..., Any]) -> None:
    passes = _PassArg.from_obj(source)
    if passes is not None:
        target.jinja_pass_arg = passes  # type: ignore[attr-defined]


def _checks(checks: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The render budget's checks, knowing ``Sym``: a written or stored Sym is charged as
    its text (and counted), a searched one as its length; a Sym looped over, multiplied,
    formatted or put in a literal container is refused. A written Sym becomes a ``Piece``."""
    out, keep, grow, scan = checks[OUT], checks[KEEP], checks[GROW], checks[SCAN]

    def written(context: Any, value: Any) -> Any:
        if type(value) is Sym:
            value.recorder.charge_bytes(value)
            piece = Piece(value.value)
            piece.sym = value
            return piece
        if holds_sym(value):
            raise NotMemoizable
        return out(context, value)

    def kept(context: Any, value: Any) -> Any:
        if type(value) is Sym:
            value.recorder.charge_bytes(value)
            return value
        return keep(context, value)

    def grown(context: Any, value: Any, before: Any) -> Any:
        if type(value) is Sym:
            value.recorder.charge_bytes(value)
            return value
        return grow(context, value, before)

    def scanned(context: Any, value: Any) -> Any:
        if type(value) is Sym:
            value.recorder.charge_work(value)
            return value
        return scan(context, value)

    def refusing(check: Callable[..., Any]) -> Callable[..., Any]:
        def run(context: Any, *args: Any) -> Any:
            if holds_sym(args):
                raise NotMemoizable
            return check(context, *args)

        return run

    def looped(context: Any, iterable: Any, body_chars: int) -> Any:
        if type(iterable) is Sym:
            raise NotMemoizable
        return checks[LOOP](context, iterable, body_chars)

    made: dict[str, Callable[..., Any]] = {OUT: written, KEEP: kept, GROW: grown, SCAN: scanned, LOOP: looped}
    for name in (MUL, POW, MOD, MADE):
        made[name] = refusing(checks[name])
    for fn in made.values():
        fn.jinja_pass_arg = _PassArg.context  # type: ignore[attr-defined]
    return made


@dataclass(frozen=True, slots=True)
class Variant:
    """One path of a template: the observations that pick it (with their answers), the
    pieces it writes (``fmt``: the same as a format string, when they are literals and
    contents only), and the budget it spent (``fixed_*``) with what each content's growth
    adds to it (``growth``: index, bytes and work charged per character, the content's
    length at the probe)."""

    looks: tuple[Look, ...]
    pieces: tuple[Part, ...]
    fmt: str | None
    fixed_bytes: int
    fixed_work: int
    growth: tuple[tuple[int, int, int, int], ...]

    def render(self, contents: list[str]) -> str | None:
        """The template's text for these contents, or None when it would take another
        path or could come near the render budget."""
        for ref, fn, args, answer in self.looks:
            got = fn(contents[ref] if type(ref) is int else resolve(ref, contents), *args)  # type: ignore[arg-type]
            if type(got) is not type(answer) or got != answer:
                return None
        if self.growth:
            spent_bytes, spent_work = self.fixed_bytes, self.fixed_work
            for index, per_byte, per_work, was in self.growth:
                more = len(contents[index]) - was
                if more > 0:
                    spent_bytes += per_byte * more
                    spent_work += per_work * more
            if spent_bytes > render_budget.BASE_BYTES or spent_work > render_budget.BASE_WORK:
                return None
        if self.fmt is not None:
            return self.fmt.format(*contents)
        return resolve(self.pieces, contents)


def _format_string(pieces: tuple[Part, ...]) -> str | None:
    """``pieces`` as a ``str.format`` string over the contents, when they are literals and contents only."""
    out: list[str] = []
    for part in pieces:
        if type(part) is str:
            out.append(part.replace("{", "{{").replace("}", "}}"))  # type: ignore[attr-defined]
        elif type(part) is int:
            out.append(f"{{{part}}}")
        else:
            return None
    return "".join(out)


class ProbeTemplate:
    """A chat template's source compiled for probing (``probe``), in an environment built
    by ``environment`` as the template's own is, its checks, filters and tests knowing ``Sym``."""

    def __init__(self, source: str, environment: Any) -> None:
        ast = environment.parse(source)
        if any(True for _ in ast.find_all(_UNSUPPORTED)):
            raise NotImplementedError("the template uses blocks, extends or imports")
        rewritten = render_budget.budgeted(ast)
        checks = {name: environment.filters[name] for name in (OUT, KEEP, GROW, SCAN, LOOP, MUL, POW, MOD, MADE)}
        filters = {name: _probe_filter(name, fn) for name, fn in environment.filters.items() if name not in checks}
        filters.update(_checks(checks))
        environment.filters = filters
        environment.tests = {name: _probe_test(fn) for name, fn in environment.tests.items()}
        environment.__class__ = ProbeSandbox
        environment.concat = concat
        environment.nondeterministic = frozenset(
            id(environment.globals[name]) for name in ("strftime_now", "lipsum") if name in environment.globals
        )
        self._compiled = environment.from_string(rewritten)

    def probe(self, contents: list[str], context: dict[str, Any], expected: str) -> Variant | None:
        """The variant of this render: ``context`` is what the template is called with,
        its messages' ``content`` strings (``contents``, in order) replaced by the key
        ``...``; None when the render leaves what the probe follows, runs past the base
        budget, or (never expected) does not reproduce ``expected``."""
        recorder = Recorder()
        messages = []
        index = 0
        for message in context["messages"]:
            if message.get("content", None) is ...:
                message = {**message, "content": Sym((index,), contents[index], recorder)}
                index += 1
            messages.append(message)
        render_budget.start(messages, context.get("tools"), context.get("documents"))
        try:
            written = list(self._compiled.root_render_func(self._compiled.new_context({**context, "messages": messages})))
            budget = render_budget.active()
            if budget is None or budget.request is None:
                return None  # the render needed the request's share: left to the real render every time
            spent_bytes, spent_work = budget.total_bytes - budget.bytes, budget.total_work - budget.work
        except (NotMemoizable, BudgetExceeded, Exception):
            return None
        finally:
            render_budget.stop()
        pieces: list[Part] = []
        for item in written:
            parts: tuple[Part, ...] = item.sym.parts if type(item) is Piece else (item,)
            for part in parts:
                if type(part) is str and pieces and type(pieces[-1]) is str:
                    pieces[-1] += part  # type: ignore[operator]
                elif part != "":
                    pieces.append(part)
        variant = Variant(
            looks=tuple(recorder.looks),
            pieces=tuple(pieces),
            fmt=_format_string(tuple(pieces)),
            fixed_bytes=spent_bytes,
            fixed_work=spent_work,
            growth=tuple(
                (i, recorder.bytes_per_char.get(i, 0), recorder.work_per_char.get(i, 0), len(contents[i]))
                for i in sorted(recorder.bytes_per_char.keys() | recorder.work_per_char.keys())
            ),
        )
        if variant.render(contents) != expected:
            raise AssertionError("the probe's pieces do not give the real render")
        return variant


