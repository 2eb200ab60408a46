"""Exceptions of the tokenization layer.

The server maps ``ChatTemplateError`` to HTTP 400 (the client sent something the
template cannot render) and ``TokenizerNotFound`` to a startup/config error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class TokenizationError(Exception):
    """Base class of every error raised by ``gateway.tokenization``."""


@dataclass(frozen=True)
class Attempt:
    """One place the registry looked for a tokenizer, and why it did not work."""

    source: str  # "path" | "cache" | "worker" | "hub"
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source} ({self.where}): {self.reason}"


class TokenizerNotFound(TokenizationError):
    """No source could provide a usable tokenizer; lists every attempt and its failure."""

    def __init__(self, model: str, attempts: Sequence[Attempt]) -> None:
        self.model = model
        self.attempts = tuple(attempts)
        tried = "\n".join(f"  - {a}" for a in self.attempts) or "  (nothing was tried)"
        super().__init__(f"no tokenizer found for model {model!r}; tried:\n{tried}")


class TokenizerLoadError(TokenizationError):
    """A folder or file exists but does not hold a tokenizer we can load."""


class TokenizerTooLarge(TokenizerLoadError):
    """A tokenizer whose vocabulary has more entries than this gateway builds (building it
    holds the GIL of the serving process for about a second per 400,000 entries)."""


class TokenizerArchiveError(TokenizationError):
    """A tokenizer zip (from a worker's GetTokenizer) is corrupt, mismatched or unsafe."""


class ChatTemplateError(TokenizationError):
    """The chat template cannot be compiled, or cannot render these messages (HTTP 400)."""


class ChatTemplateBudgetError(ChatTemplateError):
    """The chat template went over its render budget (``render_budget``): a template bomb,
    or inputs far larger than the template can render (HTTP 400 ``chat_template_budget``)."""
