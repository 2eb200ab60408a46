"""The supervisor of ``serve --processes N`` (server/supervisor.py), without children:
each process's share of the set's admission limits, the ports reserved for the set, a
local nats-server when no sync URL is given, and the set's status file."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import socket

import orjson
import pytest

from gateway.server.admission import AdmissionConfig
from gateway.server.config import GatewayConfig
from gateway.server.process_set import STATUS_FILE
from gateway.server.supervisor import Supervisor, share_admission


def test_the_set_limits_are_split_with_the_remainder_to_the_first() -> None:
    cfg = AdmissionConfig(max_concurrent_requests=10, max_queued_requests=5, rate_limit_per_s=9.0, rate_limit_burst=7)
    parts = [share_admission(cfg, i, 3) for i in range(3)]
    assert [p.max_concurrent_requests for p in parts] == [4, 3, 3]  # sums to the set's 10
    assert [p.max_queued_requests for p in parts] == [2, 2, 1]
    assert {p.rate_limit_per_s for p in parts} == {3.0} and {p.rate_limit_burst for p in parts} == {3}
    tiny = share_admission(AdmissionConfig(max_concurrent_requests=2), 3, 4)
    assert tiny.max_concurrent_requests == 1  # at least one slot each
    unlimited = share_admission(AdmissionConfig(), 0, 4)
    assert (unlimited.max_concurrent_requests, unlimited.rate_limit_burst) == (0, 0)  # off stays off


async def test_ports_are_reserved_and_a_local_bus_is_started() -> None:
    config = GatewayConfig()
    config.server.port, config.server.grpc_port = 0, 0
    config.metrics_port.prometheus_port = 0
    sup = Supervisor(config, 2)
    try:
        cfg = sup._bind()
        assert cfg.server.port > 0 and cfg.server.grpc_port and cfg.metrics_port.prometheus_port
        with socket.socket() as other:  # the reserved port stays the set's
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", cfg.server.port))
        synced = await sup._sync(cfg)
        assert synced.sync.sync_url is not None and synced.sync.sync_url.startswith("nats://127.0.0.1:")
        given = dataclasses.replace(cfg, sync=dataclasses.replace(cfg.sync, sync_url="nats://elsewhere:4222"))
        assert await sup._sync(given) is given
    finally:
        if sup.nats is not None:
            await sup.nats.stop()
        for s in (sup.http_sock, sup.grpc_reserve):
            if s is not None:
                s.close()
        shutil.rmtree(sup.run_dir, ignore_errors=True)


def test_the_status_file_accounts_for_the_set() -> None:
    sup = Supervisor(GatewayConfig(), 3)
    try:
        sup.children[1].restarts = 2
        sup._write_status()
        status = orjson.loads((sup.run_dir / STATUS_FILE).read_bytes())
        assert status["expected"] == 3 and status["alive"] == 0 and status["restarts"] == 2
        assert status["pids"] == [None, None, None] and status["stopping"] is False
        assert not (sup.run_dir / (STATUS_FILE + ".tmp")).exists()  # written whole, then renamed
    finally:
        shutil.rmtree(sup.run_dir, ignore_errors=True)


async def test_the_supervisor_parks_on_its_readings_and_writes_the_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parking set starts with process 0 alone (in the run folder's parking file before any
    child starts); a spare core and a busy process 0 for a window of readings take process 1
    in, and no spare core (the host 1.95 cores busy, the set 0.5 of them) parks it again."""
    from gateway.server import supervisor as module
    from gateway.server.process_set import read_parking

    config = GatewayConfig()
    config.processes.process_parking = "auto"
    sup = Supervisor(config, 2)
    try:
        assert sup.parking is not None and sup.active == [0] and read_parking(sup.run_dir) == [0]
        sup.parking.cpus = 2  # the rule as on a 2-core host, whatever this one has
        ticks = iter(range(100))
        host, own = [1.0], [0.9]  # cores busy per second: the host's, the set's

        def reading() -> tuple[float, float, dict[int, float]]:
            t = float(next(ticks))
            return t, host[0] * t, {4242: own[0] * t}

        monkeypatch.setattr(sup, "_reading", reading)
        monkeypatch.setattr(module, "PARK_SAMPLE_S", 0.0)
        watch = asyncio.create_task(sup._watch_cores(sup.parking))
        async with asyncio.timeout(5):
            while sup.active != [0, 1]:  # noqa: ASYNC110 (the watcher runs on its own)
                await asyncio.sleep(0)
        assert read_parking(sup.run_dir) == [0, 1]
        host[0], own[0] = 1.95, 0.5
        async with asyncio.timeout(5):
            while sup.active != [0]:  # noqa: ASYNC110
                await asyncio.sleep(0)
        watch.cancel()
        assert read_parking(sup.run_dir) == [0]
        assert orjson.loads((sup.run_dir / STATUS_FILE).read_bytes())["active"] == [0]
    finally:
        shutil.rmtree(sup.run_dir, ignore_errors=True)


