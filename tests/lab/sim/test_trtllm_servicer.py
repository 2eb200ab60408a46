"""The simulated worker speaking TensorRT-LLM's service, read by the official
smg-grpc-proto TensorRT-LLM stub in a subprocess (the wire witness): every reply parses
with no unknown field, and says what TensorRT-LLM's servicer says where it differs from
SGLang's; the translation of requests and replies is checked without a socket too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import trtllm_service_pb2 as tpb
from gateway_lab.sim.trtllm_servicer import ReplyWriter, scheduler_request
from gateway_lab.sim.worker import SimWorker

from .conftest import address, cfg

OFFICIAL = Path(__file__).resolve().parent / "official_trtllm_client.py"
PROMPT = list(range(200, 248))


@pytest.fixture
async def worker() -> AsyncIterator[SimWorker]:
    w = SimWorker(cfg(page_size=16), engine="trtllm")
    await w.start()
    try:
        yield w
    finally:
        await w.stop(grace=0)


async def test_the_official_trtllm_stub_reads_every_reply(worker: SimWorker) -> None:
    spec = {"input_ids": PROMPT, "max_tokens": 5, "n": 2}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(OFFICIAL), address(worker.url)],
        input=json.dumps(spec), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["unknown"] == 0
    for i in (0, 1):
        chunks = [r["chunk"] for r in got["stream"] if "chunk" in r and r["chunk"]["sequence_index"] == i]
        (done,) = [r["complete"] for r in got["stream"] if "complete" in r and r["complete"]["sequence_index"] == i]
        ids = [t for c in chunks for t in c["token_ids"]]
        assert len(ids) == 5 and done["output_token_ids"] == ids  # every id, not the last chunk's
        assert [c["completion_tokens"] for c in chunks] == list(range(1, 6))  # running totals
        assert len(done["prompt_logprobs"]) == len(PROMPT) - 1  # the first prompt token has none
        assert all(len(c["logprobs"]) == len(c["token_ids"]) for c in chunks)
    unary = [r["complete"] for r in got["unary"]]
    assert sorted(c["sequence_index"] for c in unary) == [0, 1]
    assert all(c["completion_tokens"] == 5 == len(c["output_token_ids"]) for c in unary)
    assert all(c["cached_tokens"] >= 32 for c in unary)  # the streamed call cached the prompt's pages
    info = got["GetModelInfo"]
    assert info["max_seq_len"] == worker.config.context_length and info["vocab_size"] == worker.vocab.vocab_size
    assert info["max_batch_size"] == worker.config.max_running_requests
    assert got["GetServerInfo"]["world_size"] == 1 and got["HealthCheck"]["status"] == "OK"
    assert got["Abort"]["success"] is False and got["Embed"] == "UNIMPLEMENTED"


def test_requests_and_replies_translate_as_trtllms_servicer_reads_and_writes_them() -> None:
    sent = tpb.GenerateRequest(request_id="r", max_tokens=7, streaming=True)
    sent.tokenized.input_token_ids.extend([1, 2, 3])
    sent.sampling_config.num_return_sequences = 2
    sent.guided_decoding.guide_type = tpb.GuidedDecodingParams.GUIDE_TYPE_REGEX
    sent.guided_decoding.guide = "a+"
    inner = scheduler_request(sent)
    sp = inner.sampling_params
    assert sp.temperature == 1.0 and sp.top_p == 1.0 and sp.top_k == -1  # TensorRT-LLM's defaults when unset
    assert sp.max_new_tokens == 7 and sp.n == 2 and sp.regex == "a+" and not inner.return_logprob

    writer = ReplyWriter()
    writer.reply(pb.GenerateResponse(request_id="r", chunk=pb.GenerateStreamChunk(token_ids=[9, 10], completion_tokens=2)))
    writer.reply(pb.GenerateResponse(request_id="r", chunk=pb.GenerateStreamChunk(token_ids=[11], completion_tokens=3)))
    done = writer.reply(pb.GenerateResponse(request_id="r", complete=pb.GenerateComplete(
        output_ids=[11], finish_reason="abort", completion_tokens=3)))
    assert list(done.complete.output_token_ids) == [9, 10, 11] and done.complete.finish_reason == "cancelled"
