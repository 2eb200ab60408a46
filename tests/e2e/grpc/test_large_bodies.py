"""Large valid bodies on both doors: past ``--max-body-values`` a request is refused (413 in
the API's shape on HTTP, RESOURCE_EXHAUSTED with the 413 in its metadata on gRPC) before
it is parsed into Python objects; within it, or long with few values, it is served."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
import pytest
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from tests.e2e.grpc.conftest import GrpcStack

BOUND = 2_000

pytestmark = pytest.mark.stack(server={"max_body_values": BOUND})

JSON = {"content-type": "application/json"}


async def _post(gstack: GrpcStack, path: str, body: dict[str, Any]) -> Any:
    return await gstack.http.http.post(path, content=orjson.dumps({"model": gstack.model, **body}), headers=JSON)


async def test_http_bodies_past_the_values_bound_get_413_in_the_apis_shape(gstack: GrpcStack) -> None:
    within = await _post(gstack, "/v1/completions", {"prompt": [100] * 500, "max_tokens": 2})
    assert within.status_code == 200, within.text
    long_text = await _post(gstack, "/v1/completions", {"prompt": "hello " * 1000, "max_tokens": 2})
    assert long_text.status_code == 200, long_text.text  # 6 KB, a handful of values
    for path, body in [
        ("/v1/completions", {"prompt": [100] * 3000, "max_tokens": 2}),
        ("/generate", {"input_ids": [100] * 3000, "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/detokenize", {"tokens": [100] * 3000}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 1000, "max_tokens": 2}),
        ("/v1/responses", {"input": [{"role": "user", "content": "hi"}] * 1000}),
    ]:
        r = await _post(gstack, path, body)
        assert r.status_code == 413, (path, r.text)
        error = r.json()["error"]
        assert error["code"] == "payload_too_large" and f"at most {BOUND:,}" in error["message"], path
    anthropic = await _post(gstack, "/v1/messages", {"messages": [{"role": "user", "content": "hi"}] * 1000, "max_tokens": 2})
    assert anthropic.status_code == 413
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "request_too_large"
    assert (await gstack.http.http.get("/health")).status_code == 200
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


async def test_grpc_requests_past_the_values_bound_get_resource_exhausted(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        stub = gpb_grpc.TokenGatewayStub(channel)
        within = gpb.CompletionRequest(model=gstack.model, token_ids=gpb.TokenIds(ids=[100] * 500))
        within.sampling.max_tokens = 2
        assert (await stub.Completion(within, timeout=30)).choices
        message = gpb.ChatMessage(role="user", content="hi")
        chat = gpb.ChatCompletionRequest(model=gstack.model, messages=[message] * 10)
        chat.sampling.max_tokens = 2
        assert (await stub.ChatCompletion(chat, timeout=30)).choices
        over = gpb.CompletionRequest(model=gstack.model, token_ids=gpb.TokenIds(ids=[100] * 3000))
        long_chat = gpb.ChatCompletionRequest(model=gstack.model, messages=[message] * 200)  # each weighs 16
        for call in (stub.Completion(over, timeout=30), stub.ChatCompletion(long_chat, timeout=30),
                     stub.Detokenize(gpb.DetokenizeRequest(model=gstack.model, tokens=[100] * 3000), timeout=30)):  # fmt: skip
            with pytest.raises(aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(refused.value.trailing_metadata() or ())["x-http-status"] == "413"
        assert (await stub.Completion(within, timeout=30)).choices  # the door still serves
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


@pytest.mark.stack(server={"grpc_max_message_bytes": 64 * 1024})
async def test_a_grpc_message_past_its_byte_bound_is_refused_unparsed(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        stub = gpb_grpc.TokenGatewayStub(channel)
        text = "hello " * 12_000  # 72 KB: past the gRPC bound, well within the HTTP body bound
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Tokenize(gpb.TokenizeRequest(model=gstack.model, prompt=text), timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len((await stub.Tokenize(gpb.TokenizeRequest(model=gstack.model, prompt=text[:6000]), timeout=30)).tokens) > 0
    r = await _post(gstack, "/v1/tokenize", {"prompt": text})
    assert r.status_code == 200 and r.json()["count"] > 10_000
