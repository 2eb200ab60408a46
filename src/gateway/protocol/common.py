"""Request pieces shared by the OpenAI endpoints: sampling fields, stop, tools, formats.

Models ignore unknown fields (OpenAI SDKs send extras the gateway does not know)
but reject known fields of the wrong type or out of range, with messages that
name the field. An explicit ``null`` on a field that has a non-null default means
"use the default", as OpenAI treats it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.protocol import limits
from gateway.protocol.errors import ParamError


@dataclass(frozen=True, slots=True)
class LongList:
    """A request's list field that may hold thousands of items (a conversation's messages):
    its name, its item's model and the most items it takes. Validating such a list holds
    the event loop in proportion to its items, so the server validates it in steps, a loop
    turn apart (``server.http.util.parse_model_in_steps``); the model's own count check
    still refuses a list past ``cap`` before any item is validated."""

    field: str
    item: type[BaseModel]
    cap: int


class RequestModel(BaseModel):
    """Base of every request model: ignore extras, treat ``null`` as "not given"."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    long_list: ClassVar[LongList | None] = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for value in data.values():
            if value is None:
                break
        else:  # no null at all: the common request, answered without the fields' walk
            return data
        defaulted = _NULL_DEFAULTED.get(cls)
        if defaulted is None:  # a class's fields are fixed once it is built: worked out once
            defaulted = _NULL_DEFAULTED[cls] = frozenset(
                key for key, f in cls.model_fields.items()
                if not f.is_required() and (f.default is not None or f.default_factory is not None)
            )
        drop = [key for key, value in data.items() if value is None and key in defaulted]
        if not drop:
            return data
        return {k: v for k, v in data.items() if k not in drop}


# Per request model: the fields whose explicit null means their (non-null) default.
_NULL_DEFAULTED: dict[type[RequestModel], frozenset[str]] = {}


