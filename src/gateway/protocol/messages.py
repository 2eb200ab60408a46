"""Anthropic Messages API (``POST /v1/messages``) request models and error shape.

Content blocks the gateway serves: ``text``, ``tool_use``, ``tool_result`` and
``thinking`` (``redacted_thinking`` is accepted in history and dropped: its content
is opaque). Images and documents are refused with a clear error: the gateway
serves text models.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from gateway.protocol import limits
from gateway.protocol.common import LongList, RequestModel
from gateway.protocol.errors import GatewayError

_SUPPORTED_BLOCKS = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking"}


class ContentBlock(RequestModel):
    """One content block of any supported type (checked per type after parsing)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool = False
    thinking: str | None = None
    signature: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _block_types(cls, value: Any) -> Any:
        return _check_block_types(value)

    def plain_text(self) -> str:
        """A tool_result's content (or a text block) as one string."""
        if self.type == "text":
            return self.text or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text or "" for b in self.content or [] if b.type == "text")


def _check_block_types(value: Any) -> Any:
    if isinstance(value, list):
        for block in value:
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(kind, str) or kind not in _SUPPORTED_BLOCKS:
                raise ValueError(f"content block type {kind!r} is not supported; supported: {', '.join(sorted(_SUPPORTED_BLOCKS))}")
    return value


class MessageParam(RequestModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _block_types(cls, value: Any) -> Any:
        return _check_block_types(value)


class ToolParam(RequestModel):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolChoiceParam(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingParam(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class MessagesRequest(RequestModel):
    """What the gateway reads of a Messages request; other fields are ignored."""

    long_list: ClassVar[LongList | None] = LongList("messages", MessageParam, limits.MAX_MESSAGES)
    model: str | None = None
    messages: list[MessageParam] = Field(min_length=1)
    max_tokens: int = Field(ge=1, strict=True)
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _message_count(cls, value: Any) -> Any:
        return limits.check_message_count(value)

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system
        return "".join(b.plain_text() for b in self.system)


class CountTokensRequest(MessagesRequest):
    """``/v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)


_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return _TYPES_BY_STATUS.get(status, "api_error")


def anthropic_error(exc: GatewayError) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": anthropic_error_type(exc.status), "message": exc.message}}
