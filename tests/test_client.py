"""The typed Python client of the gateway's gRPC API (gateway/client.py): request builders
that put sampling keywords in their message, prompts in every shape, the Responses
request from the HTTP API's dicts, and errors carrying the gateway's fields."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc import aio

from gateway.client import (
    GatewayClient,
    GatewayRpcError,
    _auth,
    _fields,
    assistant,
    chat_request,
    completion_request,
    function_tool,
    generate_request,
    inspect_request,
    response_request,
    system,
    tokenize_request,
    tool,
    user,
)
from gateway.proto import gateway_pb2 as gpb


def test_chat_and_completion_requests_split_sampling_from_the_rest() -> None:
    req = chat_request([system("Be brief."), user("hi"), {"role": "assistant", "content": "hello"}],
                       model="m", max_tokens=8, temperature=0.0, stop=["END"], parallel_tool_calls=False)
    assert [m.role for m in req.messages] == ["system", "user", "assistant"]
    assert req.model == "m" and not req.parallel_tool_calls
    assert req.sampling.max_tokens == 8 and req.sampling.HasField("temperature") and list(req.sampling.stop) == ["END"]
    same = gpb.ChatCompletionRequest(model="x")
    assert chat_request(same) is same
    assert completion_request("once", max_tokens=4).text == "once"
    assert list(completion_request([1, 2]).token_ids.ids) == [1, 2]
    assert list(completion_request(["a", "b"]).texts.texts) == ["a", "b"]
    assert [list(p.ids) for p in completion_request([[1], [2, 3]]).token_id_batch.prompts] == [[1], [2, 3]]


def test_message_and_tool_helpers() -> None:
    assert (assistant("a").role, tool("42", "call_1").tool_call_id) == ("assistant", "call_1")
    t = function_tool("get_time", {"type": "object", "properties": {}}, "what time it is")
    assert t.type == "function" and json.loads(t.function.parameters_json) == {"type": "object", "properties": {}}
    assert t.function.description == "what time it is"
    assert not function_tool("f", {}).function.HasField("description")


def test_generate_tokenize_and_inspect_requests() -> None:
    g = generate_request([1, 2], stream=True, max_new_tokens=4, n=2, rid="r")
    assert list(g.input_ids) == [1, 2] and g.stream and g.sampling_params.max_new_tokens == 4 and g.rid == "r"
    with pytest.raises(TypeError, match="unknown sampling params"):
        generate_request([1], max_tokens=4)  # SGLang's names here
    assert tokenize_request("hi", model="m").prompt == "hi"
    assert tokenize_request(messages=[user("hi")]).messages[0].content == "hi"
    assert inspect_request("hi", pool="prefill").text == "hi"
    assert list(inspect_request([1, 2]).token_ids.ids) == [1, 2]
    assert inspect_request(messages=[user("x")]).messages.messages[0].content == "x"


def test_response_requests_from_the_http_apis_dicts() -> None:
    req = response_request(
        [{"role": "user", "content": "hi"}], model="m", tools=[{"type": "function", "name": "f"}],
        text={"format": {"type": "text"}}, tool_choice={"name": "f"}, metadata={"k": "v"}, include=["reasoning"],
        previous_response_id="resp_1",
    )
    assert req.input_items.items[0]["content"] == "hi" and req.tools[0]["name"] == "f"
    assert req.tool_choice.function_name == "f" and dict(req.metadata) == {"k": "v"} and list(req.include) == ["reasoning"]
    assert req.previous_response_id == "resp_1" and req.text["format"]["type"] == "text"
    assert response_request("hi", tool_choice="required").tool_choice.mode == "required"
    assert _fields({"response_metadata": {"a": "b"}, "model": "m"}) == {"metadata": {"a": "b"}, "model": "m"}


def test_auth_metadata_and_errors_with_the_gateways_fields() -> None:
    assert _auth("k", [("x-request-id", "r")]) == (("x-request-id", "r"), ("authorization", "Bearer k"))
    assert _auth(None, []) == ()
    trailers = aio.Metadata(("x-error-type", "rate_limit_error"), ("x-error-code", "queue_full"),
                            ("x-error-param", "model"), ("retry-after", "2"))
    rpc = aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, aio.Metadata(), trailers, details="busy")
    err = GatewayRpcError(rpc)
    assert (err.code, err.details, err.type, err.error_code, err.param, err.retry_after) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", "rate_limit_error", "queue_full", "model", 2.0)
    assert str(err) == "RESOURCE_EXHAUSTED: busy"
    bare = GatewayRpcError(aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, aio.Metadata(), aio.Metadata()))
    assert bare.details == "" and bare.type is None and bare.retry_after is None


async def test_a_caller_that_leaves_a_stream_early_stops_the_gateways_work() -> None:
    from tests.fake_transport import HANG, chunk, settle
    from tests.server.grpc.grpc_gateway import grpc_gateway

    async with grpc_gateway() as (state, server):
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        worker.script(chunk([9707]), HANG)
        async with GatewayClient(server.target, metadata=[("x-request-id", "early-1")]) as client:
            stream = client.stream_chat([user("hi")], max_tokens=50)
            async for first in stream:
                assert first.choices[0].delta.content in ("", "Hello")
                if first.choices[0].delta.content:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        # The cancel crosses a real gRPC channel: wait for it by the clock (bounded), not
        # by a count of loop turns, which a busy host can run through before it lands.
        deadline = asyncio.get_running_loop().time() + 10
        while not (worker.calls[-1].cancelled or worker.aborts) and asyncio.get_running_loop().time() < deadline:
            await settle()
            await asyncio.sleep(0.01)
        assert worker.calls[-1].cancelled or worker.aborts
