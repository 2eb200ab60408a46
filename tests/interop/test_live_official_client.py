"""Live calls: a client on the OFFICIAL stubs against our simulated worker.

The sim stands in for a real `--grpc-mode` worker, so whatever it sends must
parse with the official classes exactly as the gateway's would. The official
client runs in a subprocess (official_side.py `client`); the sim runs in this
process on the test's event loop, so the subprocess is awaited in a thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from google.protobuf import json_format

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet

from .official import run_official
from .populate import canonical

PROMPT = list(range(1000, 1040))  # ordinary Qwen3 token ids
MAX_NEW = 8
STREAM_INTERVAL = 3
UNARY = ["HealthCheck", "GetModelInfo", "GetServerInfo", "GetLoads"]


def _replies(entries: list[dict[str, Any]]) -> list[pb.GenerateResponse]:
    for entry in entries:
        assert entry["unknown"] == [], "the official classes saw fields they do not know"
    return [json_format.ParseDict(entry["canonical"], pb.GenerateResponse()) for entry in entries]


async def test_official_client_calls_the_sim_worker() -> None:
    config = dataclasses.replace(SimConfig().zero_cost(), eos_probability=0.0)
    request = pb.GenerateRequest(
        request_id="official-client",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(
            temperature=1.0,
            n=1,
            max_new_tokens=MAX_NEW,
            stream_interval=STREAM_INTERVAL,
            ignore_eos=True,
        ),
    )
    async with SimFleet.start(1, config) as fleet:
        target = fleet.urls[0].removeprefix("grpc://")
        out = await asyncio.to_thread(
            run_official,
            "client",
            {"target": target, "generate": canonical(request), "unary": UNARY, "timeout": 10},
            timeout=30,
        )

    streamed = _replies(out["generate"]["stream"])
    kinds = [reply.WhichOneof("response") for reply in streamed]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    assert len(kinds) >= 1 + -(-MAX_NEW // STREAM_INTERVAL)
    assert {reply.request_id for reply in streamed} == {"official-client-stream"}
    chunks = [reply.chunk for reply in streamed[:-1]]
    complete = streamed[-1].complete
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    assert len(tokens) == MAX_NEW
    assert all(len(chunk.token_ids) <= STREAM_INTERVAL for chunk in chunks)
    assert [chunk.completion_tokens for chunk in chunks] == sorted(
        chunk.completion_tokens for chunk in chunks
    )
    assert chunks[-1].completion_tokens == MAX_NEW
    assert all(chunk.prompt_tokens == len(PROMPT) for chunk in chunks)
    assert list(complete.output_ids) == list(chunks[-1].token_ids)  # the last chunk, repeated
    assert complete.finish_reason == "length"
    assert (complete.prompt_tokens, complete.completion_tokens) == (len(PROMPT), MAX_NEW)

    (unary,) = _replies(out["generate"]["unary"])
    assert unary.request_id == "official-client-unary"
    assert unary.WhichOneof("response") == "complete"
    assert len(unary.complete.output_ids) == MAX_NEW
    assert unary.complete.finish_reason == "length"
    assert unary.complete.prompt_tokens == len(PROMPT)
    assert unary.complete.cached_tokens > 0  # the streamed call cached the same prompt

    for method in UNARY:
        assert out["unary"][method]["unknown"] == [], f"{method}: fields unknown to the reference"
    replies = {method: out["unary"][method]["canonical"] for method in UNARY}
    assert replies["HealthCheck"]["healthy"] is True
    assert replies["GetModelInfo"]["model_path"] == config.model
    assert replies["GetModelInfo"]["is_generation"] is True
    assert replies["GetServerInfo"]["max_total_num_tokens"] == config.kv_capacity_tokens
    assert len(replies["GetLoads"]["loads"]) == replies["GetLoads"]["dp_rank_count"] == 1
