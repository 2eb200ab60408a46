"""Validate a request whose conversation is long a step at a time, with event-loop turns
between the steps.

Pydantic validates a request in one call, and a chat of thousands of messages costs
milliseconds per thousand: one such request, or a few at once, would hold every other
request on the loop (``/health`` included) for the whole validation. A model names the
list that may be that long (``RequestModel.long_list``); past ``STEP_ITEMS`` items the
rest of the body is validated first, then the list in slices of that size, each in its
own loop turn. The answer is the model ``parse_model`` gives, and so is the error (the
first offending item's place in the whole list).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from gateway.protocol.common import LongList, RequestModel
from gateway.protocol.errors import InvalidRequestError, validation_error_to_gateway

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
U = TypeVar("U")

STEP_ITEMS = 512
"""Items validated in one loop turn: about 1 ms of plain chat messages on a quiet host."""


@cache
def _list_of(item: type[BaseModel]) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[item])  # type: ignore[valid-type]


def parse_model(model: type[M], data: Any) -> M:
    """``data`` as ``model``, or the 400 that names the first offending field."""
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None


_specs: dict[type[BaseModel], LongList | None] = {}


def _spec(model: type[BaseModel]) -> LongList | None:
    # Kept by class: a pydantic model class's attribute read costs several times a dict's,
    # and the short request's path asks once per request.
    try:
        return _specs[model]
    except KeyError:
        spec = _specs[model] = model.long_list if issubclass(model, RequestModel) else None
        return spec


def has_long_list(model: type[BaseModel]) -> bool:
    """Whether the model names a list that may be validated in steps."""
    return _spec(model) is not None


def needs_steps(model: type[BaseModel], data: Any) -> bool:
    """Whether ``data`` holds the model's long list with more than a step's items (and no
    more than its cap: past it the model refuses the list before validating any item)."""
    spec = _spec(model)
    if spec is None or type(data) is not dict:
        return False
    items = data.get(spec.field)
    return type(items) is list and STEP_ITEMS < len(items) <= spec.cap


async def parse_model_in_steps(model: type[M], data: Any) -> M:
    """``parse_model``, with the model's long list validated in steps when it is long."""
    spec = _spec(model)
    if spec is None or not needs_steps(model, data):
        return parse_model(model, data)
    items = data[spec.field]
    head = parse_model(model, {**data, spec.field: items[:1]})  # every other field and rule
    adapter = _list_of(spec.item)
    whole: list[Any] = []
    for start in range(0, len(items), STEP_ITEMS):
        await asyncio.sleep(0)
        try:
            whole += adapter.validate_python(items[start : start + STEP_ITEMS])
        except ValidationError as exc:
            raise validation_error_to_gateway(exc, at=(spec.field, start)) from None
    setattr(head, spec.field, whole)
    return head


async def map_in_steps(fn: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``[fn(x) for x in items]``, ``STEP_ITEMS`` at a time with a loop turn between the
    steps (a long conversation's per-message work after its validation)."""
    out: list[U] = []
    for start in range(0, len(items), STEP_ITEMS):
        if start:
            await asyncio.sleep(0)
        out += [fn(item) for item in items[start : start + STEP_ITEMS]]
    return out
