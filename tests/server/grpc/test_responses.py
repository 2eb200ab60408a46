"""The Responses calls' framing: a CreateResponseRequest is the HTTP body it stands for,
and a Responses object or event keeps every field in its Struct (the calls themselves
run over a real channel in tests/e2e/grpc/test_responses.py)."""

from __future__ import annotations

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from gateway.proto import gateway_pb2 as gpb
from gateway.protocol.errors import GatewayError
from gateway.protocol.limits import MAX_INPUT_ITEMS
from gateway.protocol.responses_api import ResponsesRequest
from gateway.server.grpc.responses import (
    event_message,
    item_list,
    response_message,
    response_request,
)


def _struct(value: dict[str, object]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def test_a_request_is_the_http_body() -> None:
    request = gpb.CreateResponseRequest(
        model="m", input_items=gpb.InputItems(items=[_struct({"role": "user", "content": "hi", "type": "message"})]),
        tools=[_struct({"type": "function", "name": "f", "parameters": {"type": "object", "maxItems": 3}})],
        tool_choice=gpb.ToolChoice(function_name="f"), reasoning_effort="low", max_output_tokens=7, store=False,
        metadata={"a": "b"}, include=["message.output_text.logprobs"], top_logprobs=0, truncation="auto", seed=9,
    )
    body = response_request(request, stream=True)
    assert body["tools"][0]["parameters"]["maxItems"] == 3 and isinstance(body["tools"][0]["parameters"]["maxItems"], int)
    assert body["tool_choice"] == {"type": "function", "name": "f"} and body["reasoning"] == {"effort": "low"}
    assert body["store"] is False and body["top_logprobs"] == 0 and body["stream"] and "temperature" not in body
    req = ResponsesRequest.model_validate(body)
    assert req.logprobs and req.truncation == "auto" and req.seed == 9 and req.input_items()[0]["content"] == "hi"
    plain = response_request(gpb.CreateResponseRequest(input_text="hi"), stream=False)
    assert plain == {"stream": False, "background": False, "input": "hi"}


def test_a_response_keeps_its_whole_object() -> None:
    body = {"id": "resp_1", "object": "response", "status": "completed", "model": "m", "created_at": 5, "error": None,
            "output": [{"type": "reasoning", "content": []},
                       {"type": "message", "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]}],
            "usage": {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 3,
                      "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 7}}
    out = response_message(body, ["w1"])
    assert out.output_text == "ab" and out.usage.cached_tokens == 2 and out.usage.reasoning_tokens == 1 and out.worker_ids == ["w1"]
    assert MessageToDict(out.body)["error"] is None and out.created_at == 5
    assert not response_message({**body, "usage": None}).HasField("usage")
    delta = event_message({"type": "response.output_text.delta", "sequence_number": 4, "delta": "x", "item_id": "i"})
    assert delta.delta == "x" and delta.sequence_number == 4 and MessageToDict(delta.event)["item_id"] == "i"
    assert event_message({"type": "response.created", "sequence_number": 0}).delta == ""
    page = item_list({"data": [{"id": "a"}], "first_id": "a", "last_id": "a", "has_more": True})
    assert page.has_more and MessageToDict(page.data[0]) == {"id": "a"}


def test_input_items_are_counted_before_any_is_converted() -> None:
    item = Struct()
    item.update({"role": "user", "content": "hi"})
    request = gpb.CreateResponseRequest(model="m")
    request.input_items.items.extend([item] * (MAX_INPUT_ITEMS + 1))
    with pytest.raises(GatewayError, match=f"at most {MAX_INPUT_ITEMS} items") as refused:
        response_request(request, stream=False)
    assert refused.value.status == 400 and refused.value.param == "input"
    del request.input_items.items[-1]
    assert len(response_request(request, stream=False)["input"]) == MAX_INPUT_ITEMS
