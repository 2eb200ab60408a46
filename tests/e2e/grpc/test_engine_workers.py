"""Fleets of simulated vLLM and TensorRT-LLM gRPC workers behind the gateway: detected at
registration, what each engine lacks listed in GET /workers, and a request that needs one
of those refused by name (INVALID_ARGUMENT on the gRPC door), the worker left healthy."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from tests.e2e.grpc.conftest import GrpcStack


@pytest.mark.stack(workers=2, sim={"eos_probability": 0.0})
@pytest.mark.parametrize(("gstack", "kind", "lacking"), [
    ({"engine": "vllm"}, "vllm/grpc", {"token_ids_logprob", "lora", "pd_bootstrap"}),
    ({"engine": "trtllm"}, "trtllm/grpc", {"token_ids_logprob", "lora", "pd_bootstrap", "loads", "flush_cache"}),
], indirect=["gstack"], ids=["vllm", "trtllm"])
async def test_engine_workers_show_their_lacks_and_refuse_what_needs_them(
    gstack: GrpcStack, kind: str, lacking: set[str]
) -> None:
    rows = (await gstack.http.http.get("/workers")).json()
    rows = rows["workers"] if isinstance(rows, dict) else rows
    assert {row["kind"] for row in rows} == {kind}
    assert all(lacking <= set(row["lacks"]) for row in rows)

    request = pb.GenerateRequest(
        request_id="needs-ids-logprob", tokenized=pb.TokenizedInput(input_ids=list(range(1000, 1040))), stream=True,
        sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=4), return_logprob=True,
        token_ids_logprob=[5, 6],
    )
    async with aio.insecure_channel(gstack.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        with pytest.raises(aio.AioRpcError) as caught:
            async for _ in stub.Generate(request, timeout=20):
                pass
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "token_ids_logprob" in (caught.value.details() or "")
        request.ClearField("token_ids_logprob")
        replies = [r async for r in stub.Generate(request, timeout=20)]
    assert sum(len(r.chunk.token_ids) for r in replies if r.HasField("chunk")) == 4
    assert all(w.breaker.state.value == "closed" and w.healthy for w in gstack.http.state.registry.all())
