"""TensorRT-LLM's messages <-> the seam's, without a socket: what the gateway sends and
how each kind of reply TensorRT-LLM's servicer sends reads on the seam."""

from __future__ import annotations

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import trtllm_service_pb2 as tpb
from gateway.workers import trtllm_grpc_wire as wire
from gateway.workers.transport import CallCode, WorkerCallError


def _request(*, stream: bool = True, max_new: int | None = 8) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id="r", stream=stream)
    req.tokenized.input_ids.extend([5, 6, 7, 8])
    sp = req.sampling_params
    sp.temperature, sp.top_p, sp.top_k, sp.n, sp.repetition_penalty = 0.0, 0.9, -1, 2, 0.0
    if max_new is not None:
        sp.max_new_tokens = max_new
    return req


def test_the_request_says_what_the_gateway_meant_in_trtllms_terms() -> None:
    req = _request()
    req.sampling_params.stop_token_ids.extend([2, 3])
    req.sampling_params.json_schema = '{"type": "object"}'
    req.sampling_params.min_new_tokens = 2
    req.return_logprob, req.top_logprobs_num, req.logprob_start_len = True, 3, -1
    sent = wire.generate_request(req, max_seq_len=100, vocab_size=10)
    sc = sent.sampling_config
    assert list(sent.tokenized.input_token_ids) == [5, 6, 7, 8] and sent.streaming and sent.max_tokens == 8
    assert sc.HasField("temperature") and sc.temperature == 0.0  # greedy is sent, not left unset
    assert sc.num_return_sequences == 2 and sc.beam_width == 1 and not sc.HasField("top_k")
    assert sc.top_p == pytest.approx(0.9) and sc.repetition_penalty == 1.0 and sc.min_tokens == 2
    assert list(sent.stop_token_ids) == [2, 3]
    assert sent.guided_decoding.guide_type == tpb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA
    assert sent.output_config.logprobs == 3 and not sent.output_config.HasField("prompt_logprobs")
    assert sent.output_config.exclude_input_from_output


def test_an_unset_limit_is_what_the_sequence_length_leaves_or_a_clear_refusal() -> None:
    assert wire.generate_request(_request(max_new=None), max_seq_len=100).max_tokens == 96
    with pytest.raises(WorkerCallError) as caught:
        wire.generate_request(_request(max_new=None), max_seq_len=0)
    assert caught.value.code is CallCode.INVALID_ARGUMENT and "max_tokens" in caught.value.message


def test_a_logit_bias_becomes_a_vocabulary_bias_and_needs_the_vocabulary() -> None:
    req = _request()
    req.sampling_params.logit_bias["3"] = -2.5
    assert wire.lacking(req, vocab_size=0) == ["logit_bias"]
    assert wire.lacking(req, vocab_size=6) == []
    bias = list(wire.generate_request(req, vocab_size=6).embedding_bias)
    assert bias == [0.0, 0.0, 0.0, -2.5, 0.0, 0.0]


def test_a_seed_from_a_pass_through_client_is_sent() -> None:
    req = _request()
    req.sampling_params.custom_params.update({"seed": 42})
    assert wire.generate_request(req).sampling_config.seed == 42


def _chunk(ids: list[int], total: int, index: int = 0) -> tpb.GenerateResponse:
    return tpb.GenerateResponse(request_id="r", chunk=tpb.GenerateStreamChunk(
        token_ids=ids, sequence_index=index, prompt_tokens=4, completion_tokens=total, cached_tokens=2,
    ))


def test_a_stream_reads_as_sglangs_empty_chunks_dropped_and_missed_ids_sent() -> None:
    reader = wire.ReplyReader(_request())
    assert reader.read(_chunk([], 0)) == []  # TensorRT-LLM's "nothing yet"
    (first,) = reader.read(_chunk([11, 12], 2))
    assert first.chunk.completion_tokens == 2 and first.request_id == "r"
    done = tpb.GenerateResponse(complete=tpb.GenerateComplete(
        output_token_ids=[11, 12, 13], finish_reason="stop_word", prompt_tokens=4, completion_tokens=3,
        matched_stop_str="x",
    ))
    tail, complete = reader.read(done)
    assert list(tail.chunk.token_ids) == [13] and tail.chunk.completion_tokens == 3
    c = complete.complete
    assert list(c.output_ids) == [13] and c.completion_tokens == 3  # the last chunk again, as SGLang
    assert c.finish_reason == "stop" and c.matched_stop_str == "x"


