"""SGLang's HTTP shapes <-> the seam's messages: request bodies, streamed and whole answers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http_wire import (
    AnswerError,
    StreamReader,
    body_json,
    error_message,
    generate_body,
    prompt_ids,
    sampling_params_json,
    whole_answer,
    without_seed,
)


def answer(ids: list[int], done: Any = None, *, index: int | None = None, **meta: Any) -> dict[str, Any]:
    info = {"id": "r", "finish_reason": done, "prompt_tokens": 7, "completion_tokens": len(ids), "cached_tokens": 3}
    info.update(meta)
    out: dict[str, Any] = {"text": "", "output_ids": ids, "meta_info": info}
    if index is not None:
        out["index"] = index
    return out


def test_unset_proto_fields_become_sglangs_defaults_and_set_ones_are_sent() -> None:
    sp = pb.SamplingParams(temperature=0.0, n=0, max_new_tokens=5, stop_token_ids=[9], regex="a+")
    got = sampling_params_json(sp)
    assert got["top_p"] == 1.0 and got["top_k"] == -1 and got["repetition_penalty"] == 1.0
    assert got["temperature"] == 0.0 and got["n"] == 1 and got["max_new_tokens"] == 5
    assert got["stop_token_ids"] == [9] and got["regex"] == "a+"
    assert "stream_interval" not in got and "stop" not in got and "json_schema" not in got


def test_custom_params_are_passed_as_json_without_the_seed() -> None:
    """SGLang reads custom_params only in custom logit processors: a seed there reaches no sampler."""
    custom = struct_pb2.Struct()
    custom.update({"seed": 7, "bias": 2})
    got = sampling_params_json(pb.SamplingParams(temperature=1.0, n=1, custom_params=custom))
    assert got["custom_params"] == {"bias": 2}
    custom = struct_pb2.Struct()
    custom.update({"seed": 7})
    assert "custom_params" not in sampling_params_json(pb.SamplingParams(temperature=1.0, n=1, custom_params=custom))


def test_without_seed_copies_only_a_request_that_has_one() -> None:
    plain = pb.GenerateRequest(request_id="r", sampling_params=pb.SamplingParams(temperature=1.0))
    assert without_seed(plain) is plain
    seeded = pb.GenerateRequest(request_id="r", sampling_params=pb.SamplingParams(temperature=1.0))
    seeded.sampling_params.custom_params.update({"seed": 7})
    stripped = without_seed(seeded)
    assert not stripped.sampling_params.HasField("custom_params") and stripped.request_id == "r"
    assert dict(seeded.sampling_params.custom_params) == {"seed": 7}  # the original keeps it for a retry elsewhere


def test_the_generate_body_carries_the_routed_ids_and_pd_and_rank() -> None:
    request = pb.GenerateRequest(
        request_id="abc", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(temperature=1.0, n=1), stream=True,
        return_logprob=True, top_logprobs_num=2, logprob_start_len=-1, data_parallel_rank=0,
        disaggregated_params=pb.DisaggregatedParams(bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=42),
    )
    body = generate_body(request)
    assert body["rid"] == "abc" and body["input_ids"].tolist() == [1, 2, 3] and body["stream"] is True
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 2
    assert body["data_parallel_rank"] == 0  # rank 0 is a pin, not "unset"
    assert (body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]) == ("10.0.0.1", 8998, 42)
    plain = generate_body(pb.GenerateRequest(request_id="x", sampling_params=pb.SamplingParams(n=1)))
    assert not {"data_parallel_rank", "bootstrap_host", "return_logprob"} & plain.keys()


def test_the_body_writes_the_prompt_ids_as_a_json_list_of_every_uint32() -> None:
    ids = [0, 1, 2**31, 2**32 - 1]
    request = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=ids))
    assert orjson.loads(body_json(generate_body(request)))["input_ids"] == ids
    assert orjson.loads(body_json(generate_body(pb.GenerateRequest())))["input_ids"] == []
    assert body_json({"input_ids": prompt_ids(request)}) == orjson.dumps({"input_ids": ids})  # byte for byte


def test_cumulative_stream_becomes_chunks_of_new_tokens_then_a_complete() -> None:
    reader = StreamReader("r")
    out = [*reader.feed(answer([5])), *reader.feed(answer([5, 6, 7])),
           *reader.feed(answer([5, 6, 7, 8], {"type": "stop", "matched": 8}))]
    chunks = [m.chunk for m in out if m.HasField("chunk")]
    assert [list(c.token_ids) for c in chunks] == [[5], [6, 7], [8]]
    assert [c.completion_tokens for c in chunks] == [1, 3, 4]
    assert chunks[0].prompt_tokens == 7 and chunks[0].cached_tokens == 3
    complete = out[-1].complete
    assert list(complete.output_ids) == [8]  # repeats the last chunk, as gRPC workers do
    assert complete.finish_reason == "stop" and complete.matched_token_id == 8
    assert complete.completion_tokens == 4 and out[-1].request_id == "r"


def test_incremental_stream_is_read_the_same_way() -> None:
    reader = StreamReader("r")
    out = [*reader.feed(answer([5], completion_tokens=1)), *reader.feed(answer([6, 7], completion_tokens=3)),
           *reader.feed(answer([], {"type": "length", "length": 3}, completion_tokens=3))]
    assert [list(m.chunk.token_ids) for m in out if m.HasField("chunk")] == [[5], [6, 7]]
    assert out[-1].complete.finish_reason == "length" and list(out[-1].complete.output_ids) == []


def test_samples_are_kept_apart_by_index_and_a_stop_string_is_reported() -> None:
    reader = StreamReader("r")
    out = [*reader.feed(answer([1], index=0)), *reader.feed(answer([2], index=1)),
           *reader.feed(answer([1, 3], {"type": "stop", "matched": "END"}, index=0))]
    assert [(m.chunk.index, list(m.chunk.token_ids)) for m in out if m.HasField("chunk")] == [(0, [1]), (1, [2]), (0, [3])]
    assert out[-1].complete.index == 0 and out[-1].complete.matched_stop_str == "END"


def test_logprobs_follow_their_tokens() -> None:
    reader = StreamReader("r")
    first = answer([5], output_token_logprobs=[[-0.5, 5, None]], output_top_logprobs=[[[-0.5, 5, None], [-1.0, 9, None]]],
                   input_token_logprobs=[[None, 1, None], [-2.0, 2, None]])
    second = answer([5, 6], {"type": "length"}, output_token_logprobs=[[-0.5, 5, None], [-0.25, 6, None]],
                    output_top_logprobs=[[[-0.5, 5, None]], [[-0.25, 6, None]]])
    (c1,) = reader.feed(first)
    assert list(c1.chunk.output_logprobs.token_ids) == [5]
    assert list(c1.chunk.output_logprobs.top_logprobs[0].token_ids) == [5, 9]
    assert not c1.chunk.input_logprobs.token_logprobs[0].HasField("value")
    assert c1.chunk.input_logprobs.token_logprobs[1].value == -2.0
    c2, done = reader.feed(second)
    assert list(c2.chunk.output_logprobs.token_logprobs) == [-0.25]
    assert list(done.complete.output_logprobs.token_ids) == [6]


def test_a_whole_answer_is_one_complete_per_sample() -> None:
    (one,) = whole_answer("r", answer([4, 5], {"type": "length", "length": 2}))
    assert list(one.complete.output_ids) == [4, 5] and one.complete.finish_reason == "length"
    batch = whole_answer("r", [answer([1], {"type": "stop", "matched": 1}), answer([2], {"type": "stop", "matched": 2})])
    assert [(m.complete.index, list(m.complete.output_ids)) for m in batch] == [(0, [1]), (1, [2])]


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2],
        {"output_ids": [1]},
        {"output_ids": "x", "meta_info": {}},
        {"output_ids": [1], "meta_info": {"completion_tokens": -1}},
        {"output_ids": [1], "meta_info": {"completion_tokens": 1, "finish_reason": 3}},
        {"output_ids": [1], "meta_info": {"completion_tokens": 1}, "index": -2},
    ],
)
def test_answers_of_the_wrong_shape_are_refused(bad: Any) -> None:
    with pytest.raises(AnswerError):
        list(StreamReader("r").feed(bad))


def test_a_count_that_goes_backwards_is_refused() -> None:
    reader = StreamReader("r")
    list(reader.feed(answer([1, 2])))
    with pytest.raises(AnswerError, match="completion_tokens went from 2 to 1"):
        list(reader.feed(answer([1])))
    assert reader.started


def test_a_new_id_that_is_no_token_id_is_refused() -> None:
    reader = StreamReader("r")
    list(reader.feed(answer([1])))
    with pytest.raises(AnswerError, match="output_ids"):
        list(reader.feed(answer([1, "2"])))  # type: ignore[list-item]


def test_error_events_are_recognised() -> None:
    assert error_message({"error": {"message": "too long"}}) == "too long"
    assert error_message({"error": "plain"}) == "plain"
    assert error_message(answer([1])) is None


def test_a_request_that_asked_no_logprobs_reads_none() -> None:
    """The reader of a request without logprobs skips their look-ups (once per streamed token);
    rows a worker sends anyway are not the client's."""
    rows = {"output_token_logprobs": [[-0.5, 5, None]], "input_token_logprobs": [[None, 1, None]]}
    plain, asked = StreamReader("r", logprobs=False), StreamReader("r")
    [bare] = plain.feed(answer([5], **rows))
    [full] = asked.feed(answer([5], **rows))
    assert list(bare.chunk.token_ids) == list(full.chunk.token_ids) == [5]
    assert not bare.chunk.HasField("output_logprobs") and not bare.chunk.HasField("input_logprobs")
    assert full.chunk.HasField("output_logprobs") and full.chunk.HasField("input_logprobs")
