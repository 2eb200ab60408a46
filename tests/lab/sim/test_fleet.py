"""Simulated fleets (gateway_lab/sim/fleet.py): workers in this process on ephemeral ports
with per-worker roles, answering real gRPC, and stopped together."""

from __future__ import annotations

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from tests.lab.sim.conftest import ZERO, address, collect, request


async def test_workers_start_with_their_roles_and_serve_grpc() -> None:
    async with SimFleet.start(2, ZERO, roles=["prefill", "decode"]) as fleet:
        assert len(set(fleet.urls)) == 2 and all(u.startswith("grpc://127.0.0.1:") for u in fleet.urls)
        prefill_port, decode_port = fleet.bootstrap_ports
        assert prefill_port and decode_port is None  # only a prefill worker has a rendezvous port
        assert [s["role"] for s in fleet.stats()] == ["prefill", "decode"]
    async with SimFleet.start(1, ZERO) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
            assert info.served_model_name == ZERO.served_name
            replies = await collect(stub, request([1, 2, 3], max_new=4))
        assert replies[-1].complete.completion_tokens == 4 and fleet.stats()[0]["requests"] == 1
    with pytest.raises(grpc.aio.AioRpcError):  # stopped with the context
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as channel:
            await pb_grpc.SglangSchedulerStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=1)


async def test_roles_must_match_the_worker_count() -> None:
    with pytest.raises(ValueError, match="2 roles for 3 workers"):
        async with SimFleet.start(3, ZERO, roles=["prefill", "decode"]):
            pass
