"""The Conversations calls' framing (the calls run over a real channel in
tests/e2e/grpc/test_responses.py)."""

from __future__ import annotations

from gateway.server.grpc.conversations import conversation_message


def test_a_conversation_is_typed() -> None:
    out = conversation_message({"id": "conv_1", "object": "conversation", "created_at": 12, "metadata": {"a": "b"}})
    assert out.id == "conv_1" and out.created_at == 12 and dict(out.metadata) == {"a": "b"}
    assert dict(conversation_message({"id": "conv_2", "metadata": None}).metadata) == {}
