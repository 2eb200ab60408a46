"""``POST /v1/completions`` request (the legacy text-completion API)."""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import Field, SkipValidation, field_validator, model_validator

from gateway.protocol import limits
from gateway.protocol.common import SamplingRequest
from gateway.protocol.errors import ParamError

Prompt = str | list[str] | list[int] | list[list[int]]


def check_token_or_text_input(value: Any, what: str) -> Any:
    """One clear message for the four accepted shapes of ``prompt`` / ``input``.

    Pydantic would report one error per union member; clients need to read only
    which shapes are allowed.
    """
    shapes = "a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ValueError(f"{what} must be {shapes} (and not empty)")
    if all(isinstance(v, str) for v in value):
        return value
    if are_token_ids(value):
        return value
    if all(isinstance(v, list) and v and are_token_ids(v) for v in value):
        return value
    raise ValueError(f"{what} must be {shapes}; token ids are non-negative integers")


def are_token_ids(values: list[Any]) -> bool:
    """Every value a non-negative int (a JSON ``true`` is a bool, not an id). Checked with
    C-level passes (``map``, ``set``, ``min``): a request body may carry millions of ids, and
    their check runs on the event loop."""
    return set(map(type, values)) == {int} and min(values) >= 0


def prompt_batch(prompt: Prompt) -> list[str] | list[list[int]]:
    """The prompt as a batch: one text or one token list per item."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [cast("list[int]", list(prompt))]
    return cast("list[str] | list[list[int]]", list(prompt))


class CompletionRequest(SamplingRequest):
    """An OpenAI text completion request plus SGLang's extensions.

    ``suffix`` (fill-in-the-middle) and ``best_of`` > n are rejected: the gateway
    cannot honour them and silently ignoring them would return wrong answers.
    """

    # Validated whole by ``_prompt_shape``; pydantic's own pass over the four-way union would
    # walk a long token-id prompt again, at several times the cost, on the event loop.
    prompt: Annotated[Prompt, SkipValidation]
    max_tokens: int | None = Field(default=16, ge=1, strict=True)  # OpenAI's default for this API
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=limits.MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1)
    json_schema: str | None = None  # SGLang extra: a JSON schema given as text

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        return check_token_or_text_input(value, "prompt")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (fill-in-the-middle) is not supported by this server")
        return None

    @model_validator(mode="after")
    def _consistent(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ParamError("best_of", "best_of is not supported (it may only equal n)")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ParamError("min_tokens", "min_tokens must not exceed max_tokens")
        return self

    def prompts(self) -> list[str] | list[list[int]]:
        """One entry per prompt of the batch (text or token ids)."""
        return prompt_batch(self.prompt)
