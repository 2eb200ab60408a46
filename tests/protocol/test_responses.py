"""``shaped`` and ``usage_dict`` build exactly the dicts (and orjson bytes) of the models' ``to_dict``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.responses import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    Usage,
    shaped,
    usage_dict,
)

_TEXT = st.none() | st.text(max_size=20)
_COUNT = st.integers(min_value=0, max_value=1 << 40)
_FINISH = st.sampled_from([None, "stop", "length", "tool_calls", "content_filter", "abort"])
_STOP = st.none() | st.integers(min_value=-1, max_value=1 << 31) | st.text(max_size=8)
PROPERTY = settings(max_examples=200, deadline=None)


def _same(built: dict[str, Any], model_dict: dict[str, Any]) -> None:
    assert built == model_dict
    assert orjson.dumps(built) == orjson.dumps(model_dict)  # key order too: the bytes on the wire


@PROPERTY
@given(content=_TEXT, reasoning=_TEXT, index=st.integers(0, 8), finish=_FINISH, stop=_STOP)
def test_a_choice_is_the_models_dict(content: str | None, reasoning: str | None, index: int, finish: Any, stop: Any) -> None:
    message = shaped(ChatCompletionMessage, {"content": content, "reasoning_content": reasoning})
    _same(message, ChatCompletionMessage(content=content, reasoning_content=reasoning).to_dict())
    choice = shaped(ChatCompletionChoice, {"index": index, "message": message, "finish_reason": finish, "matched_stop": stop})
    model = ChatCompletionChoice(
        index=index, message=ChatCompletionMessage(content=content, reasoning_content=reasoning),
        finish_reason=finish, matched_stop=stop,
    )
    _same(choice, model.to_dict())


@PROPERTY
@given(prompt=_COUNT, completion=_COUNT, cached=st.none() | _COUNT, reasoning=st.none() | _COUNT)
def test_usage_is_the_models_dict(prompt: int, completion: int, cached: int | None, reasoning: int | None) -> None:
    expected = Usage.build(prompt, completion, cached_tokens=cached, reasoning_tokens=reasoning).to_dict()
    _same(usage_dict(prompt, completion, cached_tokens=cached, reasoning_tokens=reasoning), expected)


def test_usage_that_needs_conversion_goes_through_the_model() -> None:
    assert usage_dict(True, 2) == Usage.build(True, 2).to_dict()  # type: ignore[arg-type]


@PROPERTY
@given(
    rid=st.text(min_size=1, max_size=12), created=_COUNT, model=st.text(max_size=12),
    n=st.integers(0, 3), content=_TEXT, usage=st.booleans(),
)
def test_a_response_is_the_models_dict(rid: str, created: int, model: str, n: int, content: str | None, usage: bool) -> None:
    messages = [ChatCompletionMessage(content=content) for _ in range(n)]
    choices = [ChatCompletionChoice(index=i, message=m, finish_reason="stop") for i, m in enumerate(messages)]
    expected = ChatCompletionResponse(
        id=rid, created=created, model=model, choices=choices, usage=Usage.build(3, 4) if usage else None
    ).to_dict()
    built = shaped(ChatCompletionResponse, {
        "id": rid, "created": created, "model": model,
        "choices": [shaped(ChatCompletionChoice, {"index": i, "message": shaped(ChatCompletionMessage, {"content": content}),
                                                  "finish_reason": "stop"}) for i in range(n)],
        "usage": usage_dict(3, 4) if usage else None,
    })
    _same(built, expected)


def test_a_missing_required_field_is_refused() -> None:
    with pytest.raises(TypeError, match="model is required"):
        shaped(ChatCompletionResponse, {"choices": []})


def test_defaults_and_factories_are_the_models() -> None:
    built = shaped(ChatCompletionResponse, {"model": "m", "choices": []})
    assert built["object"] == "chat.completion" and built["id"].startswith("chatcmpl-")
    assert isinstance(built["created"], int)


def test_the_chat_answers_shapes_are_made_at_import_and_other_models_on_first_use() -> None:
    from gateway.protocol import responses
    from gateway.protocol.responses import (
        CompletionChoice,
        CompletionTokensDetails,
        PromptTokensDetails,
    )

    assert {Usage, PromptTokensDetails, CompletionTokensDetails, ChatCompletionMessage, ChatCompletionChoice,
            ChatCompletionResponse} <= responses._SHAPERS.keys()
    built = shaped(CompletionChoice, {"index": 1, "text": "t"})
    assert CompletionChoice in responses._SHAPERS
    _same(built, CompletionChoice(index=1, text="t").to_dict())


@PROPERTY
@given(values=st.dictionaries(st.sampled_from(["role", "content", "reasoning_content", "tool_calls", "other"]), _TEXT, max_size=4))
def test_a_message_of_any_given_fields_is_the_models_dict(values: dict[str, Any]) -> None:
    values.pop("tool_calls", None)
    values.pop("other", None)
    if "role" in values:
        values["role"] = "assistant"  # the one value the model holds
    model = ChatCompletionMessage(**values)
    _same(shaped(ChatCompletionMessage, values), model.to_dict())
