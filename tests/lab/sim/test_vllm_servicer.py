"""The simulated worker speaking vLLM's engine service, read by the official
smg-grpc-proto vLLM stub in a subprocess (the wire witness): every reply parses with
no unknown field, and says what vLLM's servicer says where it differs from SGLang's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway_lab.sim.worker import SimWorker

from .conftest import address, cfg

OFFICIAL = Path(__file__).resolve().parent / "official_vllm_client.py"
PROMPT = list(range(200, 248))


@pytest.fixture
async def worker() -> AsyncIterator[SimWorker]:
    w = SimWorker(cfg(page_size=16), engine="vllm")
    await w.start()
    try:
        yield w
    finally:
        await w.stop(grace=0)


async def test_the_official_vllm_stub_reads_every_reply(worker: SimWorker) -> None:
    spec = {"input_ids": PROMPT, "max_tokens": 5, "n": 2}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(OFFICIAL), address(worker.url)],
        input=json.dumps(spec), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["unknown"] == 0
    for i in (0, 1):
        chunks = [r["chunk"] for r in got["stream"] if "chunk" in r and r["chunk"]["index"] == i]
        (done,) = [r["complete"] for r in got["stream"] if "complete" in r and r["complete"]["index"] == i]
        assert all(c["completion_tokens"] == len(c["token_ids"]) for c in chunks)  # per chunk, not running
        assert done["output_ids"] == chunks[-1]["token_ids"] and done["completion_tokens"] == len(done["output_ids"])
        assert sum(len(c["token_ids"]) for c in chunks) == 5
        assert len(chunks[0]["output_logprobs"]["token_ids"]) == len(chunks[0]["token_ids"])
    unary = [r["complete"] for r in got["unary"]]
    assert sorted(c["index"] for c in unary) == [0, 1]  # numbered by sample, unlike SGLang's
    assert all(c["completion_tokens"] == 5 == len(c["output_ids"]) for c in unary)
    assert all(c["cached_tokens"] >= 32 for c in unary)  # the streamed call cached the prompt's pages
    info = got["GetModelInfo"]
    assert info["max_context_length"] == worker.config.context_length  # the context, not the KV pool
    assert info["eos_token_ids"] == list(worker.vocab.eos_ids) and info["vocab_size"] == worker.vocab.vocab_size
    server = got["GetServerInfo"]
    assert server["block_size"] == 16 and server["server_type"] == "vllm-grpc"
    assert got["GetLoads"]["loads"][0]["max_total_num_tokens"] == worker.cache.capacity
    assert got["HealthCheck"]["healthy"] is True and got["Abort"] == {}