def test_unstreamed_completes_hold_every_id_with_their_logprobs() -> None:
    req = _request(stream=False)
    req.return_logprob, req.top_logprobs_num, req.logprob_start_len = True, 1, 1
    reader = wire.ReplyReader(req)
    entries = [tpb.TokenLogprob(token_id=t, logprob=-0.5, top_logprobs=[tpb.TopLogprob(token_id=t, logprob=-0.5)])
               for t in (11, 12)]
    prompt = [tpb.TokenLogprob(token_id=t, logprob=-1.0) for t in (6, 7, 8)]  # none for the first prompt token
    (reply,) = reader.read(tpb.GenerateResponse(complete=tpb.GenerateComplete(
        output_token_ids=[11, 12], sequence_index=1, finish_reason="length", logprobs=entries,
        prompt_logprobs=prompt, matched_token_id=12,
    )))
    c = reply.complete
    assert list(c.output_ids) == [11, 12] and c.index == 1 and c.completion_tokens == 2
    assert list(c.output_logprobs.token_ids) == [11, 12] and list(c.output_logprobs.top_logprobs[0].token_ids) == [11]
    assert list(c.input_logprobs.token_ids) == [6, 7, 8]  # positions 1.. of the prompt
    assert c.matched_token_id == 12


@pytest.mark.parametrize(("theirs", "ours"), [("cancelled", "abort"), ("timeout", "abort"), ("length", "length")])
def test_finish_reasons_read_as_sglangs(theirs: str, ours: str) -> None:
    reader = wire.ReplyReader(_request(stream=False))
    (reply,) = reader.read(tpb.GenerateResponse(complete=tpb.GenerateComplete(finish_reason=theirs)))
    assert reply.complete.finish_reason == ours


def test_an_engine_error_or_an_empty_reply_fails_the_call() -> None:
    reader = wire.ReplyReader(_request())
    for reply in (tpb.GenerateResponse(complete=tpb.GenerateComplete(finish_reason="error")), tpb.GenerateResponse()):
        with pytest.raises(WorkerCallError) as caught:
            reader.read(reply)
        assert caught.value.code is CallCode.INTERNAL and caught.value.retryable


def test_health_model_and_server_info() -> None:
    assert wire.healthy(tpb.HealthCheckResponse(status="OK")).healthy
    sick = wire.healthy(tpb.HealthCheckResponse(status="Executor is unhealthy"))
    assert not sick.healthy and sick.message == "Executor is unhealthy"
    model = tpb.GetModelInfoResponse(model_id="org/m", max_input_len=900, max_seq_len=1000, max_batch_size=16, vocab_size=50)
    info = wire.model_info(model)
    assert info.model_path == "org/m" and info.max_context_length == 1000 and info.max_req_input_len == 900
    server = wire.server_info(tpb.GetServerInfoResponse(version="1.2", backend="pytorch", tensor_parallel_size=2), model)
    assert server.server_args["context_length"] == 1000 and server.server_args["max_running_requests"] == 16
    assert server.server_args["dp_size"] == 1 and server.server_type == "trtllm-grpc/pytorch"
    assert server.max_total_num_tokens == 0  # no KV pool reported: the budget falls back


def test_the_refusal_names_every_lacking_feature() -> None:
    req = _request()
    req.lora_id = "a"
    req.data_parallel_rank = 0  # rank 0 of a one-rank worker is no pin
    assert wire.lacking(req) == ["lora"]
    err = wire.refusal("trtllm/grpc", "grpc://h:1", wire.lacking(req))
    assert err.code is CallCode.INVALID_ARGUMENT and "LoRA" in err.message
