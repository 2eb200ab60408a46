"""``/tokenize`` and ``/detokenize``: expose the gateway's own tokenizer and template."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, field_validator, model_validator

from gateway.protocol import limits
from gateway.protocol.chat import ChatMessage
from gateway.protocol.common import LongList, RequestModel
from gateway.protocol.errors import ParamError


class TemplatedInput(RequestModel):
    """A request that takes text or chat messages and tokenizes them as the inference
    endpoints do (``/tokenize``, ``/admin/inspect``).

    ``add_special_tokens`` defaults to True for text and False for messages (the
    template already writes the special tokens), as vLLM and SGLang do.
    """

    long_list: ClassVar[LongList | None] = LongList("messages", ChatMessage, limits.MAX_MESSAGES)
    model: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _message_count(cls, value: Any) -> Any:
        return limits.check_message_count(value)

    def _check_messages(self) -> None:
        if self.messages is not None and not self.messages:
            raise ParamError("messages", "messages must contain at least one message")

    @property
    def special_tokens(self) -> bool:
        """Whether the tokenizer should add its special tokens (BOS etc.)."""
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.messages is None

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template() for m in self.messages or []]


class TokenizeRequest(TemplatedInput):
    """Either ``prompt`` (plain text) or ``messages`` (rendered with the chat template)."""

    prompt: str | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ParamError("prompt", "exactly one of prompt and messages must be given")
        self._check_messages()
        return self


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]

    @field_validator("tokens")
    @classmethod
    def _token_ids(cls, value: list[int]) -> list[int]:
        if any(t < 0 for t in value):
            raise ValueError("tokens must be non-negative token ids")
        return value


class DetokenizeResponse(BaseModel):
    text: str

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
