"""The simulated vLLM server's completion ``logprobs``: vLLM's four lists per choice, the
prompt's rows first on echo, tokens named as asked, and each row spent once."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.completion_logprobs import LogprobRows
from gateway_lab.sim.http_wire import CompletionBuilder, completion_request


def _named(token: int) -> str:
    return f"token_id:{token}"


def _output(ids: list[int], values: list[float], tops: Sequence[tuple[list[int], list[float]]] = ()) -> pb.OutputLogProbs:
    out = pb.OutputLogProbs(token_ids=ids, token_logprobs=values)
    for top_ids, top_values in tops:
        out.top_logprobs.add(token_ids=top_ids, values=top_values)
    return out


def test_k_zero_gives_the_sampled_token_alone_in_each_row() -> None:
    rows = LogprobRows(0, _named)
    rows.add_output(0, _output([7, 8], [-0.5, -1.0]), 2)
    out = rows.take(0)
    assert out == {
        "text_offset": [0, 10], "token_logprobs": [-0.5, -1.0], "tokens": ["token_id:7", "token_id:8"],
        "top_logprobs": [{"token_id:7": -0.5}, {"token_id:8": -1.0}],
    }
    assert rows.take(0) == {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    rows.add_output(0, _output([9], [-0.25]), 1)
    assert rows.take(0)["text_offset"] == [20]  # type: ignore[index]  # on from the reported tokens


def test_rows_hold_the_sampled_token_and_k_candidates_and_floor_minus_infinity() -> None:
    rows = LogprobRows(1, _named)
    # the sampled token outside the candidates: vLLM's row has it and the top k
    rows.add_output(0, _output([9], [float("-inf")], [([3, 4], [-0.25, -0.75])]), 1)
    out = rows.take(0)
    assert out is not None
    assert out["token_logprobs"] == [-9999.0] and out["text_offset"] == [0]
    assert out["top_logprobs"] == [{"token_id:9": -9999.0, "token_id:3": -0.25}]


def test_echo_puts_the_prompt_rows_first_with_a_null_first_row() -> None:
    rows = LogprobRows(1, lambda t: "ab"[t])
    prompt = pb.InputLogProbs(token_ids=[0, 1])
    prompt.token_logprobs.add()
    prompt.token_logprobs.add(value=-2.0)
    prompt.top_logprobs.add()
    prompt.top_logprobs.add(token_ids=[1], values=[-2.0])
    rows.add_prompt(0, prompt)
    rows.add_output(0, _output([0, 1], [-0.5, -0.25]), 1)  # only the message's newest row is this object's
    out = rows.take(0)
    assert out == {
        "text_offset": [0, 1, 2], "token_logprobs": [None, -2.0, -0.25], "tokens": ["a", "b", "b"],
        "top_logprobs": [None, {"b": -2.0}, {"b": -0.25}],
    }


def test_nothing_is_kept_when_the_request_did_not_ask() -> None:
    rows = LogprobRows(None, _named)
    rows.add_output(0, _output([1], [-1.0]), 1)
    assert rows.take(0) is None


def test_a_request_asks_for_rows_and_for_the_prompt_only_with_echo() -> None:
    plain = completion_request({"prompt": [1, 2], "logprobs": 2}, "r")
    assert plain.return_logprob and plain.top_logprobs_num == 2 and plain.logprob_start_len == -1
    echo = completion_request({"prompt": [1, 2], "logprobs": 0, "echo": True}, "r")
    assert echo.return_logprob and echo.logprob_start_len == 0
    assert not completion_request({"prompt": [1, 2]}, "r").return_logprob


def test_a_streamed_choice_carries_the_rows_of_the_tokens_it_sends() -> None:
    builder = CompletionBuilder("r", "served", prompt_ids=[1, 2], logprobs=LogprobRows(0, _named))
    first = pb.GenerateStreamChunk(token_ids=[5], completion_tokens=1, output_logprobs=_output([5], [-0.5]))
    first.input_logprobs.token_logprobs.add()
    first.input_logprobs.token_logprobs.add(value=-3.0)
    first.input_logprobs.token_ids.extend([1, 2])
    chunk = builder.chunk(first, False)["choices"][0]
    assert chunk["token_ids"] == [5]  # the output's ids; the rows have the prompt's first
    assert chunk["logprobs"]["tokens"] == ["token_id:1", "token_id:2", "token_id:5"]
    assert chunk["logprobs"]["token_logprobs"] == [None, -3.0, -0.5]
    carried = builder.carry(pb.GenerateStreamChunk(
        token_ids=[6], completion_tokens=2, output_logprobs=_output([6], [-0.125]),
    ))  # fmt: skip
    done = builder.finish(pb.GenerateComplete(
        output_ids=[7], finish_reason="length", completion_tokens=3, output_logprobs=_output([7], [-0.25]),
    ), False, carried)["choices"][0]  # fmt: skip
    assert done["token_ids"] == [6, 7] and done["logprobs"]["token_logprobs"] == [-0.125, -0.25]
    assert CompletionBuilder("r", "served").chunk(pb.GenerateStreamChunk(token_ids=[5]), False)["choices"][0]["logprobs"] is None
