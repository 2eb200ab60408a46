"""``/v1/embeddings`` (protocol/embeddings.py): the inputs as a batch, OpenAI's base64
float32 encoding, and the response shape."""

from __future__ import annotations

import base64
import struct

import pytest
from pydantic import ValidationError

from gateway.protocol.embeddings import (
    EmbeddingRequest,
    EmbeddingResponse,
    decode_embedding_base64,
    encode_embedding_base64,
)


def test_inputs_in_every_shape_become_a_batch() -> None:
    assert EmbeddingRequest.model_validate({"input": "a"}).inputs() == ["a"]
    assert EmbeddingRequest.model_validate({"input": ["a", "b"]}).inputs() == ["a", "b"]
    assert EmbeddingRequest.model_validate({"input": [5, 6]}).inputs() == [[5, 6]]
    assert EmbeddingRequest.model_validate({"input": [[5], [6, 7]]}).inputs() == [[5], [6, 7]]


@pytest.mark.parametrize(
    "body", [{"input": []}, {"input": [-1]}, {"input": "a", "encoding_format": "hex"}, {"input": "a", "dimensions": 0}],
)
def test_bad_requests_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate(body)


def test_base64_is_little_endian_float32_and_round_trips() -> None:
    vector = [0.5, -1.25, 3.0]
    text = encode_embedding_base64(vector)
    assert base64.b64decode(text) == struct.pack("<3f", *vector)
    assert decode_embedding_base64(text) == vector
    assert encode_embedding_base64([]) == "" and decode_embedding_base64("") == []
    rounded = decode_embedding_base64(encode_embedding_base64([0.1]))[0]
    assert rounded == pytest.approx(0.1, rel=1e-7) and rounded != 0.1  # float32, as OpenAI sends


def test_the_response_numbers_its_vectors_and_counts_prompt_tokens_as_total() -> None:
    floats = EmbeddingResponse.build([[0.5, 0.25], [1.0, 0.0]], model="m", prompt_tokens=7).to_dict()
    assert floats["object"] == "list" and floats["model"] == "m"
    assert floats["data"] == [
        {"object": "embedding", "index": 0, "embedding": [0.5, 0.25]},
        {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]},
    ]
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    b64 = EmbeddingResponse.build([[0.5, 0.25]], model="m", prompt_tokens=1, encoding_format="base64").to_dict()
    assert decode_embedding_base64(b64["data"][0]["embedding"]) == [0.5, 0.25]
