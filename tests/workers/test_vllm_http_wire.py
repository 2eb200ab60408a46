"""vLLM's OpenAI completion shapes <-> the seam's messages."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http_wire import AnswerError
from gateway.workers.vllm_http_wire import CompletionStreamReader, completion_body, whole_completion


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
    assert body["model"] == "served" and body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert body["max_tokens"] == 9 and body["stop_token_ids"] == [7] and body["seed"] == 5
    assert body["top_p"] == 1.0 and body["top_k"] == -1 and body["repetition_penalty"] == 1.0
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["structured_outputs"] == {"json": "{}"}
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True


def test_streamed_deltas_become_chunks_and_the_finish_a_complete() -> None:
    reader = CompletionStreamReader("r")
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}
    out = [*reader.feed(chunk([10], **usage)), *reader.feed(chunk([11, 12], "stop", 12, **usage)),
           *reader.feed({"choices": [], "usage": usage})]
    assert [list(m.chunk.token_ids) for m in out if m.HasField("chunk")] == [[10], [11, 12]]
    assert [m.chunk.completion_tokens for m in out if m.HasField("chunk")] == [1, 3]
    assert out[0].chunk.prompt_tokens == 5 and out[0].chunk.cached_tokens == 4
    done = out[-1].complete
    assert done.finish_reason == "stop" and done.matched_token_id == 12 and done.completion_tokens == 3
    assert list(done.output_ids) == [11, 12] and reader.started


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
    first, done = reader.feed(answer)
    assert list(first.chunk.output_logprobs.token_ids) == [10]
    assert list(first.chunk.output_logprobs.top_logprobs[0].token_ids) == [10, 3]
    assert done.complete.finish_reason == "length"


@pytest.mark.parametrize(
    "bad",
    [[], {"choices": "x"}, {"choices": [{"text": "no ids"}]}, {"choices": [{"token_ids": ["a"]}]},
     {"choices": [{"token_ids": [1], "index": -1}]}],
)
def test_answers_without_usable_ids_are_refused(bad: Any) -> None:
    with pytest.raises(AnswerError):
        list(CompletionStreamReader("r").feed(bad))
