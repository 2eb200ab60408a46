"""OpenAI response objects: chat completions, chunks, text completions, usage, models.

``to_dict()`` gives an orjson-ready dict shaped like OpenAI's: fields that are
unset are left out, except the few OpenAI always sends as ``null`` (a message's
``content``, a choice's ``logprobs`` and ``finish_reason``, SGLang's
``matched_stop``), which each model lists in ``_keep_null``.

finish_reason: ``stop``, ``length``, ``tool_calls`` as OpenAI; a worker abort
is reported as ``abort``, as SGLang's own server does. Aborts that carry an
error are raised as ``GatewayError`` by the pipeline instead, so ``abort``
reaches clients only for graceful aborts. (OpenAI's own SDK does not validate
this literal when it reads responses, so it passes through; strict validators
of OpenAI's schema would reject it.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from gateway.protocol.ids import random_hex

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "abort"]


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-<32 hex>``."""
    return f"{prefix}-{random_hex()}"


def now() -> int:
    return int(time.time())


class ResponseModel(BaseModel):
    """Base of response objects: ``to_dict()`` drops Nones except ``_keep_null`` fields."""

    _keep_null: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _serialize(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if info.exclude_none and self._keep_null:
            for name in self._keep_null:
                if name not in data and getattr(self, name) is None:
                    data[name] = None
        return data

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


_UNSET: Any = object()
_SHAPERS: dict[type[ResponseModel], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def shaped(cls: type[ResponseModel], values: dict[str, Any]) -> dict[str, Any]:
    """``cls(**values).to_dict()`` without building the model, for values that already are
    what the model would hold: JSON scalars of the fields' exact types and, for nested
    models, their own ``shaped`` dicts. The model stays the one owner of the shape (its
    fields in declaration order, their defaults, its ``_keep_null``); this only skips
    pydantic's validation and dump on the common unary answer, where they are a
    measurable part of every request's CPU. Values that need validation
    or conversion must go through the model (tests hold the two equal)."""
    shaper = _SHAPERS.get(cls)
    if shaper is None:
        shaper = _SHAPERS[cls] = _shaper(cls)
    return shaper(values)


def _shaper(cls: type[ResponseModel]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``shaped``'s work for ``cls`` as one straight function made from the model's fields
    (not a loop over them, with a tuple unpacked and tested per field, on every answer):
    each field's value, default, factory or refusal in declaration order, then the
    ``_keep_null`` names in the order the model's serializer adds them."""
    scope: dict[str, Any] = {"UNSET": _UNSET}
    lines = ["def shape(values):", "    get = values.get", "    data = {}"]
    for i, (name, f) in enumerate(cls.model_fields.items()):
        lines.append(f"    v = get({name!r}, UNSET)")
        if f.default_factory is not None:
            scope[f"factory_{i}"] = f.default_factory
            lines.append(f"    if v is UNSET: v = factory_{i}()")
        elif f.is_required():
            lines.append(f"    if v is UNSET: raise TypeError({f'{cls.__name__}: {name} is required'!r})")
        else:
            scope[f"default_{i}"] = f.default
            lines.append(f"    if v is UNSET: v = default_{i}")
        lines.append(f"    if v is not None: data[{name!r}] = v")
    lines += [f"    if {name!r} not in data: data[{name!r}] = None" for name in cls._keep_null]
    lines.append("    return data")
    exec(compile("\n".join(lines) + "\n", f"<shaper of {cls.__qualname__}>", "exec"), scope)  # the code: made here, of field names
    shape: Callable[[dict[str, Any]], dict[str, Any]] = scope["shape"]
    return shape


# ---------------------------------------------------------------- usage


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(ResponseModel):
    reasoning_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @classmethod
    def build(
        cls,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> Usage:
        """Usage with details only when known (``None`` leaves a detail out)."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=(
                None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
            ),
            completion_tokens_details=(
                None
                if reasoning_tokens is None
                else CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
            ),
        )


def usage_dict(
    prompt_tokens: int, completion_tokens: int, *, cached_tokens: int | None = None, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    """``Usage.build(...).to_dict()`` for int counts, without the models (``shaped``);
    anything else (a count that needs pydantic's conversion) goes through them."""
    converted = False  # a count of another type (a plain loop: no generator per answer)
    for c in (prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens):
        if c is not None and type(c) is not int:
            converted = True
            break
    if converted:
        return Usage.build(prompt_tokens, completion_tokens, cached_tokens=cached_tokens,
                           reasoning_tokens=reasoning_tokens).to_dict()
    return shaped(Usage, {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else shaped(PromptTokensDetails, {"cached_tokens": cached_tokens}),
        "completion_tokens_details": (
            None if reasoning_tokens is None else shaped(CompletionTokensDetails, {"reasoning_tokens": reasoning_tokens})
        ),
    })


# ---------------------------------------------------------------- logprobs


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    _keep_null = frozenset({"bytes"})


class TokenLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)
    _keep_null = frozenset({"bytes"})


class ChoiceLogprobs(ResponseModel):
    """Chat logprobs: ``{"content": [...]}``."""

    content: list[TokenLogprob] | None = None
    _keep_null = frozenset({"content"})


class CompletionLogprobs(ResponseModel):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)

    def extend(self, other: CompletionLogprobs) -> None:
        """Append ``other``'s rows (streaming pieces concatenated into one answer)."""
        self.tokens.extend(other.tokens)
        self.token_logprobs.extend(other.token_logprobs)
        if other.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + other.top_logprobs
        self.text_offset.extend(other.text_offset)


# ---------------------------------------------------------------- tool calls


class FunctionCall(ResponseModel):
    name: str
    arguments: str


class ToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(ResponseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(ResponseModel):
    """A streamed tool-call fragment: the first carries id/type/name, later ones arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


# ---------------------------------------------------------------- chat


class ChatCompletionMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    _keep_null = frozenset({"content"})


class ChatCompletionChoice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    _keep_null = frozenset({"logprobs", "finish_reason", "matched_stop"})


class ChatCompletionResponse(ResponseModel):
    id: str = Field(default_factory=lambda: new_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# ---------------------------------------------------------------- completions


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    _keep_null = frozenset({"logprobs", "finish_reason"})


class CompletionResponse(ResponseModel):
    """A ``text_completion`` object; streamed completions send one per SSE event too."""

    id: str = Field(default_factory=lambda: new_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# ---------------------------------------------------------------- models


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "token-gateway"
    root: str | None = None
    max_model_len: int | None = None
    tool_call_parser: str | None = None  # the gateway's extra: formats it parses for this model
    reasoning_parser: str | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


def openai_finish_reason(
    worker_reason: str | None, *, tool_calls: bool = False
) -> FinishReason | None:
    """Map a worker's finish string (``stop``/``length``/``abort``) to the OpenAI field.

    A normal stop that produced tool calls is ``tool_calls``; a length cut stays
    ``length`` even when calls were parsed (the last one may be truncated).
    """
    if not worker_reason:
        return None
    if worker_reason == "stop":
        return "tool_calls" if tool_calls else "stop"
    if worker_reason in ("length", "abort", "tool_calls", "content_filter"):
        return worker_reason  # type: ignore[return-value]
    return "stop"


# Every unary chat answer's shapes, made at import (a compile each) rather than in a first request.
for _cls in (
    Usage, PromptTokensDetails, CompletionTokensDetails, ChatCompletionMessage, ChatCompletionChoice, ChatCompletionResponse,
):
    _SHAPERS[_cls] = _shaper(_cls)
