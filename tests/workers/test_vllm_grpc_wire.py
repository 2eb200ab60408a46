"""vLLM's engine messages in the seam's terms, translation only (no I/O)."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import vllm_engine_pb2 as vpb
from gateway.workers import vllm_grpc_wire as wire
from gateway.workers.transport import CallCode, WorkerCallError


def _seam(**fields: object) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id="r1", **fields)  # type: ignore[arg-type]
    req.tokenized.input_ids.extend([5, 6, 7])
    return req


def test_sampling_maps_sglangs_neutral_values_onto_vllms() -> None:
    req = _seam(stream=True)
    sp = req.sampling_params
    sp.temperature, sp.top_k, sp.top_p, sp.n, sp.min_new_tokens = 0.0, -1, 0.0, 2, 3
    sp.max_new_tokens = 9
    sp.logit_bias["17"] = -2.5
    sp.regex = "[ab]+"
    sp.stop_token_ids.extend([2, 3])
    out = wire.generate_request(req)
    v = out.sampling_params
    assert v.HasField("temperature") and v.temperature == 0.0  # greedy is sent, never left unset
    assert v.top_k == 0 and v.top_p == 1.0 and v.n == 2 and v.min_tokens == 3 and v.max_tokens == 9
    assert dict(v.logit_bias) == {17: -2.5} and v.regex == "[ab]+" and list(v.stop_token_ids) == [2, 3]
    assert not v.HasField("logprobs") and not v.HasField("seed")
    assert list(out.tokenized.input_ids) == [5, 6, 7] and out.stream and out.request_id == "r1"
    assert not out.HasField("data_parallel_rank")


def test_unset_token_limit_stays_unset_and_a_pinned_rank_and_seed_travel() -> None:
    req = _seam(data_parallel_rank=0, return_logprob=True, top_logprobs_num=4, logprob_start_len=-1)
    req.sampling_params.custom_params.CopyFrom(struct_pb2.Struct(fields={"seed": struct_pb2.Value(number_value=42)}))
    out = wire.generate_request(req)
    assert not out.sampling_params.HasField("max_tokens")
    assert out.HasField("data_parallel_rank") and out.data_parallel_rank == 0
    assert out.sampling_params.seed == 42
    assert out.sampling_params.logprobs == 4 and not out.sampling_params.HasField("prompt_logprobs")


def test_each_lacking_feature_is_named_in_the_refusal() -> None:
    req = _seam(lora_id="x", return_hidden_states=True)
    req.token_ids_logprob.append(3)
    req.disaggregated_params.bootstrap_host = "10.0.0.1"
    found = wire.lacking(req)
    assert found == ["token_ids_logprob", "hidden_states", "lora", "pd_bootstrap"]
    error = wire.refusal("vllm/grpc", "grpc://h:1", found)
    assert error.code is CallCode.INVALID_ARGUMENT and "LoRA" in error.message
    assert wire.lacking(_seam()) == []


def test_the_reader_keeps_running_totals_per_sample() -> None:
    reader = wire.ReplyReader(_seam(stream=True))
    seen = [
        reader.read(vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(token_ids=ids, completion_tokens=len(ids), index=i)))
        for ids, i in (([1, 2], 0), ([3], 1), ([4], 0))
    ]
    assert [s.chunk.completion_tokens for s in seen] == [2, 1, 3]
    assert all(s.request_id == "r1" for s in seen)
    done = reader.read(vpb.GenerateResponse(complete=vpb.GenerateComplete(
        output_ids=[4], finish_reason="stop", completion_tokens=1, index=0, matched_token_id=4,
    )))
    assert done.complete.completion_tokens == 3 and done.complete.matched_token_id == 4


def test_an_unstreamed_complete_counts_its_own_ids_and_error_is_a_failure() -> None:
    reader = wire.ReplyReader(_seam(stream=False))
    done = reader.read(vpb.GenerateResponse(complete=vpb.GenerateComplete(output_ids=[1, 2, 3], finish_reason="length", index=2)))
    assert done.complete.completion_tokens == 3 and done.complete.index == 2
    with pytest.raises(WorkerCallError) as caught:
        reader.read(vpb.GenerateResponse(complete=vpb.GenerateComplete(finish_reason="error")))
    assert caught.value.retryable


def test_input_logprobs_are_cut_to_the_start_asked() -> None:
    reader = wire.ReplyReader(_seam(stream=True, return_logprob=True, logprob_start_len=1))
    lp = vpb.InputLogProbs(token_ids=[5, 6, 7])
    lp.token_logprobs.add()
    lp.token_logprobs.add(value=-1.0)
    lp.token_logprobs.add(value=-2.0)
    got = reader.read(vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(token_ids=[9], input_logprobs=lp)))
    assert list(got.chunk.input_logprobs.token_ids) == [6, 7]
    assert [e.value for e in got.chunk.input_logprobs.token_logprobs] == [-1.0, -2.0]


def test_server_and_load_info_read_as_sglangs() -> None:
    model = vpb.GetModelInfoResponse(served_model_name="m", max_context_length=4096)
    info = wire.server_info(vpb.GetServerInfoResponse(block_size=32, data_parallel_size=2, max_num_seqs=8), model, 1000, 99.5)
    args = dict(info.server_args)
    assert args == {"page_size": 32, "dp_size": 2, "max_running_requests": 8, "served_model_name": "m", "context_length": 4096}
    assert info.max_total_num_tokens == 1000 and info.start_time.ToNanoseconds() == 99_500_000_000
    loads = vpb.GetLoadsResponse(dp_rank_count=2, loads=[
        vpb.SchedulerLoad(dp_rank=0, num_running_reqs=2, max_total_num_tokens=500, token_usage=0.5),
        vpb.SchedulerLoad(dp_rank=1, num_waiting_reqs=3, max_total_num_tokens=500, token_usage=0.1),
    ])
    seam = wire.loads(loads)
    assert seam.aggregate.total_running_reqs == 2 and seam.aggregate.total_waiting_reqs == 3
    assert seam.aggregate.avg_token_usage == pytest.approx(0.3) and wire.kv_pool_tokens(loads) == 1000


def test_the_start_time_holds_between_polls_and_moves_on_a_restart() -> None:
    clock = wire.StartClock(tolerance_s=2.0)
    first = clock.observe(100.0, now=1000.0)
    assert first == 900.0
    assert clock.observe(130.7, now=1031.2) == first  # polls drift by their own delays: same start
    assert clock.observe(0.0, now=1040.0) == first  # no uptime reported: nothing learned
    assert clock.observe(3.0, now=1100.0) == 1097.0  # uptime started over: a restart
