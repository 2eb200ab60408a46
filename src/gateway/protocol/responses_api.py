"""OpenAI Responses and Conversations API request models (``/v1/responses``, ``/v1/conversations``).

Input is a string or a list of items: messages (``input_text`` / ``output_text``
parts or a string), ``function_call``, ``function_call_output`` and ``reasoning``
items. Tools are function tools and MCP servers; other tool types (web search, file
search, computer use) are refused with a clear error rather than silently ignored, and
so is any ``include`` value but the output text's logprobs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gateway.protocol.common import RequestModel
from gateway.protocol.errors import ParamError
from gateway.protocol.limits import MAX_INPUT_ITEMS, MAX_TOP_LOGPROBS, check_message_count

ITEM_TYPES = {"message", "function_call", "function_call_output", "reasoning", "mcp_call", "mcp_list_tools"}
_ROLES = {"user", "assistant", "system", "developer"}


def check_items(items: list[Any], param: str) -> list[dict[str, Any]]:
    """Validate input items (their type and the fields each type needs)."""
    out: list[dict[str, Any]] = []
    for n, item in enumerate(items):
        where = f"{param}.[{n}]"
        if not isinstance(item, dict):
            raise ParamError(where, "an input item must be an object")
        kind = item.get("type", "message")
        if not isinstance(kind, str) or kind not in ITEM_TYPES:
            raise ParamError(f"{where}.type", f"input item type {kind!r} is not supported; supported: {', '.join(sorted(ITEM_TYPES))}")
        if kind == "message":
            if not isinstance(item.get("role"), str) or item.get("role") not in _ROLES:
                raise ParamError(f"{where}.role", f"a message's role must be one of {', '.join(sorted(_ROLES))}")
            content = item.get("content")
            if isinstance(content, list):
                for k, part in enumerate(content):
                    ptype = part.get("type") if isinstance(part, dict) else None
                    if ptype not in ("input_text", "output_text", "text", "refusal"):
                        raise ParamError(f"{where}.content.[{k}].type", f"content part type {ptype!r} is not supported; only text parts are")
            elif not isinstance(content, str):
                raise ParamError(f"{where}.content", "a message's content must be a string or a list of text parts")
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise ParamError(where, "a function_call item needs call_id and name")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ParamError(f"{where}.call_id", "a function_call_output item needs call_id")
        out.append({**item, "type": kind})
    return out


class ResponseTool(RequestModel):
    """A function tool, or an MCP server whose tools the gateway runs itself."""

    type: str = "function"
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    server_label: str | None = None
    server_url: str | None = None
    allowed_tools: list[str] | dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    require_approval: str | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ResponseTool:
        if self.type == "function":
            if not self.name:
                raise ParamError("name", "a function tool needs a name")
        elif self.type == "mcp":
            if not self.server_label:
                raise ParamError("server_label", "an mcp tool needs server_label (and server_url unless the gateway configures the server)")
            if self.require_approval not in (None, "never"):
                raise ParamError("require_approval", "only require_approval 'never' is supported: the gateway runs the tools itself")
        else:
            raise ParamError("type", f"tool type {self.type!r} is not supported; 'function' and 'mcp' tools are")
        return self

    def allowed_names(self) -> list[str] | None:
        allowed = self.allowed_tools
        if isinstance(allowed, dict):
            names = allowed.get("tool_names")
            return list(names) if isinstance(names, list) else None
        return allowed


LOGPROBS_INCLUDE = "message.output_text.logprobs"
# What OpenAI's ``include`` may ask for that this gateway cannot give (no hosted tools,
# images or encrypted reasoning): refused by name rather than silently left out.
_UNSUPPORTED_INCLUDE = frozenset({
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
})


def check_include(values: list[Any]) -> list[str]:
    """``include`` values: the output text's logprobs are supported, the rest refused."""
    for value in values:
        where = "include"
        if not isinstance(value, str):
            raise ParamError(where, "an include value must be a string")
        if value in _UNSUPPORTED_INCLUDE:
            raise ParamError(where, f"include value {value!r} is not supported; supported: {LOGPROBS_INCLUDE!r}")
        if value != LOGPROBS_INCLUDE:
            raise ParamError(where, f"unknown include value {value!r}; supported: {LOGPROBS_INCLUDE!r}")
    return list(dict.fromkeys(values))


class ReasoningParam(RequestModel):
    effort: Literal["minimal", "low", "medium", "high", "none"] | None = None
    summary: str | None = None


class ConversationRef(RequestModel):
    id: str


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: str | list[Any] = ""
    instructions: str | None = None
    tools: list[ResponseTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    store: bool = True
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    stream: bool = False
    background: bool = False
    user: str | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    include: list[Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    truncation: str = "disabled"  # "auto": drop the oldest items until the context fits
    seed: int | None = Field(default=None, strict=True)  # an extension (as on chat): reproducible sampling

    @property
    def logprobs(self) -> bool:
        """Whether the output text carries its tokens' logprobs (``include``)."""
        return LOGPROBS_INCLUDE in (self.include or ())


    def response_format(self) -> dict[str, Any] | None:
        """``text.format`` as a chat ``response_format`` (None: plain text)."""
        fmt = (self.text or {}).get("format")
        if not isinstance(fmt, dict) or fmt.get("type", "text") == "text":
            return None
        if fmt.get("type") == "json_schema":
            return {"type": "json_schema", "json_schema": {
                "name": fmt.get("name") or "schema", "schema": fmt.get("schema"), "strict": fmt.get("strict"),
            }}
        return {"type": fmt.get("type")}

    @field_validator("input", mode="before")
    @classmethod
    def _item_count(cls, value: Any) -> Any:
        return check_message_count(value, "input", MAX_INPUT_ITEMS, "items")

    @field_validator("input")
    @classmethod
    def _items(cls, value: str | list[Any]) -> str | list[Any]:
        return value if isinstance(value, str) else check_items(value, "input")

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        if self.previous_response_id and self.conversation is not None:
            raise ParamError("previous_response_id", "previous_response_id and conversation cannot be used together")
        if self.include is not None:
            self.include = check_include(self.include)
        if self.truncation not in ("auto", "disabled"):
            raise ParamError("truncation", f"truncation must be 'auto' or 'disabled', not {self.truncation!r}")
        return self

    @property
    def conversation_id(self) -> str | None:
        conv = self.conversation
        return conv.id if isinstance(conv, ConversationRef) else conv

    def input_items(self) -> list[dict[str, Any]]:
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}] if self.input else []
        return list(self.input)


class ConversationCreate(RequestModel):
    items: list[Any] | None = Field(default=None, max_length=20)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)

    @field_validator("items")
    @classmethod
    def _items(cls, value: list[Any] | None) -> list[Any] | None:
        return None if value is None else check_items(value, "items")


class ConversationUpdate(RequestModel):
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16)  # null clears it


class ItemsCreate(RequestModel):
    items: list[Any] = Field(min_length=1, max_length=20)

    @field_validator("items")
    @classmethod
    def _items(cls, value: list[Any]) -> list[Any]:
        return check_items(value, "items")