def test_parking_is_off_by_default_and_with_tls() -> None:
    sup = Supervisor(GatewayConfig(), 2)
    shutil.rmtree(sup.run_dir, ignore_errors=True)
    assert sup.parking is None
    config = GatewayConfig()
    config.processes.process_parking = "auto"
    config.tls = dataclasses.replace(config.tls, tls_cert_file="cert.pem", tls_key_file="key.pem")
    sup = Supervisor(config, 2)
    shutil.rmtree(sup.run_dir, ignore_errors=True)
    assert sup.parking is None
    config = GatewayConfig()
    config.processes.process_parking = "auto"
    sup = Supervisor(config, 1)
    shutil.rmtree(sup.run_dir, ignore_errors=True)
    assert sup.parking is None  # a set of one has nothing to park


def test_a_parked_process_leaves_its_cpus_to_the_active_ones() -> None:
    from gateway.server.supervisor import active_shares

    shares = [{0}, {1}]
    assert active_shares(shares, [0, 1]) == [{0}, {1}]  # all active: each pinned to its own
    assert active_shares(shares, [0]) == [{0, 1}, {1}]  # parked: the active one may use both cores
    four = [{0}, {1}, {2}, {3}]
    assert active_shares(four, [0, 1]) == [{0, 2}, {1, 3}, {2}, {3}]  # parked shares dealt in turn
    assert active_shares(four, [0]) == [{0, 1, 2, 3}, {1}, {2}, {3}]
    assert active_shares(shares, []) == shares  # nobody active: nothing moves
    assert shares == [{0}, {1}]  # the set's own shares are not changed


def test_every_thread_of_a_process_is_pinned() -> None:
    """The supervisor's pin reaches threads a child started before it (each has its own mask)."""
    import os
    import threading

    from gateway.server.supervisor import set_process_affinity

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    mine = os.sched_getaffinity(0)
    one = {min(mine)}
    started, stop = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def worker() -> None:
        started.set()
        stop.wait(10)
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    try:
        assert set_process_affinity(os.getpid(), one)
        stop.set()
        t.join(10)
        assert seen == [one] and os.sched_getaffinity(0) == one
    finally:
        stop.set()
        set_process_affinity(os.getpid(), mine)
    assert os.sched_getaffinity(0) == mine
    assert not set_process_affinity(2**22 + 12345, one)  # no such process


async def test_parking_widens_the_active_process_and_waking_pins_it_back() -> None:
    """The supervisor's word moves the pins of running children: the active one may use the
    parked one's CPUs while it is parked, and each is held to its own share again after."""
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    a, b = sorted(os.sched_getaffinity(0))[:2]
    sup = Supervisor(GatewayConfig(), 2)
    sup.cpu_shares = [{a}, {b}]
    procs = [await asyncio.create_subprocess_exec("sleep", "30") for _ in range(2)]
    try:
        for child, proc in zip(sup.children, procs, strict=True):
            child.proc = proc  # not ready: no signal is sent, the pins still move
        sup._set_active(1)
        assert [os.sched_getaffinity(p.pid) for p in procs] == [{a, b}, {b}]
        assert orjson.loads((sup.run_dir / STATUS_FILE).read_bytes())["cpus"] == [sorted({a, b}), [b]]
        sup._set_active(2)
        assert [os.sched_getaffinity(p.pid) for p in procs] == [{a}, {b}]
    finally:
        for p in procs:
            p.kill()
            await p.wait()
        shutil.rmtree(sup.run_dir, ignore_errors=True)


def test_the_active_processes_split_the_whole_sets_limits_while_others_are_parked() -> None:
    from gateway.server.supervisor import active_admission

    cfg = AdmissionConfig(max_concurrent_requests=10, max_queued_requests=6, rate_limit_per_s=8.0, rate_limit_burst=4)
    whole = [active_admission(cfg, i, 2, [0, 1]) for i in range(2)]
    assert [p.max_concurrent_requests for p in whole] == [5, 5]  # the set as a whole: as before
    parked = [active_admission(cfg, i, 2, [0]) for i in range(2)]
    assert parked[0].max_concurrent_requests == 10 and parked[0].rate_limit_per_s == 8.0  # the set's all
    assert parked[0].max_queued_requests == 6 and parked[0].rate_limit_burst == 4
    assert parked[1] == whole[1]  # a parked process keeps its own share for what it still serves
    three = [active_admission(cfg, i, 3, [0, 1]) for i in range(3)]
    assert [p.max_concurrent_requests for p in three[:2]] == [5, 5] and three[2] == share_admission(cfg, 2, 3)
