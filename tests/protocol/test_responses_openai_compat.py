"""Our response dicts parse as the official ``openai`` SDK's types and round-trip the values."""

from __future__ import annotations

import json

import orjson
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    EmbeddingResponse,
    FunctionCall,
    GenerateMetaInfo,
    GenerateResponse,
    ModelCard,
    ModelList,
    ToolCall,
    Usage,
    chat_logprobs,
    completion_logprobs,
    decode_embedding_base64,
    generate_finish_reason,
    openai_finish_reason,
)
from gateway.protocol.stream import (
    CHAT_CHUNK,
    TEXT_COMPLETION,
    ChatDelta,
    CompletionDelta,
    StreamChunk,
    StreamHead,
    StreamUsage,
    ToolCallFragment,
)

PIECES = {1: "Hel", 2: "lo", 3: "!", 4: " world", 5: "é"}


def piece(token_id: int) -> str:
    return PIECES[token_id]


def wire(obj: dict) -> dict:
    """What a client receives: the dict through orjson and back."""
    return json.loads(orjson.dumps(obj))


def test_chat_completion_with_reasoning_logprobs_usage() -> None:
    resp = ChatCompletionResponse(
        model="qwen3",
        choices=[
            ChatCompletionChoice(
                index=0,
                message=ChatCompletionMessage(content="Hello!", reasoning_content="greet"),
                logprobs=chat_logprobs(
                    [1, 2, 3],
                    [-0.1, -0.2, -0.3],
                    [[(1, -0.1), (4, -2.5)], [(2, -0.2)], None],
                    piece,
                ),
                finish_reason="stop",
                matched_stop=151645,
            )
        ],
        usage=Usage.build(10, 3, cached_tokens=8, reasoning_tokens=1),
    )
    data = wire(resp.to_dict())
    parsed = ChatCompletion.model_validate(data)
    choice = parsed.choices[0]
    assert choice.message.content == "Hello!"
    assert choice.message.model_extra == {"reasoning_content": "greet"}
    assert choice.model_extra == {"matched_stop": 151645}
    assert choice.logprobs is not None and choice.logprobs.content is not None
    first = choice.logprobs.content[0]
    assert first.token == "Hel" and first.bytes == list(b"Hel")
    assert [t.token for t in first.top_logprobs] == ["Hel", " world"]
    assert choice.logprobs.content[2].top_logprobs == []
    assert parsed.usage is not None
    assert parsed.usage.total_tokens == 13
    assert parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.prompt_tokens_details.cached_tokens == 8
    assert parsed.usage.completion_tokens_details is not None
    assert parsed.usage.completion_tokens_details.reasoning_tokens == 1
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"


def test_chat_completion_with_tool_calls_keeps_null_content() -> None:
    resp = ChatCompletionResponse(
        model="m",
        choices=[
            ChatCompletionChoice(
                index=0,
                message=ChatCompletionMessage(
                    content=None,
                    tool_calls=[
                        ToolCall(
                            id="call_a", function=FunctionCall(name="f", arguments='{"x": 1}')
                        ),
                        ToolCall(id="call_b", function=FunctionCall(name="g", arguments="{}")),
                    ],
                ),
                finish_reason=openai_finish_reason("stop", tool_calls=True),
            )
        ],
        usage=Usage.build(3, 9),
    )
    data = wire(resp.to_dict())
    message = data["choices"][0]["message"]
    assert message["content"] is None and "reasoning_content" not in message
    assert data["choices"][0]["logprobs"] is None
    assert "prompt_tokens_details" not in data["usage"]
    parsed = ChatCompletion.model_validate(data)
    assert parsed.choices[0].finish_reason == "tool_calls"
    calls = parsed.choices[0].message.tool_calls
    assert calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("call_a", "f", '{"x": 1}'),
        ("call_b", "g", "{}"),
    ]


