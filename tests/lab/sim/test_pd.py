"""Prefill/decode roles: the decode side meets the prefill named in its request, or fails."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet

from .conftest import PROMPT, address, by_index, cfg, collect, request

PD = cfg(pd_timeout_s=0.4)


def pd_request(
    port: int, room: int, *, stream: bool, max_new: int = 12, host: str = "127.0.0.1"
) -> pb.GenerateRequest:
    req = request(PROMPT, rid=f"pd-{room}", stream=stream, max_new=max_new)
    req.disaggregated_params.CopyFrom(
        pb.DisaggregatedParams(bootstrap_host=host, bootstrap_port=port, bootstrap_room=room)
    )
    return req


@pytest.fixture
async def pd_fleet() -> AsyncIterator[tuple[SimFleet, list[pb_grpc.SglangSchedulerStub]]]:
    async with SimFleet.start(4, PD, roles=["prefill", "decode", "regular", "prefill"]) as fleet:
        channels = [grpc.aio.insecure_channel(address(u)) for u in fleet.urls]
        try:
            yield fleet, [pb_grpc.SglangSchedulerStub(c) for c in channels]
        finally:
            for c in channels:
                await c.close()


async def test_pd_pair_success(pd_fleet) -> None:
    fleet, (prefill, decode, regular, _) = pd_fleet
    port = fleet.workers[0].bootstrap_port
    assert port and fleet.workers[1].bootstrap_port is None
    fleet.workers[1].config.pd_timeout_s = 10.0  # plenty: this test is about success
    # Warm the prefill worker's cache so the transfer has something cached to report.
    await collect(prefill, request(PROMPT, max_new=1))
    # The decode request arrives first and waits for its partner.
    decode_call = asyncio.ensure_future(collect(decode, pd_request(port, 77, stream=True)))
    await asyncio.sleep(0.05)
    assert not decode_call.done()
    p = by_index(await collect(prefill, pd_request(port, 77, stream=False)))[0].complete
    d = by_index(await decode_call)[0]
    plain = by_index(await collect(regular, request(PROMPT, max_new=12)))[0].complete
    assert len(p.output_ids) == 1 and p.finish_reason == "length"  # prefill: the first token only
    assert p.cached_tokens == 32
    assert d.streamed_ids == list(plain.output_ids)  # the decode side streams the whole output
    assert d.streamed_ids[0] == p.output_ids[0]
    assert d.complete.finish_reason == "length" and d.complete.cached_tokens == 32
    assert fleet.workers[1].counters.pd_rendezvous_ok == 1
    assert fleet.workers[1].counters.prefill_tokens == 0  # the prompt's KV arrived ready
    info = await decode.GetServerInfo(pb.GetServerInfoRequest())
    assert dict(info.server_args)["disaggregation_mode"] == "decode"
    info = await prefill.GetServerInfo(pb.GetServerInfoRequest())
    assert dict(info.server_args)["disaggregation_bootstrap_port"] == port


async def test_prefill_at_the_wrong_worker_times_out(pd_fleet) -> None:
    fleet, (_, decode, _, other_prefill) = pd_fleet
    named = fleet.workers[0].bootstrap_port
    assert named is not None
    # The prefill goes to worker 3, but the request names worker 0's bootstrap port.
    await collect(other_prefill, pd_request(named, 5, stream=False))
    t0 = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(decode, pd_request(named, 5, stream=True))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "room 5" in err.value.details() and f"127.0.0.1:{named}" in err.value.details()
    assert time.monotonic() - t0 >= 0.35
    assert fleet.workers[1].counters.pd_rendezvous_failed == 1
    assert fleet.workers[1].scheduler.num_running == 0


async def test_unreachable_bootstrap_server_is_unavailable(pd_fleet) -> None:
    _, (_, decode, _, _) = pd_fleet
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(decode, pd_request(dead, 9, stream=False))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "bootstrap" in err.value.details()


async def test_regular_workers_ignore_disaggregated_params(pd_fleet) -> None:
    _, (_, _, regular, _) = pd_fleet
    s = by_index(await collect(regular, pd_request(1, 1, stream=False)))[0].complete
    assert s.completion_tokens == 12 and s.finish_reason == "length"


async def test_a_dp_prefill_runs_an_unpinned_room_on_rank_room_mod_dp() -> None:
    async with SimFleet.start(1, cfg(dp_size=3), roles=["prefill"]) as fleet:
        w = fleet.workers[0]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            await collect(stub, pd_request(w.bootstrap_port or 0, 7, stream=False))
            assert [r.cache.tree_tokens > 0 for r in w.ranks] == [False, True, False]  # 7 % 3
            pinned = pd_request(w.bootstrap_port or 0, 8, stream=False)
            pinned.data_parallel_rank = 0  # a named rank wins over the room's
            await collect(stub, pinned)
            assert [r.cache.tree_tokens > 0 for r in w.ranks] == [True, True, False]
