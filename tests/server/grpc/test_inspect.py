"""InspectPrefix over gRPC (server/grpc/inspect.py): the message as /admin/inspect's JSON
body, and the answer back as the response message."""

from __future__ import annotations

from gateway.endpoints.inspect import Inspector
from gateway.proto import gateway_pb2 as gpb
from gateway.server.config import GatewayConfig
from gateway.server.grpc.inspect import inspect_prefix, inspect_request
from tests.server.http.gateway_app import gateway


def test_each_input_kind_becomes_the_json_body() -> None:
    assert inspect_request(gpb.InspectPrefixRequest(text="hi", model="m", pool="prefill")) == {
        "text": "hi", "model": "m", "pool": "prefill"}
    ids = inspect_request(gpb.InspectPrefixRequest(token_ids=gpb.TokenIds(ids=[1, 2]), block_size=8, include_tokens=False))
    assert ids == {"input_ids": [1, 2], "block_size": 8, "include_tokens": False}
    chat = gpb.InspectPrefixRequest(messages={"messages": [{"role": "user", "content": "hi"}]})
    chat.messages.chat_template_kwargs.update({"enable_thinking": False})
    body = inspect_request(chat)
    assert body["messages"][0]["content"] == "hi" and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "add_special_tokens" not in body  # unset optional fields stay unset


async def test_the_answer_round_trips_into_the_response_message() -> None:
    async with gateway(GatewayConfig()) as (state, _):
        await state.add_worker("grpc://w1:1")
        inspector = Inspector(state.engine, state.config.policy)
        reply = await inspect_prefix(inspector, gpb.InspectPrefixRequest(text="The quick brown fox " * 10))
        assert reply.model == "fake-model" and reply.pool == "regular" and reply.token_count == len(reply.tokens) > 0
        assert reply.chosen_worker == "w1:1" and reply.reason and [w.worker_id for w in reply.workers] == ["w1:1"]
        assert reply.blocks and reply.tokens[0].piece
        assert reply.text.startswith("The quick brown fox")
