"""OpenAI Responses over token_gateway.v1 on a real gRPC channel: the same calls as the
HTTP door's, through the same entry, against simulated workers; what one door stores
the other reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from tests.e2e.grpc.conftest import GrpcStack


def _scripted(text: str) -> str:
    return f"please answer <<sim-reply>>{text}<</sim-reply>>"


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


@pytest.fixture
async def stub(gstack: GrpcStack) -> AsyncIterator[gpb_grpc.TokenGatewayStub]:
    async with aio.insecure_channel(gstack.target) as channel:
        yield gpb_grpc.TokenGatewayStub(channel)


async def test_create_get_list_delete(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    resp = await stub.CreateResponse(gpb.CreateResponseRequest(
        model=gstack.model, input_text=_scripted("Hello over gRPC."), instructions="Be brief.", max_output_tokens=40,
        metadata={"k": "v"},
    ))
    assert resp.status == "completed" and resp.id.startswith("resp_") and resp.output_text == "Hello over gRPC."
    assert resp.HasField("usage") and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0 and resp.worker_ids
    body = MessageToDict(resp.body)
    assert body["object"] == "response" and body["metadata"] == {"k": "v"} and body["instructions"] == "Be brief."
    # the HTTP door reads what the gRPC door stored, and the other way round
    http = await gstack.http.client.responses.retrieve(resp.id)
    assert http.output_text == "Hello over gRPC." and http.usage is not None and http.usage.output_tokens == resp.usage.output_tokens
    follow = await gstack.http.client.responses.create(model=gstack.model, input=_scripted("And HTTP."), previous_response_id=resp.id)
    got = await stub.GetResponse(gpb.ResponseRef(response_id=follow.id))
    assert got.output_text == "And HTTP." and MessageToDict(got.body)["previous_response_id"] == resp.id
    items = await stub.ListResponseInputItems(gpb.ListInputItemsRequest(response_id=resp.id, order="asc"))
    assert [MessageToDict(i)["type"] for i in items.data] == ["message"] and not items.has_more and items.first_id
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.ListResponseInputItems(gpb.ListInputItemsRequest(response_id=resp.id, limit=500))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and dict(bad.value.trailing_metadata() or ())["x-error-param"] == "limit"
    with pytest.raises(grpc.aio.AioRpcError) as finished:
        await stub.CancelResponse(gpb.ResponseRef(response_id=resp.id))
    assert finished.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    deleted = await stub.DeleteResponse(gpb.ResponseRef(response_id=resp.id))
    assert deleted.deleted and deleted.id == resp.id
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.GetResponse(gpb.ResponseRef(response_id=resp.id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_stream_matches_the_http_stream(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    request = gpb.CreateResponseRequest(model=gstack.model, input_text=_scripted("Streamed over gRPC."),
                                        include=["message.output_text.logprobs"], top_logprobs=2)
    events = [e async for e in stub.StreamResponse(request)]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Streamed over gRPC."
    last = MessageToDict(events[-1].event)["response"]
    assert last["output"][0]["content"][0]["logprobs"] and last["status"] == "completed"
    http = [e async for e in await gstack.http.client.responses.create(
        model=gstack.model, input=_scripted("Streamed over gRPC."), stream=True,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )]
    assert [e.type for e in http] == kinds  # one path: the same event sequence through both doors
    stored = await stub.GetResponse(gpb.ResponseRef(response_id=last["id"]))
    assert stored.output_text == "Streamed over gRPC."


async def test_items_tools_and_bad_requests(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tool = _struct({"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
    items = gpb.InputItems(items=[_struct({"type": "message", "role": "user", "content": _scripted(call)})])
    resp = await stub.CreateResponse(gpb.CreateResponseRequest(
        model=gstack.model, input_items=items, tools=[tool], tool_choice=gpb.ToolChoice(mode="auto"), max_output_tokens=80,
    ))
    output = MessageToDict(resp.body)["output"]
    assert [o["type"] for o in output] == ["function_call"] and output[0]["name"] == "get_weather"
    for request, param in (
        (gpb.CreateResponseRequest(model=gstack.model, input_text="x", include=["reasoning.encrypted_content"]), "include"),
        (gpb.CreateResponseRequest(model=gstack.model, input_text="x", truncation="middle"), "truncation"),
        (gpb.CreateResponseRequest(model=gstack.model, input_text="x", tools=[_struct({"type": "web_search"})]), "tools.[0].type"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.CreateResponse(request)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(bad.value.trailing_metadata() or ())["x-error-param"] == param
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.CreateResponse(gpb.CreateResponseRequest(model=gstack.model, input_text="x", previous_response_id="resp_missing"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_background_run_and_replay(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    first = await stub.CreateResponse(gpb.CreateResponseRequest(
        model=gstack.model, input_text=_scripted("In the background."), background=True,
    ))
    assert first.status == "in_progress" and not first.HasField("usage")
    events = [e async for e in stub.StreamStoredResponse(gpb.StreamStoredResponseRequest(response_id=first.id))]
    assert events[-1].type == "response.completed" and [e.sequence_number for e in events] == list(range(len(events)))
    cut = 3
    rest = [e async for e in stub.StreamStoredResponse(gpb.StreamStoredResponseRequest(response_id=first.id, starting_after=cut))]
    assert [e.sequence_number for e in rest] == list(range(cut + 1, len(events)))
    assert (await stub.GetResponse(gpb.ResponseRef(response_id=first.id))).output_text == "In the background."
    assert gstack.http.state.admission.in_flight == 0


@pytest.mark.stack(workers=1, sim={"decode_seq_s": 0.002, "time_scale": 1.0, "eos_probability": 0.0})
async def test_a_cancelled_stream_cancels_the_response(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    call = stub.StreamResponse(gpb.CreateResponseRequest(model=gstack.model, input_text="A long story.", max_output_tokens=4000))
    response_id, deltas = "", 0
    async for event in call:
        if event.type == "response.created":
            response_id = MessageToDict(event.event)["response"]["id"]
        deltas += event.type == "response.output_text.delta"
        if deltas == 3:
            break
    call.cancel()
    status = ""
    for _ in range(100):
        status = (await stub.GetResponse(gpb.ResponseRef(response_id=response_id))).status
        if status != "in_progress" and gstack.http.state.admission.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert status == "cancelled" and gstack.http.state.admission.in_flight == 0
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())
    assert gstack.http.fleet.workers[0].counters.aborted >= 1


async def test_conversations_over_grpc_and_http(gstack: GrpcStack, stub: gpb_grpc.TokenGatewayStub) -> None:
    first = _struct({"type": "message", "role": "user", "content": "Remember the number 7."})
    conv = await stub.CreateConversation(gpb.CreateConversationRequest(items=[first], metadata={"topic": "numbers"}))
    assert conv.id.startswith("conv_") and dict(conv.metadata) == {"topic": "numbers"}
    http = await gstack.http.client.conversations.retrieve(conv.id)  # the HTTP door sees what gRPC stored
    assert http.metadata == {"topic": "numbers"}
    resp = await stub.CreateResponse(gpb.CreateResponseRequest(model=gstack.model, input_text=_scripted("Seven."), conversation=conv.id))
    assert resp.output_text == "Seven."
    items = await stub.ListConversationItems(gpb.ListConversationItemsRequest(conversation_id=conv.id, order="asc"))
    kinds = [(MessageToDict(i)["type"], MessageToDict(i).get("role")) for i in items.data]
    assert kinds == [("message", "user"), ("message", "user"), ("message", "assistant")] and not items.has_more
    added = await stub.AddConversationItems(gpb.AddConversationItemsRequest(
        conversation_id=conv.id, items=[_struct({"type": "message", "role": "user", "content": "And 8."})]))
    new_id = MessageToDict(added.data[0])["id"]
    got = await stub.GetConversationItem(gpb.ConversationItemRef(conversation_id=conv.id, item_id=new_id))
    assert MessageToDict(got.item)["content"] == [{"type": "input_text", "text": "And 8."}]  # stored as OpenAI does
    assert (await stub.DeleteConversationItem(gpb.ConversationItemRef(conversation_id=conv.id, item_id=new_id))).id == conv.id
    updated = await stub.UpdateConversation(gpb.UpdateConversationRequest(conversation_id=conv.id, metadata={"topic": "done"}))
    assert dict(updated.metadata) == {"topic": "done"}
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.AddConversationItems(gpb.AddConversationItemsRequest(conversation_id=conv.id))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # at least one item, as on HTTP
    assert (await stub.DeleteConversation(gpb.ConversationRef(conversation_id=conv.id))).deleted
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.GetConversation(gpb.ConversationRef(conversation_id=conv.id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_typed_client_chains_streams_and_replays(gstack: GrpcStack) -> None:
    client = gstack.client
    first = await client.create_response(_scripted("One."), model=gstack.model, instructions="Be brief.", response_metadata={"n": "1"})
    second = await client.create_response(_scripted("Two."), model=gstack.model, previous_response_id=first.id,
                                          tools=[{"type": "function", "name": "f"}], tool_choice="none")
    assert (first.output_text, second.output_text) == ("One.", "Two.") and MessageToDict(first.body)["metadata"] == {"n": "1"}
    body = MessageToDict(second.body)
    assert body["previous_response_id"] == first.id and body["tools"][0]["name"] == "f" and body["tool_choice"] == "none"
    events = [e async for e in client.stream_response(_scripted("Three."), model=gstack.model, previous_response_id=second.id)]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Three."
    items = await client.list_response_input_items(first.id, order="asc", limit=5)
    assert len(items.data) == 1
    bg = await client.create_response(_scripted("Later."), model=gstack.model, background=True)
    replayed = [e async for e in client.stream_stored_response(bg.id, starting_after=1)]
    assert replayed[0].sequence_number == 2 and replayed[-1].type == "response.completed"
    assert (await client.get_response(bg.id)).output_text == "Later."
    assert await client.delete_response(first.id)
