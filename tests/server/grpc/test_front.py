"""The gateway's own gRPC API (server/grpc/front.py), called with the official stub
through the Python client: the same pipeline as the HTTP door, the same keys, and
gateway errors as gRPC statuses."""

from __future__ import annotations

import grpc
import pytest

from gateway.client import GatewayClient, GatewayRpcError, user
from gateway.server.config import GatewayConfig
from tests.fake_transport import chunk, complete
from tests.server.grpc.grpc_gateway import grpc_gateway
from tests.server.http.gateway_app import add_model_worker


async def test_chat_completion_and_generate_reach_the_worker() -> None:
    async with grpc_gateway() as (state, server), GatewayClient(server.target) as client:
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        worker.script(complete([9707, 1879], finish="stop"))
        reply = await client.chat([user("hi")], max_tokens=4)
        assert reply.choices[0].message.content == "Hello world" and reply.choices[0].finish_reason == "stop"
        assert list(reply.worker_ids) == ["w1:1"] and worker.requests[-1].sampling_params.max_new_tokens == 4
        worker.script(chunk([9707]), complete([], finish="length"))
        pieces = [c.choices[0].text async for c in client.stream_complete("Say", max_tokens=1) if c.choices]
        assert "".join(pieces) == "Hello"
        worker.script(chunk([9707]), complete([], finish="stop"))
        messages = [m async for m in client.generate([1, 2, 3], stream=True, max_new_tokens=2)]
        assert [list(m.token_ids) for m in messages if m.token_ids] == [[9707]] and messages[-1].finish_reason == "stop"


async def test_generate_names_its_model_when_several_are_served() -> None:
    async with grpc_gateway() as (state, server), GatewayClient(server.target) as client:
        other = await add_model_worker(state, "grpc://w2:1", "other-model")
        other.script(complete([9707], finish="stop"))
        messages = [m async for m in client.generate([1, 2, 3], model="other-model", max_new_tokens=1)]
        assert messages[-1].finish_reason == "stop" and len(other.requests) == 1
        with pytest.raises(GatewayRpcError) as unnamed:
            await client.generate([1, 2, 3], max_new_tokens=1).__anext__()
        assert unnamed.value.code == grpc.StatusCode.NOT_FOUND and unnamed.value.error_code == "model_not_found"
        assert not state.transports["grpc://w1:1"].requests  # type: ignore[attr-defined]


async def test_tokens_models_workers_and_embeddings() -> None:
    async with grpc_gateway() as (state, server), GatewayClient(server.target) as client:
        tokens = await client.tokenize("Hello world")
        assert list(tokens.tokens) == state.catalog.get(None).tokenizer.encode("Hello world", True)
        assert await client.detokenize(list(tokens.tokens)) == "Hello world"
        models = await client.list_models()
        assert [(m.id, m.worker_count) for m in models] == [("fake-model", 1)]
        assert [w.id for w in await client.list_workers()] == ["w1:1"]
        emb = await client.embed(["a", "b"])
        assert len(emb.data) == 2 and emb.prompt_tokens > 0 and list(emb.worker_ids) == ["w1:1"]


async def test_keys_and_errors_as_grpc_statuses() -> None:
    config = GatewayConfig()
    config.server.api_keys = ["k1"]
    async with grpc_gateway(config) as (_, server):
        async with GatewayClient(server.target) as anonymous:
            with pytest.raises(GatewayRpcError) as err:
                await anonymous.tokenize("hi")
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED and err.value.type == "authentication_error"
        async with GatewayClient(server.target, api_key="k1") as client:
            with pytest.raises(GatewayRpcError) as bad:
                await client.chat([user("hi")], max_tokens=0)
            assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.value.param
            inspected = await client.inspect_prefix("hi")  # no admin key: any inference key may inspect
            assert inspected.chosen_worker == "w1:1"


async def test_a_token_prompt_too_long_is_refused_from_its_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole or streamed (and a Generate), a Completion of more ids than the context holds gets the HTTP door's
    error, and its ids are never turned into Python objects (the message is not converted)."""
    from gateway.server.grpc import convert

    converted: list[bool] = []
    convert_request = convert.completion_request

    def counted(request: object, *, stream: bool) -> object:
        converted.append(stream)
        return convert_request(request, stream=stream)  # type: ignore[arg-type]

    monkeypatch.setattr(convert, "completion_request", counted)
    monkeypatch.setattr(convert, "generate_request", lambda request: converted.append(True))
    async with grpc_gateway() as (state, server), GatewayClient(server.target) as client:
        limit = state.catalog.get(None).max_context_length
        with pytest.raises(GatewayRpcError) as whole:
            await client.complete([7] * limit, max_tokens=1)
        with pytest.raises(GatewayRpcError) as streamed:
            [c async for c in client.stream_complete([[1], [7] * (limit + 1)], max_tokens=1)]
        with pytest.raises(GatewayRpcError) as generated:
            [m async for m in client.generate([7] * (limit + 2), max_new_tokens=1)]
        assert converted == []
        for err, tokens in ((whole, limit), (streamed, limit + 1), (generated, limit + 2)):
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.error_code == "context_length_exceeded"
            assert err.value.param == "prompt"
            assert err.value.details == f"the prompt has {tokens} tokens; this model's maximum context length is {limit} tokens"
        state.transports["grpc://w1:1"].script(complete([9707], finish="stop"))  # type: ignore[attr-defined]
        fits = await client.complete([7] * 8, max_tokens=1)
        assert fits.choices[0].text == "Hello" and converted == [False]
