"""Responses items -> chat messages, ids, paging, and the history a chain rebuilds."""

from __future__ import annotations

import time

import pytest

from gateway.endpoints.response_history import (
    chat_messages,
    drop_oldest,
    load_history,
    page,
    to_chat,
    with_ids,
)
from gateway.pipeline.store.base import StoredResponse
from gateway.pipeline.store.memory import MemoryStore
from gateway.protocol.errors import InvalidRequestError, NotFoundError
from gateway.protocol.responses_api import ResponsesRequest


def test_items_become_chat_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    msgs = chat_messages("be brief", items)
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[2]["content"] == "ab"
    assert msgs[3]["reasoning_content"] == "hmm" and [c["id"] for c in msgs[3]["tool_calls"]] == ["c1", "c2"]
    assert (msgs[4]["tool_call_id"], msgs[4]["content"]) == ("c1", "one")
    assert "reasoning_content" not in msgs[6]


def test_ids_and_content_parts() -> None:
    out = with_ids([{"type": "message", "role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "c", "output": "o"}])
    assert out[0]["id"].startswith("msg_") and out[0]["content"] == [{"type": "input_text", "text": "x"}]
    assert out[1]["id"].startswith("fco_")


def test_request_options_reach_the_chat_request() -> None:
    req = ResponsesRequest.model_validate({
        "input": "hi", "max_output_tokens": 7, "temperature": 0.2, "top_p": 0.9,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}, "reasoning": {"effort": "low"}, "parallel_tool_calls": False,
    })
    chat = to_chat(req, chat_messages(None, req.input_items()))
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.reasoning_effort) == (7, 0.2, 0.9, "low")
    assert chat.tool_choice_json() == {"type": "function", "function": {"name": "f"}} and not chat.parallel_tool_calls
    off = ResponsesRequest.model_validate({"input": "hi", "reasoning": {"effort": "none"}})
    assert to_chat(off, chat_messages(None, off.input_items())).chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(InvalidRequestError, match="no input"):
        to_chat(ResponsesRequest.model_validate({"input": "", "instructions": "x"}), chat_messages("x", []))
    with pytest.raises(ValueError, match="not supported"):
        ResponsesRequest.model_validate({"input": "x", "tools": [{"type": "file_search"}]})
    with pytest.raises(ValueError, match="cannot be used together"):
        ResponsesRequest.model_validate({"input": "x", "previous_response_id": "r", "conversation": "c"})


def test_page() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    first = page(items, after=None, limit=2, order="asc")
    assert [i["id"] for i in first["data"]] == ["i0", "i1"] and first["has_more"] and first["last_id"] == "i1"
    rest = page(items, after="i3", limit=2, order="asc")
    assert [i["id"] for i in rest["data"]] == ["i4"] and not rest["has_more"]
    assert [i["id"] for i in page(items, after=None, limit=2, order="desc")["data"]] == ["i4", "i3"]


async def test_a_chain_rebuilds_inputs_and_outputs_in_order() -> None:
    store = MemoryStore()
    now = time.time()

    def rec(rid: str, prev: str | None, text: str, ids: list[int]) -> StoredResponse:
        return StoredResponse(
            id=rid, owner="k", created_at=now, previous_response_id=prev,
            input_items=[{"id": f"in_{rid}", "type": "message", "role": "user", "content": f"q{rid}"}],
            body={"output": [{"id": f"out_{rid}", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]},
            output_token_ids={f"out_{rid}": ids},
        )

    await store.put_response(rec("r1", None, "a1", [1]))
    await store.put_response(rec("r2", "r1", "a2", [2]))
    req = ResponsesRequest.model_validate({"input": "q3", "previous_response_id": "r2"})
    history = await load_history(store, "k", req)
    assert [i["id"] for i in history.items] == ["in_r1", "out_r1", "in_r2", "out_r2"]
    assert history.token_ids == {"out_r1": [1], "out_r2": [2]}
    with pytest.raises(NotFoundError):
        await load_history(store, "other-key", req)


def test_text_format_becomes_the_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}})
    chat = to_chat(req, chat_messages(None, req.input_items()))
    assert chat.response_format is not None and chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema is not None and chat.response_format.json_schema.schema_ == schema
    plain = ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "text"}}})
    assert to_chat(plain, chat_messages(None, plain.input_items())).response_format is None
    with pytest.raises(InvalidRequestError, match="json_schema"):
        bad = ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})
        to_chat(bad, chat_messages(None, bad.input_items()))


def test_drop_oldest_keeps_the_system_message_and_the_last_input() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}, {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    assert drop_oldest(msgs)  # the first turn goes whole: no reply or tool result opens the context
    assert [m["content"] for m in msgs] == ["s", "u2"]
    assert not drop_oldest(msgs) and len(msgs) == 2


def test_include_and_truncation_reach_the_chat_request() -> None:
    req = ResponsesRequest(input="x", include=["message.output_text.logprobs"], top_logprobs=2, truncation="auto")
    chat = to_chat(req, chat_messages(None, req.input_items()))
    assert chat.logprobs and chat.top_logprobs == 2
    plain = to_chat(ResponsesRequest(input="x", top_logprobs=2), [{"role": "user", "content": "x"}])
    assert not plain.logprobs  # top_logprobs alone asks for nothing
