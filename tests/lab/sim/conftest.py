"""Shared helpers for the simulated-worker tests: a zero-cost fleet and a gRPC client."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimWorker

# No sleeping anywhere, no random EOS unless a test asks for it.
ZERO = dataclasses.replace(SimConfig().zero_cost(), eos_probability=0.0)


def cfg(**overrides: Any) -> SimConfig:
    return dataclasses.replace(ZERO, **overrides)


def address(url: str) -> str:
    return url.removeprefix("grpc://")


@dataclass
class Sample:
    """What a client assembles for one ``index`` of a Generate stream."""

    chunks: list[pb.GenerateStreamChunk] = field(default_factory=list)
    complete: pb.GenerateComplete | None = None

    @property
    def streamed_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]


def by_index(responses: list[pb.GenerateResponse]) -> dict[int, Sample]:
    out: dict[int, Sample] = {}
    for r in responses:
        kind = r.WhichOneof("response")
        if kind == "chunk":
            out.setdefault(r.chunk.index, Sample()).chunks.append(r.chunk)
        else:
            s = out.setdefault(r.complete.index, Sample())
            assert s.complete is None, "two completes for one index"
            s.complete = r.complete
    return out


def request(
    ids: list[int],
    *,
    rid: str = "req",
    stream: bool = False,
    n: int = 1,
    max_new: int | None = 8,
    **sampling: Any,
) -> pb.GenerateRequest:
    sp = pb.SamplingParams(temperature=1.0, n=n, **sampling)
    if max_new is not None:
        sp.max_new_tokens = max_new
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=sp,
        stream=stream,
    )


async def collect(
    stub: pb_grpc.SglangSchedulerStub, req: pb.GenerateRequest
) -> list[pb.GenerateResponse]:
    return [r async for r in stub.Generate(req, timeout=20)]


PROMPT = list(range(1000, 1040))  # 40 ordinary Qwen3 token ids


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet.start(1, ZERO) as f:
        yield f


@pytest.fixture
async def worker(fleet: SimFleet) -> SimWorker:
    return fleet.workers[0]


@pytest.fixture
async def stub(fleet: SimFleet) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(address(fleet.urls[0])) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)
