"""``POST /admin/inspect``: what the router sees in one prompt (see ``policies.inspection``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.protocol.errors import ParamError
from gateway.protocol.tokens import TemplatedInput

Pool = Literal["regular", "prefill", "decode"]


class InspectRequest(TemplatedInput):
    """Exactly one of ``text`` (alias ``prompt``), ``messages`` or ``input_ids``.

    ``text`` is tokenized as ``/v1/completions`` does (special tokens added unless
    ``add_special_tokens`` is false); ``messages`` are rendered with the chat
    template as ``/v1/chat/completions`` does. ``block_size``/``depth_tokens``
    override the gateway's prefix-hash settings for this answer only.
    """

    text: str | None = Field(default=None, alias="prompt")
    input_ids: list[int] | None = None
    pool: Pool = "regular"
    block_size: int | None = Field(default=None, ge=1, le=1 << 16)
    depth_tokens: int | None = Field(default=None, ge=1, le=1 << 24)
    include_tokens: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> InspectRequest:
        given = [n for n in ("text", "messages", "input_ids") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ParamError("text", "exactly one of text (or prompt), messages and input_ids must be given")
        self._check_messages()
        if self.input_ids is not None and not self.input_ids:
            raise ParamError("input_ids", "input_ids must contain at least one token id")
        return self
