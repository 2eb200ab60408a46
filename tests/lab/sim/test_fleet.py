"""Simulated fleets (gateway_lab/sim/fleet.py): workers in this process on ephemeral ports
with per-worker roles, answering real gRPC, stopped together, one killed and restarted on
its port; a child fleet's port; one process per worker, killed and restarted alone."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet, SubprocessFleet, WorkerProcesses
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


async def test_a_killed_worker_comes_back_on_its_port_with_an_empty_cache() -> None:
    async with SimFleet.start(2, ZERO) as fleet:
        old, url = fleet.workers[0], fleet.urls[0]
        async with grpc.aio.insecure_channel(address(url)) as channel:
            await collect(pb_grpc.SglangSchedulerStub(channel), request([1, 2, 3], max_new=2))
        with pytest.raises(RuntimeError, match="kill it before a restart"):
            await fleet.restart(0)
        await fleet.kill(0)
        assert old.died and old.stopping
        await fleet.restart(0)
        assert fleet.urls[0] == url and fleet.workers[0] is not old and fleet.stats()[0]["requests"] == 0
        async with grpc.aio.insecure_channel(address(url)) as channel:
            replies = await collect(pb_grpc.SglangSchedulerStub(channel), request([1, 2, 3], max_new=2))
        assert replies[-1].complete.completion_tokens == 2
    assert all(w.stopping for w in fleet.workers)


def test_a_child_fleet_listens_where_it_is_told() -> None:
    argv = SubprocessFleet(1, ZERO, port=4321, extra_args=["--engine", "vllm"]).argv()
    assert argv[argv.index("--port") + 1] == "4321" and argv[-2:] == ["--engine", "vllm"]
    fresh = SubprocessFleet(2, ZERO).argv()
    assert fresh[fresh.index("--port") + 1] == "0"


class _FakeChild:
    """Stands in for a one-worker ``SubprocessFleet`` (a real one takes seconds to start)."""

    next_port = 5000
    live: list[_FakeChild] = []

    def __init__(self, n: int, config: SimConfig, *, extra_args: list[str], port: int, ready_timeout: float) -> None:
        self.config, self.extra_args, self.port = config, extra_args, port
        self.urls: list[str] = []
        self.proc = type("P", (), {"pid": 100 + len(_FakeChild.live)})()
        self.state = "new"

    def start(self) -> _FakeChild:
        if not self.port:
            _FakeChild.next_port += 1
        self.urls = [f"grpc://127.0.0.1:{self.port or _FakeChild.next_port}"]
        self.state = "running"
        _FakeChild.live.append(self)
        return self

    def kill(self) -> None:
        self.state = "killed"

    def stop(self) -> None:
        self.state = "stopped"


async def test_worker_processes_kill_one_and_restart_it_on_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway_lab.sim import fleet as sim_fleet

    monkeypatch.setattr(sim_fleet, "SubprocessFleet", _FakeChild)
    sick = dataclasses.replace(ZERO, fault_stall_s=30.0)
    async with WorkerProcesses([sick, ZERO], extra_args=["--engine", "vllm"]) as procs:
        first, second = _FakeChild.live[-2:]
        assert first.config.fault_stall_s == 30.0 and second.config.fault_stall_s == 0.0
        assert first.extra_args == ["--engine", "vllm"] and len(set(procs.urls)) == 2 and len(procs.pids) == 2
        url = procs.urls[0]
        procs.kill(0)
        assert first.state == "killed" and len(procs.pids) == 1
        procs.restart(0)
        assert procs.urls[0] == url and _FakeChild.live[-1].port == int(url.rsplit(":", 1)[1])
        with pytest.raises(RuntimeError, match="kill it before a restart"):
            procs.restart(0)
    assert _FakeChild.live[-1].state == "stopped" and second.state == "stopped"
    with pytest.raises(ValueError, match="at least one"):
        WorkerProcesses([])
