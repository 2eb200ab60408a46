"""The NATS bus with a real nats-server: propagation, the server killed and restarted,
a bus that starts before its server. Waits are bounded polls, never timing assertions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.policies.base import Decision, RouteRequest
from gateway.sync.bus import SyncBus
from gateway.sync.config import SyncConfig
from gateway.sync.local_server import LocalNatsServer
from gateway_lab.bench.serve_process import ServeProcess
from gateway_lab.sim.fleet import SimFleet
from tests.sync.fakes import FakeRouter, FakeWorkers

CFG = SyncConfig(sync_heartbeat_s=0.2, sync_peer_timeout_s=0.8)
PROMPT = list(range(1000, 1064))


async def _until(cond: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    async with asyncio.timeout(limit):
        while not cond():  # noqa: ASYNC110 (polling state another task owns)
            await asyncio.sleep(0.02)
    assert cond(), what


class Node:
    def __init__(self, url: str, name: str) -> None:
        self.workers = FakeWorkers()
        self.router = FakeRouter()
        self.lags: list[float] = []
        self.bus = SyncBus(CFG, self.router, self.workers, url=url, origin=name, on_lag=self.lags.extend)

    def dispatch(self, tokens: list[int], worker: str = "w1:1") -> None:
        """What the dispatcher does: take a load slot, tell the (tapped) policy."""
        self.workers.w[worker].load.acquire(len(tokens), 8)
        self.bus.outbox.dispatched("regular", RouteRequest(tokens, model="m"), Decision(worker, "no_match"))

    def knows(self, tokens: list[int], worker: str = "w1:1") -> int:
        tree = self.router.p.tree("m")
        return tree.match_packed(self.router.p._packed(RouteRequest(tokens, model="m")))[1].get(worker, 0)


async def test_a_decision_reaches_the_other_tree_and_load_view(nats: LocalNatsServer) -> None:
    a, b = Node(nats.url, "a"), Node(nats.url, "b")
    a.bus.start()
    b.bus.start()
    try:
        await _until(lambda: a.bus.stats.connected and b.bus.stats.connected, "both connected")
        await _until(lambda: "a" in b.bus.applier.peers, "b heard a's heartbeat")
        a.dispatch(PROMPT)
        await _until(lambda: b.knows(PROMPT) == 64, "b's tree learned a's decision")
        await _until(lambda: b.workers.w["w1:1"].remote_load.in_flight == 1, "b sees a's load")
        assert a.knows(PROMPT) == 0  # the outbox alone does not touch a's own tree (the policy does)
        assert len(b.lags) == 1 and b.lags[0] >= 0
        assert a.bus.applier.stats.own == 0  # no echo
    finally:
        await a.bus.stop()
        await b.bus.stop()
    # a said goodbye: had b still been running, a's load would be gone at once
    assert b.bus.stats.published_batches > 0


async def test_losing_the_server_routes_locally_and_catches_up_after_restart(nats: LocalNatsServer) -> None:
    a, b = Node(nats.url, "a"), Node(nats.url, "b")
    a.bus.start()
    b.bus.start()
    try:
        await _until(lambda: a.bus.stats.connected and b.bus.stats.connected, "both connected")
        a.dispatch(PROMPT)
        await _until(lambda: b.workers.w["w1:1"].remote_load.in_flight == 1, "b sees a's load")
        await nats.kill()
        await _until(lambda: not a.bus.stats.connected and not b.bus.stats.connected, "both saw the loss")
        assert a.bus.stats.disconnects == 1 and b.bus.stats.disconnects == 1
        # While the bus is away, a's stale load is forgotten: b routes on its own knowledge.
        await _until(lambda: b.workers.w["w1:1"].remote_load.in_flight == 0, "b forgot a's load")
        late = list(range(5000, 5064))
        a.dispatch(late)  # decided while the bus is down: must reach b after the restart
        await nats.start()
        await _until(lambda: a.bus.stats.connected and b.bus.stats.connected, "both reconnected", 20)
        await _until(lambda: b.knows(late) == 64, "b learned the decision made during the outage", 20)
        await _until(lambda: b.workers.w["w1:1"].remote_load.in_flight == 2, "a's load re-announced", 20)
        assert a.bus.stats.replayed_decisions >= 1
    finally:
        await a.bus.stop()
        await b.bus.stop()


async def test_a_bus_without_a_server_never_blocks_and_joins_when_it_appears() -> None:
    server = LocalNatsServer()  # not started yet
    a = Node(server.url, "a")
    a.bus.start()  # returns at once
    try:
        a.dispatch(PROMPT)
        await _until(lambda: a.bus.stats.dropped_batches >= 1, "the tick's batch was dropped, not queued forever")
        assert not a.bus.stats.connected
        b = Node(server.url, "b")
        await server.start()
        b.bus.start()
        try:
            await _until(lambda: a.bus.stats.connected and b.bus.stats.connected, "both joined", 20)
            fresh = list(range(7000, 7064))
            a.dispatch(fresh)
            await _until(lambda: b.knows(fresh) == 64, "decisions flow once joined")
        finally:
            await b.bus.stop()
    finally:
        await a.bus.stop()
        await server.stop()


async def test_a_late_replica_warms_from_what_it_hears_without_missing_references(nats: LocalNatsServer) -> None:
    system = list(range(20_000, 20_128))  # two 64-token blocks shared by every prompt below
    a, b = Node(nats.url, "a"), Node(nats.url, "b")
    a.bus.start()
    b.bus.start()
    late: Node | None = None
    try:
        await _until(lambda: "a" in b.bus.applier.peers and "b" in a.bus.applier.peers, "a and b met")
        for q in range(3):
            a.dispatch([*system, *range(q * 100, q * 100 + 64)])
        await _until(lambda: b.bus.applier.stats.decisions == 3, "b applied a's decisions")
        assert b.bus.stats.published_bytes < a.bus.stats.published_bytes  # b only sent loads
        late = Node(nats.url, "late")
        late.bus.start()
        await _until(lambda: "late" in a.bus.applier.peers, "a heard the newcomer")
        fresh = [*system, *range(9000, 9064)]
        a.dispatch(fresh)  # the newcomer never saw the system prompt's blocks: a sends them again
        await _until(lambda: late.knows(fresh) == len(fresh), "the newcomer learned the whole prompt")
        assert late.bus.applier.stats.unresolved == 0
    finally:
        for node in (a, b, late):
            if node is not None:
                await node.bus.stop()


@pytest.mark.slow
async def test_a_gateway_whose_bus_is_down_serves_on_local_knowledge_and_joins_later(tmp_path: Path) -> None:
    """Whole process: ready and answering with NATS unreachable (sync_connected 0), then
    connected once a server appears at the URL; no request fails either way."""
    server = LocalNatsServer()  # its port is free: nobody listens yet
    async with SimFleet.start(2) as fleet:
        gw = await ServeProcess.start(
            fleet.urls, "cache_aware", log_dir=tmp_path,
            extra_args=["--sync-url", server.url, "--tokenizer-cache-dir", str(tmp_path / "tok")],
        )
        try:
            async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
                model = (await http.get(gw.url + "/v1/models")).json()["data"][0]["id"]
                body = {"model": model, "prompt": "hello " * 40, "max_tokens": 4}

                async def connected() -> float:
                    text = (await http.get(gw.url + "/metrics")).text
                    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                                if s.name == "token_gateway_sync_connected")

                for _ in range(4):
                    assert (await http.post(gw.url + "/v1/completions", json=body)).status_code == 200
                assert await connected() == 0
                await server.start()
                async with asyncio.timeout(20):
                    while await connected() != 1:  # noqa: ASYNC110 (polling the scrape)
                        await asyncio.sleep(0.1)
                for _ in range(4):
                    assert (await http.post(gw.url + "/v1/completions", json=body)).status_code == 200
        finally:
            await gw.stop()
            await server.stop()
