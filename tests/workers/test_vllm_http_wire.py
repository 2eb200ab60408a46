"""vLLM's OpenAI completion shapes <-> the seam's messages."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http_wire import AnswerError
from gateway.workers.vllm_http_wire import (
    CompletionStreamReader,
    completion_body,
    embedding_body,
    embedding_reply,
    whole_completion,
    without_prompt_ids,
)


def chunk(ids: list[int], finish: str | None = None, stop: Any = None, index: int = 0, **usage: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"choices": [{"index": index, "text": "", "token_ids": ids, "finish_reason": finish,
                                        "stop_reason": stop}]}
    if usage:
        out["usage"] = usage
    return out


def test_the_body_is_a_token_id_prompt_asking_for_token_ids() -> None:
    custom = struct_pb2.Struct()
    custom.update({"seed": 5})
    request = pb.GenerateRequest(
        request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]), stream=True, return_logprob=True,
        top_logprobs_num=2,
        sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=9, stop_token_ids=[7],
                                          json_schema="{}", custom_params=custom),
    )
    body = completion_body(request, "served")
    assert body["model"] == "served" and body["prompt"].tolist() == [1, 2, 3] and body["return_token_ids"] is True
    assert body["max_tokens"] == 9 and body["stop_token_ids"] == [7] and body["seed"] == 5
    assert body["top_p"] == 1.0 and body["top_k"] == -1 and body["repetition_penalty"] == 1.0
    assert body["stream_options"] == {"include_usage": True}  # usage once, at the end: chunks stay short
    assert body["structured_outputs"] == {"json": "{}"}
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    request.top_logprobs_num = 0  # a chat's logprobs with no top_logprobs: as vLLM's chat route asks
    assert completion_body(request, "served")["logprobs"] == 0


def test_a_request_with_no_cap_is_sent_the_room_its_prompt_leaves() -> None:
    """vLLM's /v1/completions reads a missing (or null) max_tokens as 16, its legacy default;
    its chat route and gRPC servicer run such a request to the end of the context."""
    request = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
                                 sampling_params=pb.SamplingParams(temperature=1.0, n=1))
    assert completion_body(request, "served", 100)["max_tokens"] == 97
    assert "max_tokens" not in completion_body(request, "served")  # context unknown: the server's own default
    request.sampling_params.max_new_tokens = 5
    assert completion_body(request, "served", 100)["max_tokens"] == 5


def test_streamed_deltas_become_chunks_and_the_finish_a_complete() -> None:
    reader = CompletionStreamReader("r")
    first = chunk([10])
    first["choices"][0]["prompt_token_ids"] = [1, 2, 3, 4, 5]
    closing = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                        "prompt_tokens_details": {"cached_tokens": 4}}}
    out = [*reader.feed(first), *reader.feed(chunk([11, 12], "stop", 12))]
    assert [list(m.chunk.token_ids) for m in out] == [[10]]  # the finishing chunk waits for the counts
    assert out[0].chunk.completion_tokens == 1 and out[0].chunk.prompt_tokens == 5
    last, done = reader.feed(closing)
    assert list(last.chunk.token_ids) == [11, 12] and last.chunk.completion_tokens == 3 and last.chunk.cached_tokens == 4
    assert done.complete.finish_reason == "stop" and done.complete.matched_token_id == 12
    assert done.complete.completion_tokens == 3 and list(done.complete.output_ids) == [11, 12]
    assert (done.complete.prompt_tokens, done.complete.cached_tokens) == (5, 4) and reader.started
    assert list(reader.close()) == []


def test_cached_tokens_come_only_with_the_closing_usage_chunk() -> None:
    """vLLM's per-chunk usage (continuous_usage_stats) has no prompt_tokens_details: the
    cached count a worker reports must be read from the last chunk, not from the finish."""
    reader = CompletionStreamReader("r")
    per_chunk = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    assert [m.chunk.cached_tokens for m in reader.feed(chunk([9], **per_chunk))] == [0]
    assert list(reader.feed(chunk([10], "length", **per_chunk))) == []
    last, done = reader.feed({"choices": [], "usage": {**per_chunk, "prompt_tokens_details": {"cached_tokens": 4}}})
    assert list(last.chunk.token_ids) == [10] and (done.complete.prompt_tokens, done.complete.cached_tokens) == (5, 4)


def test_a_stream_without_a_usage_chunk_still_ends_its_samples() -> None:
    reader = CompletionStreamReader("r")
    out = [*reader.feed(chunk([7], index=1)), *reader.feed(chunk([8], "length", index=0)),
           *reader.feed(chunk([9], "stop", index=1))]
    assert [(m.chunk.index, list(m.chunk.token_ids)) for m in out] == [(1, [7])]
    ends = list(reader.close())
    assert [m.WhichOneof("response") for m in ends] == ["chunk", "complete"] * 2
    assert [(m.complete.index, m.complete.completion_tokens, m.complete.finish_reason) for m in ends[1::2]] == [
        (0, 1, "length"), (1, 2, "stop"),
    ]
    assert list(reader.close()) == []  # released once


def test_a_whole_completion_and_a_stop_string() -> None:
    answer = {"choices": [{"index": 0, "token_ids": [4, 5], "finish_reason": "stop", "stop_reason": "END"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    (only,) = whole_completion("r", answer)
    assert list(only.complete.output_ids) == [4, 5] and only.complete.matched_stop_str == "END"
    assert only.complete.prompt_tokens == 3 and only.complete.cached_tokens == 0


def test_logprobs_named_by_token_id() -> None:
    reader = CompletionStreamReader("r")
    answer = chunk([10], "length")
    answer["choices"][0]["logprobs"] = {"tokens": ["token_id:10"], "token_logprobs": [-0.5],
                                        "top_logprobs": [{"token_id:10": -0.5, "token_id:3": -2.0}]}
    assert list(reader.feed(answer)) == []
    first, done = reader.close()
    assert list(first.chunk.output_logprobs.token_ids) == [10]
    assert list(first.chunk.output_logprobs.top_logprobs[0].token_ids) == [10, 3]
    assert done.complete.finish_reason == "length" and list(done.complete.output_logprobs.token_ids) == [10]


def _echoed(ids: list[int], prompt: list[int], finish: str | None = None) -> dict[str, Any]:
    """A choice as vLLM answers ``echo`` with ``logprobs=1`` and token-id names: the prompt's
    rows first (its first token's logprob null), then the output's."""
    answer = chunk(ids, finish)
    rows = [*prompt, *ids]
    answer["choices"][0]["logprobs"] = {
        "tokens": [f"token_id:{t}" for t in rows],
        "token_logprobs": [None, *(-0.25 * k for k in range(1, len(rows)))],
        "top_logprobs": [None, *({f"token_id:{t}": -0.25 * k} for k, t in enumerate(rows) if k)],
        "text_offset": list(range(len(rows))),
    }
    return answer


def _asking_prompt_logprobs(stream: bool, start: int = 0) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]), stream=stream, return_logprob=True,
        top_logprobs_num=1, logprob_start_len=start, sampling_params=pb.SamplingParams(n=1, max_new_tokens=2),
    )


def test_prompt_logprobs_are_asked_by_echo_and_read_from_the_rows_ahead_of_the_output() -> None:
    """vLLM refuses ``prompt_logprobs`` in a stream; ``echo`` gives them whole and streamed."""
    assert completion_body(_asking_prompt_logprobs(False), "served")["echo"] is True
    no_prompt = _asking_prompt_logprobs(False, start=-1)
    assert "echo" not in completion_body(no_prompt, "served")
    (whole,) = whole_completion("r", _echoed([10, 11], [1, 2, 3], "length"), prompt_start=0)
    inputs = whole.complete.input_logprobs
    assert list(inputs.token_ids) == [1, 2, 3] and not inputs.token_logprobs[0].HasField("value")
    assert [v.value for v in inputs.token_logprobs[1:]] == [-0.25, -0.5]
    assert [list(r.token_ids) for r in inputs.top_logprobs] == [[], [2], [3]]
    assert list(whole.complete.output_logprobs.token_ids) == [10, 11]
    assert list(whole.complete.output_logprobs.token_logprobs) == [-0.75, -1.0]
    (later,) = whole_completion("r", _echoed([10], [1, 2, 3], "length"), prompt_start=2)
    assert list(later.complete.input_logprobs.token_ids) == [3]  # from the asked position on
    (plain,) = whole_completion("r", _echoed([10], [1, 2, 3], "length"))
    assert not plain.complete.HasField("input_logprobs")


def test_a_stream_brings_the_prompt_logprobs_with_each_samples_first_message() -> None:
    reader = CompletionStreamReader("r", prompt_start=0)
    first = _echoed([10], [1, 2, 3])
    later = chunk([11], "length")
    later["choices"][0]["logprobs"] = {"tokens": ["token_id:11"], "token_logprobs": [-1.0], "top_logprobs": [None]}
    (one,) = reader.feed(first)
    assert list(one.chunk.input_logprobs.token_ids) == [1, 2, 3] and list(one.chunk.token_ids) == [10]
    assert list(reader.feed(later)) == []
    last, done = reader.close()
    assert not last.chunk.HasField("input_logprobs") and not done.complete.HasField("input_logprobs")
    # a sample that finishes in its first chunk: the rows go with its chunk
    reader = CompletionStreamReader("r", prompt_start=0)
    assert list(reader.feed(_echoed([10], [1, 2], "length"))) == []
    last, done = reader.close()
    assert list(last.chunk.input_logprobs.token_ids) == [1, 2] and not done.complete.HasField("input_logprobs")


@pytest.mark.parametrize(
    ("logprobs", "says"),
    [
        ({"tokens": "x", "token_logprobs": [None, -1.0]}, "lists of tokens"),
        ({"tokens": ["token_id:1"], "token_logprobs": [None, -1.0, -2.0]}, "fewer tokens"),
        ({"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [None, "a", -1.0]}, "must be a number"),
        ({"tokens": ["token_id:1", "x", "token_id:3"], "token_logprobs": [None, -1.0, -1.0]}, "token_id:N"),
        ({"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [None, -1.0, -1.0], "top_logprobs": [None, 5]},
         "must be an object"),
    ],
)
def test_prompt_rows_of_another_shape_are_an_answer_error(logprobs: dict[str, Any], says: str) -> None:
    answer = chunk([9], "length")
    answer["choices"][0]["logprobs"] = logprobs
    with pytest.raises(AnswerError, match=says):
        whole_completion("r", answer, prompt_start=0)


@pytest.mark.parametrize(
    "bad",
    [[], {"choices": "x"}, {"choices": [{"text": "no ids"}]}, {"choices": [{"token_ids": ["a"]}]},
     {"choices": [{"token_ids": [1], "index": -1}]}, {"choices": [{"token_ids": [True]}]}],
)
def test_answers_without_usable_ids_are_refused(bad: Any) -> None:
    with pytest.raises(AnswerError):
        list(CompletionStreamReader("r").feed(bad))


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ([], "JSON object"), ({"choices": {}}, "choices must be"), ({"choices": [1]}, "choices must be"),
        ({"choices": [{}]}, "no token_ids"), (chunk([1, "2"]), "token_ids must be"),  # type: ignore[list-item]
        ({"choices": [{"token_ids": 3}]}, "token_ids must be"), (chunk([True]), "token_ids must be"),
    ],
)  # fmt: skip
def test_a_chunk_of_another_shape_is_an_answer_error(answer: Any, says: str) -> None:
    with pytest.raises(AnswerError, match=says):
        list(CompletionStreamReader("r").feed(answer))


def test_an_embedding_is_asked_with_the_ids_as_input_and_read_with_its_usage() -> None:
    request = pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]))
    assert embedding_body(request, "served") == {"model": "served", "input": [5, 6, 7]}
    reply = embedding_reply({
        "object": "list", "data": [{"index": 0, "object": "embedding", "embedding": [0.5, -0.25, 1]}],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    })  # fmt: skip
    assert list(reply.embedding) == [0.5, -0.25, 1.0] and reply.embedding_dim == 3 and reply.prompt_tokens == 3


@pytest.mark.parametrize("answer", [
    [], {"data": []}, {"data": ["x"]}, {"data": [{"embedding": "AAAA"}]}, {"data": [{"embedding": [1, "a"]}]},
])  # fmt: skip
def test_an_embeddings_answer_of_another_shape_is_an_answer_error(answer: Any) -> None:
    with pytest.raises(AnswerError):
        embedding_reply(answer)


def test_the_prompts_ids_are_left_unparsed_when_the_request_gave_its_length() -> None:
    """vLLM's first chunk repeats the prompt's ids (``return_token_ids``): a Python int per id
    if parsed. A reader that knows the prompt's length (the request's) reads them as null; a
    list that is not flat, or the key inside a text, is left as it is."""
    import orjson

    ids = list(range(1, 1089))
    first = chunk([10])
    first["choices"][0]["prompt_token_ids"] = ids
    raw = orjson.dumps(first)
    assert orjson.loads(without_prompt_ids(raw))["choices"][0]["prompt_token_ids"] is None
    spaced = raw.replace(b'"prompt_token_ids":[1,2,', b'"prompt_token_ids" : [ 1, 2,')
    assert orjson.loads(without_prompt_ids(spaced))["choices"][0]["prompt_token_ids"] is None
    for kept in (
        b'{"choices":[],"text":"\\"prompt_token_ids\\":[1,2]"}',  # inside a text: its quotes are escaped
        b'{"choices":[{"prompt_token_ids":[[1,2],[3]]}]}',  # not a flat list
        b'{"choices":[{"prompt_token_ids":null}]}',
    ):
        assert without_prompt_ids(kept) == kept
    assert without_prompt_ids(raw[:-30]) == raw[:-30]  # cut short: left for the parser to refuse
    told = CompletionStreamReader("r", prompt_tokens=1088)
    [message] = told.feed(told.parse(raw))
    assert message.chunk.prompt_tokens == 1088 and list(message.chunk.token_ids) == [10]
    found = CompletionStreamReader("r")  # no length given: read from the ids, as before
    [message] = found.feed(found.parse(raw))
    assert message.chunk.prompt_tokens == 1088
