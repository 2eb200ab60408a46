"""A burst routed by two replicas joined only by the bus (``serve --sync-url``: no shared
memory, a real nats-server between them), request by request, against one process fed
the same burst: the replicas must not shed a prompt group from its holder for each
other's queued requests, counted once in the peer's published uncached part and again,
whole, in the worker's polled waiting figure.

The fleet model and the driver are ``burst_fleet``'s. Each replica has a real
``SyncBus``; every few requests each one sends its pending batch, and the driver waits
until the other has applied it (the bus's own timers are set far beyond the run, so what
crosses and when is the same on every run). An *older* replica's wire is played by
clearing the field it would not have sent (``WorkerLoad.queued_prompt_tokens``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.policies.cache_aware import CostKnobs
from gateway.proto import sync_pb2
from gateway.sync.bus import SyncBus
from gateway.sync.config import SyncConfig
from gateway.sync.local_server import LocalNatsServer
from gateway.sync.outbox import Outbox
from tests.sync.burst_fleet import BUILDS, BUS_EVERY, Build, Member, Placement, gsp_burst, run_burst

QUIET = SyncConfig(sync_heartbeat_s=3600.0, sync_flush_interval_s=3600.0, sync_peer_timeout_s=3600.0)


async def _until(cond: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    async with asyncio.timeout(limit):
        while not cond():  # noqa: ASYNC110 (polling state the bus's client task owns)
            await asyncio.sleep(0.005)
    assert cond(), what


async def _one(build: Build, cost: CostKnobs | None = None) -> Placement:
    member = Member(build, cost)
    member.tap(Outbox("solo", member.load, lambda wid: build.page))  # nothing is sent
    try:
        return await run_burst([member])
    finally:
        member.close()


def _as_older(outbox: Outbox) -> None:
    """What an older replica publishes: its loads without the whole queued prompt tokens."""
    take = outbox.take

    def older_take(**kwargs: Any) -> sync_pb2.Batch | None:
        batch = take(**kwargs)
        for lo in [] if batch is None else batch.loads:
            lo.ClearField("queued_prompt_tokens")
        return batch

    outbox.take = older_take  # type: ignore[method-assign]


async def _replicas(
    build: Build, url: str, *, older: bool = False, cost: CostKnobs | None = None, bus_every: int = BUS_EVERY
) -> Placement:
    members = [Member(build, cost) for _ in range(2)]
    buses = [SyncBus(QUIET, m.router, m.registry, url=url, origin=f"r{i}") for i, m in enumerate(members)]  # type: ignore[arg-type]
    for m, bus in zip(members, buses, strict=True):
        if older:
            _as_older(bus.outbox)
        m.tap(bus.outbox)
        bus.start()

    def heard(bus: SyncBus, origin: str) -> int:
        peer = bus.applier.peers.get(origin)
        return 0 if peer is None else peer.last_seq

    async def exchange() -> None:
        sent = []
        for bus in buses:
            batch = await bus.flush()
            if batch is not None:
                sent.append((bus.origin, batch.seq))
        for origin, seq in sent:
            for bus in buses:
                if bus.origin != origin:
                    await _until(lambda bus=bus, origin=origin, seq=seq: heard(bus, origin) >= seq, f"{origin}'s batch {seq} applied")

    try:
        await _until(lambda: all(b.stats.connected for b in buses), "both joined")
        async with asyncio.timeout(20):  # a subscription is live once the server has it: until then batches may pass it by
            while not (heard(buses[0], "r1") and heard(buses[1], "r0")):
                for m, bus in zip(members, buses, strict=True):
                    bus.outbox.load_changed(next(iter(m.workers)))
                    await bus.flush()
                await asyncio.sleep(0.05)
        return await run_burst(members, exchange, bus_every)
    finally:
        for bus in buses:
            await bus.stop()
        for m in members:
            m.close()


@pytest.mark.parametrize("build", sorted(BUILDS))
async def test_two_replicas_on_the_bus_place_a_burst_as_one_process_does(
    build: str, nats: LocalNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.workers import worker as worker_module

    monkeypatch.setattr(worker_module, "time", SimpleNamespace(monotonic=lambda: 0.0))  # every poll is fresh: age 0
    one = await _one(BUILDS[build])
    two = await _replicas(BUILDS[build], nats.url)
    older = await _replicas(BUILDS[build], nats.url, older=True)
    print(f"build {build}: one {one}; replicas {two}; older replicas {older}")
    assert one.spread <= 1.2  # the model routes a burst as the bench's one process does (1.1 workers a group)
    # the replicas place the first requests of a group blind within a bus tick (a few more
    # no_match choices), and otherwise keep each group where one process does
    assert two.spread <= one.spread + 0.1, (one, two)
    assert two.spills <= one.spills + 4, (one, two)
    # Older replicas' loads are read (every request routed), and without the whole queued
    # prompts they shed groups for each other's queued requests: what this witness is for.
    assert sum(older.reasons.values()) == len(gsp_burst())
    assert older.spread > two.spread + 0.5, (two, older)


AGREE = CostKnobs(cold_hash_slack=0.5)  # a cold prompt goes where it hashes, within half its prefill of the cheapest


@pytest.mark.parametrize("build", sorted(BUILDS))
async def test_replicas_hashing_cold_prompts_place_a_group_s_first_requests_on_one_worker(
    build: str, nats: LocalNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the bus's lag both replicas find a new group cold; with ``cold_hash_slack`` they
    rank the workers by the group's hash and mostly pick the same one, so the group starts on
    fewer workers (at this witness's lag, as few as one process). The cold choices are the
    same in number (the hash moves them, it adds none); a group's requests that now share
    its first worker are prefilled together there more often (in-batch duplicates: the
    prefill gate sees only its own replica's requests)."""
    from gateway.workers import worker as worker_module

    monkeypatch.setattr(worker_module, "time", SimpleNamespace(monotonic=lambda: 0.0))
    one = await _one(BUILDS[build])
    off = await _replicas(BUILDS[build], nats.url)
    on = await _replicas(BUILDS[build], nats.url, cost=AGREE)
    print(f"build {build}: one {one}; replicas {off}; replicas hashing cold prompts {on}")
    assert on.reasons["no_match"] == off.reasons["no_match"] > one.reasons["no_match"]
    assert on.spread <= min(off.spread - 0.05, one.spread), (one, off, on)
    assert on.spills <= off.spills, (off, on)
    assert one.duplicates > 0 and on.duplicates >= off.duplicates, (one, off, on)
