"""`token-gateway bench sim` (gateway_lab.bench.scenarios.sim): its unary and streamed
phases against an in-process simulated worker, bounded in calls and time."""

from __future__ import annotations

import argparse

import grpc

from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench.scenarios import sim as scenario
from gateway_lab.sim.fleet import SimFleet
from tests.lab.sim.conftest import ZERO, address


def test_requests_ignore_eos_so_every_call_has_its_length() -> None:
    req = scenario.make_request("r", [1, 2], 8, True)
    assert req.sampling_params.ignore_eos and req.sampling_params.max_new_tokens == 8 and req.stream


async def test_both_phases_count_what_they_did() -> None:
    async with SimFleet.start(1, ZERO) as fleet, grpc.aio.insecure_channel(address(fleet.urls[0])) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        unary = await scenario.unary_phase(stub, calls=6, concurrency=2, max_new=2, cap_s=10)
        assert unary["calls"] == 6 and unary["calls_per_s"] > 0
        stream = await scenario.stream_phase(stub, streams=2, tokens_each=5, cap_s=10)
        assert (stream["streams"], stream["tokens"]) == (2, 10) and stream["chunks"] >= 2
        assert fleet.stats()[0]["requests"] == 8


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    args = parser.parse_args(["--calls", "10", "--cap-s", "1"])
    assert (args.calls, args.cap_s, args.streams, args.max_running) == (10, 1.0, 32, 64)


def test_both_phases_become_two_rows() -> None:
    parser = argparse.ArgumentParser()
    scenario.add_arguments(parser)
    measured = {
        "unary": {"calls": 300, "calls_per_s": 1500.2, "seconds": 0.2, "worker_cpu_ms_per_call": 0.41},
        "stream": {"streams": 2, "tokens": 4000, "chunks": 40, "tokens_per_s": 90000.0, "seconds": 0.04,
                   "worker_cpu_us_per_token": 3.1},
    }  # fmt: skip
    out = scenario.result(measured, parser.parse_args([]))
    unary, stream = out.tables[0].rows
    assert unary[2:] == ("1500.2 calls/s", "300 calls", "0.2", "0.41 ms/call") and "32 callers" in unary[1]
    assert stream[2] == "90000.0 tokens/s" and stream[-1] == "3.1 us/token"
    assert out.to_json()["unary"] == measured["unary"]
