"""The simulator's SGLang HTTP shapes: ``/generate`` bodies in, SGLang answer dicts out."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.http_wire import AnswerBuilder, BadBody, generate_request


def test_a_body_becomes_the_servicers_request() -> None:
    req = generate_request({
        "rid": "r1", "input_ids": [1, 2, 3], "stream": True, "return_logprob": True, "top_logprobs_num": 2,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5, "n": 2, "stop_token_ids": [7], "ebnf": "x",
                            "sampling_seed": 11, "ignore_eos": True},
        "data_parallel_rank": 0, "bootstrap_host": "h", "bootstrap_port": 9, "bootstrap_room": 5,
    }, "fallback")
    assert req.request_id == "r1" and list(req.tokenized.input_ids) == [1, 2, 3] and req.stream
    sp = req.sampling_params
    assert sp.max_new_tokens == 5 and sp.n == 2 and list(sp.stop_token_ids) == [7] and sp.ignore_eos
    assert sp.ebnf_grammar == "x" and sp.custom_params["seed"] == 11
    assert req.HasField("data_parallel_rank") and req.data_parallel_rank == 0
    assert req.disaggregated_params.bootstrap_room == 5 and req.top_logprobs_num == 2


def test_defaults_follow_sglang_and_the_rid_is_made_up_when_missing() -> None:
    req = generate_request({"input_ids": [4]}, "made-up")
    assert req.request_id == "made-up" and not req.stream
    assert req.sampling_params.temperature == 1.0 and req.sampling_params.top_k == -1
    assert not req.sampling_params.HasField("max_new_tokens") and not req.HasField("data_parallel_rank")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([1], "JSON object"),
        ({"text": "hi"}, "takes input_ids"),
        ({"input_ids": [[1, 2]]}, "list of token ids"),
        ({"input_ids": [-1]}, "list of token ids"),
        ({"input_ids": [1], "sampling_params": []}, "must be an object"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}, "malformed"),
    ],
)
def test_bad_bodies_are_refused(body: Any, reason: str) -> None:
    with pytest.raises(BadBody, match=reason):
        generate_request(body, "r")


def lp(ids: list[int]) -> pb.OutputLogProbs:
    return pb.OutputLogProbs(token_logprobs=[-0.5] * len(ids), token_ids=ids)


def test_answers_are_cumulative_and_the_complete_does_not_repeat_tokens() -> None:
    b = AnswerBuilder("r")
    one = b.chunk(pb.GenerateStreamChunk(token_ids=[5], prompt_tokens=3, completion_tokens=1, output_logprobs=lp([5])), True)
    assert one["output_ids"] == [5] and one["meta_info"]["finish_reason"] is None
    two = b.chunk(pb.GenerateStreamChunk(token_ids=[6], prompt_tokens=3, completion_tokens=2, cached_tokens=2,
                                         output_logprobs=lp([6])), True)
    assert two["output_ids"] == [5, 6] and two["meta_info"]["cached_tokens"] == 2
    done = b.complete(pb.GenerateComplete(output_ids=[6], finish_reason="stop", matched_token_id=6,
                                          prompt_tokens=3, completion_tokens=2, output_logprobs=lp([6])), True)
    assert done["output_ids"] == [5, 6]
    assert done["meta_info"]["finish_reason"] == {"type": "stop", "matched": 6}
    assert [row[1] for row in done["meta_info"]["output_token_logprobs"]] == [5, 6]


def test_a_whole_answer_and_a_length_finish() -> None:
    b = AnswerBuilder("r")
    done = b.complete(pb.GenerateComplete(output_ids=[1, 2, 3], finish_reason="length", completion_tokens=3), False)
    assert done["output_ids"] == [1, 2, 3]
    assert done["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert "output_token_logprobs" not in done["meta_info"]


def test_input_logprobs_are_rows_with_a_null_first_value() -> None:
    b = AnswerBuilder("r")
    inp = pb.InputLogProbs(token_ids=[1, 2])
    inp.token_logprobs.add()
    inp.token_logprobs.add(value=-1.5)
    chunk = pb.GenerateStreamChunk(token_ids=[9], completion_tokens=1, input_logprobs=inp)
    got = b.chunk(chunk, True)
    assert got["meta_info"]["input_token_logprobs"] == [[None, 1, None], [-1.5, 2, None]]


def test_a_vllm_completion_body_becomes_the_servicers_request() -> None:
    from gateway_lab.sim.http_wire import completion_request

    req = completion_request({"model": "m", "prompt": [5, 6], "max_tokens": 4, "n": 2, "seed": 3,
                              "ignore_eos": True, "stream": True, "return_token_ids": True}, "rid-1")
    assert list(req.tokenized.input_ids) == [5, 6] and req.stream and req.request_id == "rid-1"
    assert req.sampling_params.max_new_tokens == 4 and req.sampling_params.n == 2
    assert req.sampling_params.custom_params["seed"] == 3 and req.sampling_params.ignore_eos
    for bad in ({"prompt": "text"}, {"prompt": []}, [1]):
        with pytest.raises(BadBody):
            completion_request(bad, "r")


def test_vllm_completion_objects_carry_new_ids_and_usage() -> None:
    from gateway_lab.sim.http_wire import CompletionBuilder

    b = CompletionBuilder("r", "served", prompt_ids=[1, 2, 3])
    first = b.chunk(pb.GenerateStreamChunk(token_ids=[5], prompt_tokens=3, completion_tokens=1, cached_tokens=2), True)
    assert first["choices"][0]["token_ids"] == [5] and first["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}  # no cached count per chunk
    done = b.finish(pb.GenerateComplete(output_ids=[6], finish_reason="stop", matched_token_id=6, prompt_tokens=3,
                                        completion_tokens=2, cached_tokens=2), False, [])
    assert done["choices"][0]["token_ids"] == [6] and done["choices"][0]["stop_reason"] == 6
    assert "prompt_token_ids" not in done["choices"][0]  # the first chunk of a choice only
    closing = b.usage_only()
    assert done["usage"] is None and closing["choices"] == []
    assert closing["usage"]["completion_tokens"] == 2 and closing["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


def test_vllm_carried_ids_keep_the_prompt_ids_for_the_object_that_sends_them() -> None:
    from gateway_lab.sim.http_wire import CompletionBuilder

    b = CompletionBuilder("r", "served", prompt_ids=[1, 2])
    carried = b.carry(pb.GenerateStreamChunk(token_ids=[5], prompt_tokens=2, completion_tokens=1))
    done = b.finish(pb.GenerateComplete(output_ids=[5], finish_reason="length", prompt_tokens=2, completion_tokens=1),
                    False, carried)
    assert done["choices"][0]["token_ids"] == [5] and done["choices"][0]["prompt_token_ids"] == [1, 2]


def test_a_text_completion_is_tokenized_only_where_the_server_has_a_tokenizer() -> None:
    from gateway_lab.sim.http_wire import completion_request

    req = completion_request({"prompt": "ab", "max_tokens": 2}, "r", tokenize=lambda s: [ord(c) for c in s])
    assert list(req.tokenized.input_ids) == [97, 98] and req.sampling_params.max_new_tokens == 2
    with pytest.raises(BadBody, match="or a non-empty text"):
        completion_request({"prompt": ""}, "r", tokenize=lambda s: [1])


def test_completion_objects_carry_text_when_the_server_detokenizes() -> None:
    from gateway_lab.sim.http_wire import CompletionBuilder

    b = CompletionBuilder("r", "served", decode=lambda ids: "".join(chr(i) for i in ids))
    chunk = b.chunk(pb.GenerateStreamChunk(token_ids=[104], prompt_tokens=3, completion_tokens=1), False)
    assert chunk["choices"][0]["text"] == "h"
    done = b.finish(pb.GenerateComplete(output_ids=[105], finish_reason="length", completion_tokens=2), False, [])
    assert done["choices"][0]["text"] == "i" and done["choices"][0]["token_ids"] == [105]
