"""``POST /v1/embeddings``: request, response, and OpenAI's base64 vector encoding."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from gateway.protocol.common import RequestModel
from gateway.protocol.completions import check_token_or_text_input, prompt_batch

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(RequestModel):
    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value: Any) -> Any:
        return check_token_or_text_input(value, "input")

    def inputs(self) -> list[str] | list[list[int]]:
        """One text or token-id list per embedding to compute."""
        return prompt_batch(self.input)


def encode_embedding_base64(vector: Sequence[float]) -> str:
    """OpenAI's ``encoding_format=base64``: little-endian float32 bytes, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_embedding_base64(text: str) -> list[float]:
    """Inverse of ``encode_embedding_base64`` (what OpenAI SDKs do on receipt)."""
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage

    @classmethod
    def build(
        cls,
        vectors: Sequence[Sequence[float]],
        *,
        model: str,
        prompt_tokens: int,
        encoding_format: Literal["float", "base64"] = "float",
    ) -> EmbeddingResponse:
        data = [
            EmbeddingData(
                index=i,
                embedding=encode_embedding_base64(v) if encoding_format == "base64" else list(v),
            )
            for i, v in enumerate(vectors)
        ]
        usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        return cls(data=data, model=model, usage=usage)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
