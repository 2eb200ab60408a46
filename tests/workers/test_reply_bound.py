"""The bound on one worker message follows the request: its tokens, its logprob rows,
its prompt logprobs; never past the ceiling; grpc.aio's channels in powers of four."""

from __future__ import annotations

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.reply_bound import (
    BASE_REPLY_BYTES,
    CONTROL_REPLY_BYTES,
    MAX_REPLY_BYTES,
    ReplyTooLarge,
    channel_bound,
    grpc_reply_bytes,
    json_reply_bytes,
)
from gateway.workers.transport import CallCode, WorkerCallError


def _request(max_tokens: int | None = 16, *, prompt: int = 10, **kw: object) -> pb.GenerateRequest:
    sp = pb.SamplingParams(temperature=1.0, n=1)
    if max_tokens is not None:
        sp.max_new_tokens = max_tokens
    return pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=list(range(prompt))), sampling_params=sp, **kw)


def _largest_honest_complete(request: pb.GenerateRequest) -> int:
    """The largest GenerateComplete a worker can honestly send for ``request``."""
    tokens = request.sampling_params.max_new_tokens
    k = request.top_logprobs_num
    ids = [2**32 - 1] * tokens  # the widest varints
    out = pb.GenerateComplete(output_ids=ids, finish_reason="length", prompt_tokens=2**32 - 1,
                              completion_tokens=2**32 - 1, cached_tokens=2**32 - 1, matched_stop_str="s" * 1000)
    if request.return_logprob:
        out.output_logprobs.token_logprobs.extend([-1.5] * tokens)
        out.output_logprobs.token_ids.extend(ids)
        for _ in range(tokens):
            out.output_logprobs.top_logprobs.add(values=[-2.5] * k, token_ids=[2**32 - 1] * k)
        prompt = len(request.tokenized.input_ids)
        for _ in range(prompt):
            out.input_logprobs.token_logprobs.add(value=-3.5)
            out.input_logprobs.top_logprobs.add(values=[-2.5] * k, token_ids=[2**32 - 1] * k)
        out.input_logprobs.token_ids.extend([2**32 - 1] * prompt)
    return pb.GenerateResponse(request_id="r" * 128, complete=out).ByteSize()


def test_an_honest_reply_fits_its_bound_with_room_and_a_flood_does_not() -> None:
    for request in (
        _request(40),
        _request(4096),
        _request(512, return_logprob=True, top_logprobs_num=20, logprob_start_len=0, prompt=2000),
        _request(512, return_logprob=True, top_logprobs_num=0, logprob_start_len=-1),
    ):
        honest = _largest_honest_complete(request)
        assert honest <= grpc_reply_bytes(request) <= 4 * honest + 4 * BASE_REPLY_BYTES
    flood = pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[100] * 300_000))
    assert flood.ByteSize() > grpc_reply_bytes(_request(40))


def test_the_bound_grows_with_tokens_and_logprobs_and_stops_at_the_ceiling() -> None:
    small = grpc_reply_bytes(_request(16))
    assert grpc_reply_bytes(_request(1024)) > small
    assert grpc_reply_bytes(_request(16, return_logprob=True, top_logprobs_num=20)) > small
    # prompt logprobs count the prompt only when asked for (logprob_start_len >= 0)
    without = grpc_reply_bytes(_request(16, prompt=5000, return_logprob=True, logprob_start_len=-1))
    with_prompt = grpc_reply_bytes(_request(16, prompt=5000, return_logprob=True, logprob_start_len=0))
    assert with_prompt > without
    assert grpc_reply_bytes(_request(None)) == grpc_reply_bytes(_request(1 << 20))  # unset: the output ceiling
    assert grpc_reply_bytes(_request(1 << 20, return_logprob=True, top_logprobs_num=20)) == MAX_REPLY_BYTES
    assert json_reply_bytes(_request(16)) > grpc_reply_bytes(_request(16))  # text and JSON spelling


def test_channel_tiers_are_powers_of_four_from_the_control_bound() -> None:
    assert channel_bound(1) == CONTROL_REPLY_BYTES
    assert channel_bound(CONTROL_REPLY_BYTES) == CONTROL_REPLY_BYTES
    assert channel_bound(CONTROL_REPLY_BYTES + 1) == 4 * CONTROL_REPLY_BYTES
    assert channel_bound(MAX_REPLY_BYTES * 8) == MAX_REPLY_BYTES


def test_reply_too_large_is_a_worker_call_error_that_names_both_sizes() -> None:
    err = ReplyTooLarge(5000, 100)
    assert isinstance(err, WorkerCallError) and err.code is CallCode.RESOURCE_EXHAUSTED
    assert "5000 bytes vs. 100" in err.message and not err.rejected
    assert "more vs. 100" in ReplyTooLarge(None, 100).message
