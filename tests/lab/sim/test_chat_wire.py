"""The simulated worker's chat route, its pure parts: the body it turns a chat into and
the chat objects it makes of the completions route's answers."""

from __future__ import annotations

from typing import Any

import pytest

from gateway_lab.sim.chat_wire import ChatShape, completion_body
from gateway_lab.sim.http_wire import BadBody


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    if any(m.get("role") == "robot" for m in messages):
        raise ValueError("unknown role robot")  # what a template's raise_exception raises
    return "|".join(f"{m['role']}:{m['content']}" for m in messages) + (f"|tools:{len(tools)}" if tools else "")


def test_a_chat_body_becomes_a_text_completion_with_the_same_sampling() -> None:
    body = {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "max_tokens": 9,
        "temperature": 0.5, "n": 2, "stream": True, "stream_options": {"include_usage": True}, "tools": [{}],
        "logit_bias": {"1": 2},  # not a completions field the simulator reads: dropped
    }  # fmt: skip
    out = completion_body(body, _render)
    assert out == {
        "prompt": "user:hi|tools:1", "max_tokens": 5, "temperature": 0.5, "n": 2, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    assert completion_body({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}, _render)["max_tokens"] == 3


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "JSON object"),
        ({"messages": []}, "non-empty list"),
        ({"messages": ["hi"]}, "non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools must be a list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "could not render these messages: unknown role robot"),
    ],
)
def test_what_sglang_refuses_is_a_bad_body(body: Any, says: str) -> None:
    with pytest.raises(BadBody, match=says):
        completion_body(body, _render)


def _completion(choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "cmpl-abc", "object": "text_completion", "model": "m", "choices": choices, "usage": None}


def test_streamed_objects_become_chunks_and_the_role_comes_once_per_choice() -> None:
    shape = ChatShape(streamed=True)
    first = shape(_completion([{"index": 0, "text": "He", "token_ids": [1], "finish_reason": None, "stop_reason": None}]))
    assert first["id"] == "chatcmpl-abc" and first["object"] == "chat.completion.chunk"
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": "He"}, "finish_reason": None,
                                 "matched_stop": None}]  # fmt: skip
    other = shape(_completion([{"index": 1, "text": "Yo", "token_ids": [2], "finish_reason": None, "stop_reason": None}]))
    assert other["choices"][0]["delta"] == {"role": "assistant", "content": "Yo"}
    last = shape(_completion([{"index": 0, "text": "llo", "token_ids": [3], "finish_reason": "stop", "stop_reason": 151645}]))
    assert last["choices"] == [{"index": 0, "delta": {"content": "llo"}, "finish_reason": "stop", "matched_stop": 151645}]
    usage = shape({**_completion([]), "usage": {"prompt_tokens": 3}})
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3}


def test_a_whole_answer_becomes_one_chat_completion() -> None:
    whole = ChatShape(streamed=False)(_completion([
        {"index": 0, "text": "Hello", "token_ids": [1, 3], "finish_reason": "length", "stop_reason": None},
    ]))  # fmt: skip
    assert whole["object"] == "chat.completion"
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                 "finish_reason": "length", "matched_stop": None}]  # fmt: skip