def test_chunks_role_content_tool_deltas_and_usage_chunk() -> None:
    head = StreamHead("chatcmpl-1", CHAT_CHUNK, 1700000000, "m")
    chunks = [
        StreamChunk(head, [ChatDelta(0, role="assistant", content="")]),
        StreamChunk(head, [ChatDelta(0, reasoning_content="hmm")]),
        StreamChunk(
            head,
            [
                ChatDelta(
                    0,
                    tool_calls=[ToolCallFragment(0, "", id="call_x", name="f")],
                    logprobs=chat_logprobs([1], [-0.5], None, piece),
                )
            ],
        ),
        StreamChunk(head, [ChatDelta(0, tool_calls=[ToolCallFragment(0, '{"x": 1}')])]),
        StreamChunk(head, [ChatDelta(0, finish_reason="tool_calls", final=True)]),
        StreamChunk(head, [], StreamUsage(4, 5, cached_tokens=0)),
    ]
    assert [c.to_json() for c in chunks] == [orjson.dumps(c.to_dict()) for c in chunks]
    dicts = [wire(c.to_dict()) for c in chunks]
    assert dicts[0]["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    assert dicts[4]["choices"][0]["delta"] == {}
    assert dicts[4]["choices"][0]["matched_stop"] is None and "matched_stop" not in dicts[1]["choices"][0]
    assert "usage" not in dicts[0] and dicts[0]["object"] == "chat.completion.chunk"
    parsed = [ChatCompletionChunk.model_validate(d) for d in dicts]
    assert parsed[1].choices[0].delta.model_extra == {"reasoning_content": "hmm"}
    args = "".join(
        tc.function.arguments or ""
        for p in parsed
        for ch in p.choices
        for tc in ch.delta.tool_calls or []
        if tc.function is not None
    )
    assert args == '{"x": 1}'
    first_call = parsed[2].choices[0].delta.tool_calls
    assert first_call is not None and first_call[0].id == "call_x" and first_call[0].index == 0
    assert parsed[4].choices[0].finish_reason == "tool_calls"
    assert parsed[5].usage is not None and parsed[5].usage.prompt_tokens_details is not None
    assert parsed[5].usage.prompt_tokens_details.cached_tokens == 0


def test_text_completion_with_logprobs() -> None:
    lp = completion_logprobs([1, 2], [-0.1, -0.2], [[(1, -0.1), (5, -3.0)], [(2, -0.2)]], piece)
    resp = CompletionResponse(
        model="m",
        choices=[CompletionChoice(index=0, text="Hello", logprobs=lp, finish_reason="length")],
        usage=Usage.build(2, 2),
    )
    data = wire(resp.to_dict())
    parsed = Completion.model_validate(data)
    assert parsed.object == "text_completion" and parsed.id.startswith("cmpl-")
    logprobs = parsed.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["Hel", "lo"]
    assert logprobs.text_offset == [0, 3]
    assert logprobs.top_logprobs == [{"Hel": -0.1, "é": -3.0}, {"lo": -0.2}]
    assert parsed.choices[0].finish_reason == "length"


def test_echo_logprobs_first_prompt_token_is_null_like_openai() -> None:
    lp = completion_logprobs(
        [1, 2, 3], [None, -0.2, -0.3], [None, [(2, -0.2)], [(3, -0.3)]], piece, text_offset=0
    )
    data = wire(lp.to_dict())
    assert data["token_logprobs"] == [None, -0.2, -0.3]
    assert data["top_logprobs"][0] is None
    assert data["text_offset"] == [0, 3, 5]


def test_streamed_completion_chunks_are_text_completions() -> None:
    # Mid-stream chunks carry finish_reason null exactly as OpenAI streams them (the
    # SDK's type says non-null but the SDK does not validate streamed events); the
    # last chunk is a fully valid Completion.
    head = StreamHead("cmpl-1", TEXT_COMPLETION, 1700000000, "m")
    data = wire(StreamChunk(head, [CompletionDelta(0, "He")]).to_dict())
    assert data["object"] == "text_completion"
    assert data["choices"][0] == {"index": 0, "text": "He", "logprobs": None, "finish_reason": None}
    last = StreamChunk(head, [CompletionDelta(0, "llo", finish_reason="stop", matched_stop="\n")])
    parsed = Completion.model_validate(wire(last.to_dict()))
    assert parsed.choices[0].text == "llo" and parsed.choices[0].model_extra == {
        "matched_stop": "\n"
    }
    lp = completion_logprobs([1, 2], [-0.1, -0.2], [[(1, -0.1)], [(2, -0.2)]], piece, text_offset=4)
    usage = StreamUsage(2, 2, cached_tokens=1)
    with_lp = Completion.model_validate(wire(StreamChunk(head, [CompletionDelta(0, "Hello", lp, "length", None)], usage).to_dict()))
    assert with_lp.choices[0].logprobs is not None and with_lp.choices[0].logprobs.text_offset == [4, 7]
    assert with_lp.usage is not None and with_lp.usage.total_tokens == 4


def test_embeddings_float_and_base64() -> None:
    vectors = [[0.5, -1.25, 3.0], [0.0, 1.0, 2.0]]
    floats = EmbeddingResponse.build(vectors, model="e", prompt_tokens=7)
    parsed = CreateEmbeddingResponse.model_validate(wire(floats.to_dict()))
    assert parsed.data[1].embedding == [0.0, 1.0, 2.0] and parsed.usage.total_tokens == 7
    packed = EmbeddingResponse.build(vectors, model="e", prompt_tokens=7, encoding_format="base64")
    first = wire(packed.to_dict())["data"][0]["embedding"]
    assert isinstance(first, str) and decode_embedding_base64(first) == [0.5, -1.25, 3.0]


def test_models_list() -> None:
    data = wire(ModelList(data=[ModelCard(id="qwen3", max_model_len=4096)]).to_dict())
    assert data["object"] == "list"
    assert data["data"][0]["id"] == "qwen3" and data["data"][0]["object"] == "model"
    assert data["data"][0]["owned_by"] == "token-gateway"


def test_finish_reason_mapping() -> None:
    assert openai_finish_reason("stop") == "stop"
    assert openai_finish_reason("stop", tool_calls=True) == "tool_calls"
    assert openai_finish_reason("length", tool_calls=True) == "length"
    assert openai_finish_reason("abort") == "abort"
    assert openai_finish_reason(None) is None and openai_finish_reason("") is None


def test_generate_response_shape_like_sglang() -> None:
    resp = GenerateResponse(
        text="Hello",
        output_ids=[1, 2],
        meta_info=GenerateMetaInfo(
            id="rid-1",
            finish_reason=generate_finish_reason(
                "stop", completion_tokens=2, matched_token_id=151645
            ),
            prompt_tokens=5,
            completion_tokens=2,
            cached_tokens=4,
        ),
    )
    data = wire(resp.to_dict())
    assert data == {
        "text": "Hello",
        "output_ids": [1, 2],
        "meta_info": {
            "id": "rid-1",
            "finish_reason": {"type": "stop", "matched": 151645},
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "cached_tokens": 4,
        },
    }
    assert generate_finish_reason("stop", completion_tokens=1, matched_stop_str="###") is not None
    length = generate_finish_reason("length", completion_tokens=9)
    assert length is not None and length.model_dump(exclude_none=True) == {
        "type": "length",
        "length": 9,
    }
    abort = generate_finish_reason("abort", completion_tokens=0, message="client gone")
    assert abort is not None and abort.message == "client gone"
    assert generate_finish_reason(None, completion_tokens=0) is None