def json_text_too_deep(text: str, limit: int = limits.MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests objects and arrays deeper than ``limit``, found without
    parsing it (a parser recurses, so it is the parse this check protects). Text with no
    more brackets than ``limit`` cannot be, and is not scanned."""
    if text.count("{") + text.count("[") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
            if depth > limit:
                return True
        elif char in "}]":
            depth -= 1
    return False


def schema_depth(node: Any, limit: int = limits.MAX_SCHEMA_DEPTH) -> int:
    """Nesting depth of a JSON value (scalars are 0), counted no further than ``limit`` + 1."""
    depth = 0
    stack: list[tuple[Any, int]] = [(node, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        depth = max(depth, level + 1)
        if level + 1 > limit:
            return level + 1
        stack.extend((child, level + 1) for child in children)
    return depth


def check_schema_bounds(schema: dict[str, Any], what: str) -> dict[str, Any]:
    """Reject schemas too big or too deep to hand to a worker's grammar compiler."""
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > limits.MAX_SCHEMA_BYTES:
        raise ValueError(
            f"{what} is {size} bytes when serialized; the limit is {limits.MAX_SCHEMA_BYTES}"
        )
    if schema_depth(schema) > limits.MAX_SCHEMA_DEPTH:
        raise ValueError(f"{what} is nested deeper than {limits.MAX_SCHEMA_DEPTH} levels")
    return schema


def check_regex(value: str | None) -> str | None:
    """A constraint regex must compile, before a worker's grammar compiler fails the request."""
    if value is None:
        return None
    if len(value.encode()) > limits.MAX_SCHEMA_BYTES:
        raise ValueError(f"the regex is larger than {limits.MAX_SCHEMA_BYTES} bytes")
    try:
        re.compile(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"the regex does not compile: {exc}") from None
    return value


def check_schema_text(value: str | None) -> str | None:
    """A JSON schema given as text must be a JSON object (or boolean) within the schema bounds."""
    if value is None:
        return None
    if len(value.encode()) > limits.MAX_SCHEMA_BYTES:
        raise ValueError(f"the JSON schema is larger than {limits.MAX_SCHEMA_BYTES} bytes")
    try:
        schema = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if isinstance(schema, bool):
        return value
    if not isinstance(schema, dict):
        raise ValueError("json_schema must be a JSON object")
    check_schema_bounds(schema, "json_schema")
    return value


MAX_REQUEST_ID = 128


def check_rid(value: str | list[str] | None) -> str | list[str] | None:
    """Request ids reach logs, headers and workers: short and printable."""
    for rid in [value] if isinstance(value, str) else value or []:
        if not rid or len(rid) > MAX_REQUEST_ID or not rid.isprintable():
            raise ValueError(f"request ids must be 1 to {MAX_REQUEST_ID} printable characters")
    return value


def check_stop(value: str | list[str] | None) -> str | list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if len(items) > limits.MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {limits.MAX_STOP_SEQUENCES} stop sequences are allowed")
    if any(item == "" for item in items):
        raise ValueError("stop sequences must not be empty strings")
    return value


def stop_list(value: str | list[str] | None) -> list[str]:
    """``stop`` as a list, whatever form the client sent."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    """Keys must be token ids (as JSON object keys, i.e. strings); values within ±100."""
    if value is None:
        return None
    if len(value) > limits.MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"at most {limits.MAX_LOGIT_BIAS_ENTRIES} logit_bias entries are allowed")
    low, high = limits.LOGIT_BIAS_RANGE
    normalized: dict[str, float] = {}
    for key, bias in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise ValueError(f"logit_bias key {key!r} is not a token id") from None
        if token_id < 0:
            raise ValueError(f"logit_bias key {key!r} is not a token id")
        if not low <= bias <= high:
            raise ValueError(
                f"logit_bias value for token {key} must be between {low:g} and {high:g}"
            )
        normalized[str(token_id)] = float(bias)
    return normalized


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class FunctionDefinition(RequestModel):
    """A callable the model may use: its name and a JSON-object schema of its arguments."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        kind = value.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            raise ValueError(f"parameters must be a JSON schema of type 'object', not {kind!r}")
        return check_schema_bounds(value, "the parameters schema")


class Tool(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(RequestModel):
    name: str = Field(min_length=1)


class NamedToolChoice(RequestModel):
    """``{"type": "function", "function": {"name": ...}}``: force one particular tool."""

    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class AllowedTool(RequestModel):
    """One entry of ``allowed_tools.tools``: ``{"type": "function", "function": {"name"}}``
    (the Responses API's flat ``{"type": "function", "name"}`` is accepted too)."""

    type: Literal["function"] = "function"
    function: ToolChoiceFunction | None = None
    name: str | None = None

    @property
    def function_name(self) -> str:
        return self.function.name if self.function is not None else (self.name or "")


class AllowedTools(RequestModel):
    mode: Literal["auto", "required"] = "auto"
    tools: list[AllowedTool] = Field(min_length=1)


class AllowedToolsChoice(RequestModel):
    """``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}``: only these tools,
    chosen freely (``auto``) or at least one called (``required``)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class JsonSchemaFormat(RequestModel):
    """The ``json_schema`` member of ``response_format``."""

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_schema_bounds(value, "the response schema")


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.schema_ is None
        ):
            raise ParamError(
                "json_schema", "response_format of type 'json_schema' needs json_schema.schema"
            )
        return self


_REGEX_SPECIAL = frozenset("\\.^$|?*+()[]{}")


def choice_regex(choices: list[str]) -> str:
    """A regex that matches exactly one of ``choices``: every regex-special character is
    escaped by a backslash, which the workers' grammar engines read as Python's ``re`` does."""
    alternatives = ("".join("\\" + c if c in _REGEX_SPECIAL else c for c in text) for text in choices)
    return "(" + "|".join(alternatives) + ")"


class StructuredOutputs(RequestModel):
    """vLLM's ``structured_outputs`` request field: one output constraint, named as vLLM
    names it, so a vLLM client's constraint is applied rather than dropped as an unknown field."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1, max_length=limits.MAX_STOP_SEQUENCES * 8)
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    # vLLM's knobs on how its grammar backend builds the constraint: not carried to a worker.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return check_regex(value)

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) > limits.MAX_SCHEMA_BYTES:
            raise ValueError(f"the grammar is larger than {limits.MAX_SCHEMA_BYTES} bytes")
        return value

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        for name in ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"):
            if getattr(self, name):
                raise ParamError(name, f"structured_outputs.{name} is not supported by this gateway")
        if self.structural_tag is not None:
            raise ParamError(
                "structural_tag", "structured_outputs.structural_tag is not supported; use tools with tool_choice"
            )
        given = [n for n in ("json", "regex", "choice", "grammar", "json_object") if self._value(n) not in (None, False)]
        if len(given) > 1:
            raise ParamError(given[1], f"structured_outputs takes one constraint, got: {', '.join(given)}")
        if self.choice is not None and len(choice_regex(self.choice).encode()) > limits.MAX_SCHEMA_BYTES:
            raise ParamError("choice", f"the choices are larger than {limits.MAX_SCHEMA_BYTES} bytes")
        if isinstance(self.json_, str):
            check_schema_text(self.json_)
        elif isinstance(self.json_, dict):
            check_schema_bounds(self.json_, "structured_outputs.json")
        return self

    def _value(self, name: str) -> object:
        return self.json_ if name == "json" else getattr(self, name)


class StopFieldsChecks(RequestModel):
    """Checks of the stop / stop_token_ids / logit_bias fields that the OpenAI
    requests and SGLang's sampling_params share (the subclass declares the fields)."""

    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        return check_stop(value)

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return check_logit_bias(value)

    @field_validator("regex", check_fields=False)
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return check_regex(value)

    @field_validator("json_schema", check_fields=False)
    @classmethod
    def _json_schema_text(cls, value: str | None) -> str | None:
        return check_schema_text(value)

    @field_validator("ebnf", check_fields=False)
    @classmethod
    def _ebnf(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) > limits.MAX_SCHEMA_BYTES:
            raise ValueError(f"the grammar is larger than {limits.MAX_SCHEMA_BYTES} bytes")
        return value

    @field_validator("rid", check_fields=False)
    @classmethod
    def _rid(cls, value: str | list[str] | None) -> str | list[str] | None:
        return check_rid(value)

    @field_validator("stop_token_ids", check_fields=False)
    @classmethod
    def _token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("stop_token_ids must be non-negative token ids")
        return value


class SamplingRequest(StopFieldsChecks):
    """Fields the OpenAI chat and completions requests share, with SGLang's extras."""

    model: str | None = None
    # strict: JSON true is not 1 (pydantic's lax mode would take it as one)
    n: int = Field(default=1, ge=1, le=limits.MAX_N, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # SGLang's and vLLM's request priority: the gateway's admission order within the caller's key.
    priority: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    # vLLM's constraint field (SGLang's are regex, ebnf and json_schema).
    structured_outputs: StructuredOutputs | None = None
    # SGLang extras.
    regex: str | None = None
    ebnf: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stop_token_ids: list[int] | None = Field(default=None, max_length=limits.MAX_STOP_TOKEN_IDS)
    return_hidden_states: bool = False
    rid: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: no cache shared across salts

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options", "stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(
            self.stream and self.stream_options and self.stream_options.continuous_usage_stats
        )
