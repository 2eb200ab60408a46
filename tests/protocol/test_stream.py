"""Typed stream events (``protocol/stream.py``): the bytes built directly for the relay's
common chunk are exactly what serializing the event's dict gives."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol.responses import CompletionLogprobs
from gateway.protocol.stream import (
    CHAT_CHUNK,
    TEXT_COMPLETION,
    ChatDelta,
    CompletionDelta,
    StreamChunk,
    StreamHead,
    StreamUsage,
    ToolCallFragment,
    text_events,
)

texts = st.text()  # any unicode: quotes, escapes, control characters, surrogates excluded by hypothesis
maybe_text = st.none() | texts
indexes = st.integers(min_value=0, max_value=10_000)
finish = st.none() | st.sampled_from(["stop", "length", "tool_calls", "abort"])
matched = st.none() | st.integers(min_value=0, max_value=200_000) | texts


def _head(kind: str) -> StreamHead:
    return StreamHead('cmpl-"x"\\', kind, 1_700_000_000, "model/ü")


@given(index=indexes, text=texts, finish_reason=finish, matched_stop=matched)
def test_completion_choice_bytes_equal_its_dict(index: int, text: str, finish_reason: str | None, matched_stop: int | str | None) -> None:
    choice = CompletionDelta(index, text, None, finish_reason, matched_stop)
    assert choice.to_json() == orjson.dumps(choice.to_dict())
    chunk = StreamChunk(_head(TEXT_COMPLETION), [choice])
    assert orjson.loads(chunk.to_json()) == {
        "id": 'cmpl-"x"\\', "object": TEXT_COMPLETION, "created": 1_700_000_000, "model": "model/ü",
        "choices": [choice.to_dict()],
    }  # fmt: skip


def test_completion_choice_with_logprobs_takes_the_dict_path() -> None:
    lp = CompletionLogprobs(tokens=["a"], token_logprobs=[-0.5], top_logprobs=None, text_offset=[0])
    choice = CompletionDelta(0, "a", lp, None)
    assert choice.to_json() == orjson.dumps(choice.to_dict())
    assert orjson.loads(choice.to_json())["logprobs"]["tokens"] == ["a"]


@given(
    index=indexes, role=st.none() | st.just("assistant"), content=maybe_text, reasoning=maybe_text,
    finish_reason=finish, final=st.booleans(), matched_stop=matched, with_tool=st.booleans(),
)  # fmt: skip
def test_chat_choice_bytes_equal_its_dict(
    index: int, role: str | None, content: str | None, reasoning: str | None, finish_reason: str | None,
    final: bool, matched_stop: int | str | None, with_tool: bool,
) -> None:
    tools = [ToolCallFragment(0, '{"a":', "call_1", "f")] if with_tool else None
    choice = ChatDelta(index, role, content, reasoning, tools, None, finish_reason, final, matched_stop)
    assert choice.to_json() == orjson.dumps(choice.to_dict())


@given(content=texts)
def test_chat_chunk_of_one_content_delta(content: str) -> None:
    chunk = StreamChunk(_head(CHAT_CHUNK), [ChatDelta(3, content=content)])
    assert chunk.to_dict()["choices"] == [{"index": 3, "delta": {"content": content}, "logprobs": None, "finish_reason": None}]
    assert chunk.to_json().startswith(_head(CHAT_CHUNK).prefix + b'[{"index":3,"delta":{"content":')


def test_usage_and_several_choices_keep_their_shape() -> None:
    head = _head(TEXT_COMPLETION)
    two = StreamChunk(head, [CompletionDelta(0, "a"), CompletionDelta(1, "b", finish_reason="stop", matched_stop="x")])
    assert [c["index"] for c in two.to_dict()["choices"]] == [0, 1]
    assert two.to_dict()["choices"][1]["matched_stop"] == "x"
    usage = StreamChunk(head, [], StreamUsage(5, 7, cached_tokens=2))
    assert usage.to_dict()["usage"] == {
        "prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 2},
    }  # fmt: skip
    assert usage.to_dict()["choices"] == []


@pytest.mark.parametrize("batch", [[" one"], [" one", " two", ""], ['quo"te\\', "\u2028", "你好🙂"]])
def test_a_batch_of_texts_is_one_event_of_their_joined_text(batch: list[str]) -> None:
    head = StreamHead("chatcmpl-x", "chat.completion.chunk", 7, 'mo"del')
    whole = StreamChunk(head, [ChatDelta(0, content="".join(batch))])
    framed = text_events(head, lambda text: ChatDelta(0, content=text), (b"data: ", b"\n\n"))(batch)
    assert framed == b"data: " + whole.to_json() + b"\n\n"
    typed = text_events(head, lambda text: CompletionDelta(0, text), None)(batch)
    assert isinstance(typed, StreamChunk) and typed.to_dict()["choices"][0]["text"] == "".join(batch)
