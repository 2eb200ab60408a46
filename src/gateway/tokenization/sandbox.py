"""The chat template's sandbox, with its attribute and call verdicts memoized for plain data.

A chat template renders in transformers' ``ImmutableSandboxedEnvironment`` (the template
is operator data, the messages client data). Every ``obj.attr`` and method call in the
template asks the sandbox whether it is allowed: ``getattr`` first tries the attribute
(raising ``AttributeError`` for a dict key), then ``is_safe_attribute`` runs
``is_internal_attribute`` and ``modifies_known_mutable`` (about 15 ``isinstance`` checks,
several against ABCs), and ``call`` runs ``is_safe_callable``. For one Qwen3 message that
is about a third of the render.

What the template sees is rebuilt as plain JSON data (``chat_template.plain``): dicts,
lists, str, int, float, bool and None, of exactly those types. For an object of one of
those exact types every one of those answers depends on its type and the attribute name
only: instances of these built-in types carry no attributes of their own and the types
cannot be changed, ``isinstance`` of an exact built-in type is fixed, and jinja2's
``is_safe_attribute`` ignores the value it is given. So the first answer for a
(type, name) is the answer for every later one and is kept. For the template's own loop
and namespace objects only ``is_safe_attribute``'s verdict is kept (their attributes are
read, and a ``str.format`` among them wrapped, every time). Everything else (undefined
values, classes, functions, ``str.format``, unsafe names) takes jinja2's own path
unchanged, so nothing the sandbox refuses becomes allowed. The memo is installed only on
an environment of exactly jinja2's ``ImmutableSandboxedEnvironment`` class (transformers'
choice) or of the render budget's subclass of it (``render_budget.BudgetSandbox``, which
changes calls only), and is bounded.
"""

from __future__ import annotations

import types
from typing import Any

from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from gateway.tokenization.render_budget import BudgetSandbox

_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})
_MEMO_LIMIT = 4096  # (type, name) pairs; names come from the template, or from data via |attr
_NO_ATTRIBUTE = 0  # ``getattr`` raises AttributeError: the item of that name, else undefined
_SAFE = 1  # the attribute exists, is allowed, and is not ``str.format``/``format_map``
_JINJA = 2  # jinja2's own path (unsafe, or ``str.format``, which it wraps)


class PlainMemoSandbox(BudgetSandbox):
    """``ImmutableSandboxedEnvironment`` (with the render budget's checks) whose verdicts on plain JSON data (and on its own
    loop and namespace objects) are computed once per type and attribute name."""

    _verdicts: dict[tuple[type, str], int]
    _safe: dict[tuple[type, str], bool]
    _objects: frozenset[type]

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if type(attribute) is not str:
            return super().getattr(obj, attribute)
        if kind in _PLAIN:
            verdicts = self._verdicts
            verdict = verdicts.get((kind, attribute))
            if verdict is None:
                verdict = self._verdict(obj, attribute)
                if len(verdicts) < _MEMO_LIMIT:
                    verdicts[(kind, attribute)] = verdict
            if verdict == _NO_ATTRIBUTE:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            if verdict == _SAFE:
                return getattr(obj, attribute)
        elif kind in self._objects:
            return self._object_attribute(obj, kind, attribute)
        return super().getattr(obj, attribute)

    def _verdict(self, obj: Any, attribute: str) -> int:
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            return _NO_ATTRIBUTE
        if self.wrap_str_format(value) is not None or not self.is_safe_attribute(obj, attribute, value):
            return _JINJA
        return _SAFE

    def _object_attribute(self, obj: Any, kind: type, attribute: str) -> Any:
        """jinja2's ``getattr`` step by step, only ``is_safe_attribute`` kept per (type, name):
        a loop's or a namespace's attributes are its own data (read every time, and a
        ``str.format`` stored in a namespace is still wrapped), but whether a name is allowed
        on it depends on the type and the name alone."""
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        fmt = self.wrap_str_format(value)
        if fmt is not None:
            return fmt
        safe = self._safe.get((kind, attribute))
        if safe is None:
            safe = self.is_safe_attribute(obj, attribute, value)
            if len(self._safe) < _MEMO_LIMIT:
                self._safe[(kind, attribute)] = safe
        return value if safe else self.unsafe_undefined(obj, attribute)

    def is_safe_callable(self, obj: Any) -> bool:
        # A built-in method bound to plain data (``content.split``): such method objects
        # carry no attributes, so ``unsafe_callable``/``alters_data`` are never set on them.
        if type(obj) is types.BuiltinMethodType and type(obj.__self__) in _PLAIN:
            return True
        return super().is_safe_callable(obj)


def memoize_plain_verdicts(environment: object) -> bool:
    """Give a compiled template's environment the memo, in place (its class becomes the
    subclass above: same state, same filters and globals); True when it has it. Any other
    environment class is left alone: its verdicts might depend on more than the type."""
    if type(environment) is PlainMemoSandbox:
        return True
    if type(environment) is not ImmutableSandboxedEnvironment and type(environment) is not BudgetSandbox:
        return False
    objects: set[type] = {LoopContext, Namespace}
    made = environment.globals.get("namespace")  # transformers' TemplateNamespace
    if isinstance(made, type) and issubclass(made, Namespace) and "__getattribute__" not in made.__dict__:
        objects.add(made)
    state = vars(environment)
    state["_verdicts"], state["_safe"], state["_objects"] = {}, {}, frozenset(objects)
    environment.__class__ = PlainMemoSandbox
    return True
