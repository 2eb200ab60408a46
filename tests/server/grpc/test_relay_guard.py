"""The pass-through's output guard: chunks cut at the cap and closed with 'length',
completes cut, ids outside the vocabulary refused, samples counted apart."""

from __future__ import annotations

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError
from gateway.server.grpc.relay_guard import RelayGuard


def chunk(ids: list[int], index: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(request_id="r", chunk=pb.GenerateStreamChunk(token_ids=ids, index=index, prompt_tokens=3))


def complete(ids: list[int], index: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(request_id="r", complete=pb.GenerateComplete(output_ids=ids, index=index, finish_reason="stop"))


def guard(cap: int = 4, samples: int = 1) -> RelayGuard:
    return RelayGuard(cap, 1000, samples, request_id="r", worker_id="w")


def test_within_the_cap_everything_passes_unchanged() -> None:
    g = guard()
    assert [len(m.chunk.token_ids) for m in g.check(chunk([1, 2])) + g.check(chunk([3, 4]))] == [2, 2]
    assert g.check(complete([3, 4]))[0].complete.finish_reason == "stop"
    assert not g.stop_worker


def test_a_chunk_past_the_cap_is_cut_and_closed_with_length() -> None:
    g = guard()
    g.check(chunk([1, 2, 3]))
    cut, end = g.check(chunk([4, 5, 6]))
    assert list(cut.chunk.token_ids) == [4]
    assert end.complete.finish_reason == "length" and end.complete.completion_tokens == 4 and end.request_id == "r"
    assert g.stop_worker
    assert g.check(chunk([7])) == []  # nothing more for an ended sample


def test_a_whole_answer_past_the_cap_is_cut() -> None:
    (out,) = guard().check(complete(list(range(10))))
    assert list(out.complete.output_ids) == [0, 1, 2, 3] and out.complete.finish_reason == "length"


def test_samples_are_counted_apart() -> None:
    g = guard(cap=2, samples=2)
    assert len(g.check(chunk([1, 2], index=0))) == 1
    assert len(g.check(chunk([1, 2, 3], index=1))) == 2  # cut + length
    assert not g.stop_worker  # sample 0 has not ended
    with pytest.raises(WorkerError, match="sample 5"):
        g.check(chunk([1], index=5))


def test_an_id_outside_the_vocabulary_is_a_worker_error() -> None:
    with pytest.raises(WorkerError, match="outside the model's vocabulary"):
        guard().check(chunk([1, 1000]))


def _logprobs(n: int) -> pb.OutputLogProbs:
    return pb.OutputLogProbs(
        token_logprobs=[-0.5] * n, token_ids=list(range(n)),
        top_logprobs=[pb.TopLogProbs(values=[-0.5], token_ids=[1])] * n,
    )


def test_logprobs_are_cut_with_their_tokens() -> None:
    g = guard()
    g.check(chunk([1, 2, 3]))
    tail = chunk([4, 5, 6])
    tail.chunk.output_logprobs.CopyFrom(_logprobs(3))
    cut, _ = g.check(tail)
    lp = cut.chunk.output_logprobs
    assert list(cut.chunk.token_ids) == [4]
    assert len(lp.token_logprobs) == len(lp.token_ids) == len(lp.top_logprobs) == 1
    whole = complete(list(range(10)))
    whole.complete.output_logprobs.CopyFrom(_logprobs(10))
    (out,) = guard().check(whole)
    assert len(out.complete.output_logprobs.token_logprobs) == len(out.complete.output_logprobs.top_logprobs) == 4


def test_more_logprobs_than_tokens_are_not_relayed() -> None:
    padded = chunk([1, 2])
    padded.chunk.output_logprobs.CopyFrom(_logprobs(100_000))
    (out,) = guard().check(padded)
    assert len(out.chunk.output_logprobs.token_logprobs) == len(out.chunk.output_logprobs.top_logprobs) == 2
    kept = chunk([1, 2])
    kept.chunk.output_logprobs.CopyFrom(_logprobs(2))
    (same,) = guard().check(kept)
    assert same.chunk.output_logprobs == _logprobs(2)
