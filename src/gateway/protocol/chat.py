"""``POST /v1/chat/completions`` request: messages, tools, formats, sampling.

One ``ChatMessage`` model covers every role (rules per role are checked after
parsing) so a validation error's ``param`` reads ``messages.[2].content`` rather
than carrying a union member's name.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gateway.protocol import limits
from gateway.protocol.common import (
    AllowedToolsChoice,
    LongList,
    NamedToolChoice,
    RequestModel,
    ResponseFormat,
    SamplingRequest,
    Tool,
    ToolChoice,
    json_text_too_deep,
    schema_depth,
)
from gateway.protocol.errors import ParamError

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextContentPart(RequestModel):
    type: Literal["text"] = "text"
    text: str


class FunctionCallRequest(RequestModel):
    """A function call in an assistant message of the history; ``arguments`` is JSON text."""

    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_text(cls, value: Any) -> Any:
        # Some clients send the arguments object itself rather than its JSON text.
        if isinstance(value, dict):
            value = json.dumps(value, ensure_ascii=False)
        if isinstance(value, str) and json_text_too_deep(value):
            raise ValueError(f"tool-call arguments are nested deeper than {limits.MAX_JSON_DEPTH} levels")
        return value


class ToolCallRequest(RequestModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallRequest


class ChatMessage(RequestModel):
    """One message of the conversation, for any role."""

    role: Role
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallRequest] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type", "text") != "text":
                    raise ValueError(
                        f"content part type {part.get('type')!r} is not supported; "
                        "only 'text' parts are"
                    )
        return value

    @model_validator(mode="after")
    def _role_rules(self) -> ChatMessage:
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ParamError("content", "an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ParamError("content", f"content is required for a {self.role!r} message")
        if self.tool_calls and self.role != "assistant":
            raise ParamError("tool_calls", "only assistant messages may carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ParamError("tool_call_id", "a 'tool' message needs tool_call_id")
        return self

    def text(self) -> str | None:
        """The content as one string (text parts joined), or None if there is none."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def to_template(self) -> dict[str, Any]:
        """The message as a chat template expects it (``apply_chat_template`` conventions).

        Content parts are flattened to one string; tool-call arguments become a dict
        when they are a JSON object (Hugging Face templates expect that) and stay
        text otherwise.
        """
        out: dict[str, Any] = {"role": self.role, "content": self.text() or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_for_template(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        return out


def _arguments_for_template(arguments: str) -> dict[str, Any] | str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class ChatCompletionRequest(SamplingRequest):
    """An OpenAI chat completion request plus SGLang's extensions."""

    long_list: ClassVar[LongList | None] = LongList("messages", ChatMessage, limits.MAX_MESSAGES)
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=limits.MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=limits.MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # SGLang extras.
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning effort; reaches templates that read it (gpt-oss's).
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _message_count(cls, value: Any) -> Any:
        return limits.check_message_count(value)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, value: Any) -> Any:
        if value is None or isinstance(value, dict):
            return value
        if value not in ("none", "auto", "required"):
            raise ValueError(
                "tool_choice must be 'none', 'auto', 'required', "
                '{"type": "function", "function": {"name": ...}} or '
                '{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}'
            )
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs_depth(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and schema_depth(value, limits.MAX_JSON_DEPTH) > limits.MAX_JSON_DEPTH:
            raise ValueError(f"chat_template_kwargs are nested deeper than {limits.MAX_JSON_DEPTH} levels")
        return value

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must contain at least one message")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ParamError("top_logprobs", "top_logprobs requires logprobs to be true")
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise ParamError("tools", "tool function names must be unique")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not names:
            raise ParamError(
                "tool_choice", f"tool_choice {_choice_label(choice)} needs a non-empty tools list"
            )
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ParamError(
                "tool_choice",
                f"tool_choice names function {choice.function.name!r}, which is not in tools",
            )
        if isinstance(choice, AllowedToolsChoice):
            for allowed in choice.allowed_tools.tools:
                if allowed.function_name not in names:
                    raise ParamError(
                        "tool_choice",
                        f"allowed_tools names function {allowed.function_name!r}, which is not in tools",
                    )
        max_new = self.max_new_tokens
        if max_new is not None and self.min_tokens > max_new:
            raise ParamError(
                "min_tokens", "min_tokens must not exceed max_completion_tokens / max_tokens"
            )
        return self

    @property
    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` if given, else ``max_tokens``; None = until the context ends."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def effective_tool_choice(self) -> Literal["none", "auto", "required"] | NamedToolChoice:
        """OpenAI's default: ``auto`` when tools are given, ``none`` otherwise."""
        if isinstance(self.tool_choice, AllowedToolsChoice):
            return self.tool_choice.allowed_tools.mode
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def tool_choice_json(self) -> str | dict[str, Any]:
        """The effective tool_choice in its JSON form (what the parsers layer takes)."""
        choice = self.effective_tool_choice
        return choice if isinstance(choice, str) else choice.model_dump()

    def tools_json(self) -> list[dict[str, Any]]:
        """Declared tools as OpenAI JSON dicts (``[]`` when none); with ``allowed_tools``
        only the allowed ones (the model is shown and may call only those)."""
        tools = self.tools or []
        if isinstance(self.tool_choice, AllowedToolsChoice):
            allowed = {t.function_name for t in self.tool_choice.allowed_tools.tools}
            tools = [t for t in tools if t.function.name in allowed]
        return [tool.model_dump(exclude_none=True) for tool in tools]

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages ready for ``apply_chat_template``."""
        return [message.to_template() for message in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """Tools for the chat template; None when tool_choice is ``none`` or no tools exist."""
        if not self.tools or self.effective_tool_choice == "none":
            return None
        return self.tools_json()


def _choice_label(choice: str | NamedToolChoice | AllowedToolsChoice) -> str:
    if isinstance(choice, AllowedToolsChoice):
        return "allowed_tools"
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"
