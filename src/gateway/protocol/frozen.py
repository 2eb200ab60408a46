"""Positional builders for frozen, slotted dataclasses made on every request.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses): a method lookup and a wrapped call per field. The router builds
a ``WorkerView`` of 13 fields for each worker of a pool whose figures moved since its last
view (under load, the in-flight counts of a few of them per request), and a ``LoadSnapshot``
for each worker whose polled loads it ages;
every chat request makes its ``SamplingOptions`` (23 fields).
A builder sets the slots through their member descriptors instead, about half the cost,
and yields an instance equal to the constructor's: the same class, still frozen.

It takes every field, positionally, in the class's field order, and runs no
``__post_init__`` (refused for classes that have one): a field added to the class makes
every builder call fail loudly until the caller passes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def slots_builder(cls: type[T]) -> Callable[..., T]:
    """``build(*values)``: an instance of ``cls`` with its fields set to ``values``, in order."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which a builder would skip")
    names = [f.name for f in dataclasses.fields(cls)]
    if tuple(names) != tuple(getattr(cls, "__slots__", ())):
        raise TypeError(f"{cls.__name__} must be slotted, its slots in field order")
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set_{i}": getattr(cls, name).__set__ for i, name in enumerate(names)})
    args = ", ".join(f"v{i}" for i in range(len(names)))
    sets = "".join(f"    set_{i}(o, v{i})\n" for i in range(len(names)))
    source = f"def build({args}):\n    o = new(cls)\n{sets}    return o\n"
    exec(compile(source, f"<builder of {cls.__qualname__}>", "exec"), scope)  # the code: made here, of field names
    build: Callable[..., T] = scope["build"]
    build.__doc__ = f"A {cls.__name__} of every field, in order ({', '.join(names)})."
    return build
