"""One process of a ``serve --processes N`` set binds a vLLM rank's endpoint and the others
take its batches over the set's bus (``KvEventFeeder.relay`` / ``relayed``): real loopback
ZMQ publishers, a real nats-server, two gateways' registries, routers and feeders in one
event loop. Both trees hold the same pages after stores, removals, a clear and a malformed
frame; the process that binds going away hands the endpoint to the other, and one that
comes back follows it."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from gateway.proto import common_pb2
from gateway.sync.bus import SyncBus
from gateway.sync.config import SyncConfig
from gateway.sync.local_server import LocalNatsServer
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.zmq_kv_events import parse_sources
from tests.fake_transport import FakeTransport, Fleet, fleet
from tests.workers.test_zmq_kv_events import ENGINE, _free_pair, _held, _payload, _stored, _until

CFG = SyncConfig(sync_heartbeat_s=0.2, sync_peer_timeout_s=2.0, sync_flush_interval_s=0.0)
RANKS = (f"{ENGINE}@0", f"{ENGINE}@1")


class Gateway:
    """One process of the set: its fleet view, its bus and its feeder, wired as serve wires them."""

    def __init__(self, f: Fleet, nats_url: str, name: str, endpoint: str) -> None:
        self.fleet = f
        self.bus = SyncBus(CFG, f.router, f.registry, url=nats_url, origin=name)
        self.feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}={endpoint}"]),
                                    bind_retry_s=0.05)
        self.feeder.share(self.bus.outbox.kv_events, self.bus.outbox.kv_share_wanted)
        self.bus.applier.on_kv_events = self.feeder.relayed
        self.bus.applier.on_kv_share_wanted = self.feeder.share_wanted

    async def start(self) -> None:
        self.bus.start()
        await _until(lambda: self.bus.stats.connected)
        self.feeder.start()

    async def stop(self) -> None:
        await self.feeder.close()
        await self.bus.stop()

    def pages(self, worker_id: str) -> dict[int, object]:
        return dict(self.feeder.feeds[worker_id].blocks._blocks)


class Publisher:
    """A rank's publisher as vLLM makes it for an endpoint with an address: it connects out."""

    def __init__(self, address: str) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        # every subscription, also a repeat: the session of a connecting socket outlives a reader
        # that goes, so the next reader's subscription is a repeat on the same pipe
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.connect(address)
        self.seq = 0

    async def subscribed(self) -> None:
        """Until a subscription arrives (an unsubscription, a reader gone, is skipped)."""
        while (await asyncio.wait_for(self.sock.recv(), 10))[:1] != b"\x01":
            pass

    async def send(self, *events: dict[str, object], rank: int) -> None:
        await self.sock.send_multipart([b"", self.seq.to_bytes(8, "big"), _payload(*events, rank=rank)])
        self.seq += 1

    async def garbage(self) -> None:
        await self.sock.send_multipart([b"", self.seq.to_bytes(8, "big"), b"\x93garbage"])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(linger=0)


async def _dp_fleet() -> Fleet:
    return await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2}), policy="cache_aware")


def _one(seq: int, block_hash: int, tokens: list[int]) -> common_pb2.KvEventBatch:
    """A relayed batch storing one root page."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    batch.events.add().stored.blocks.add(block_hash=block_hash, token_ids=tokens, block_size=len(tokens))
    return batch


PROMPTS = ([1, 2, 3, 4], [5, 6], [7, 8, 9, 10])


def _same(a: Gateway, b: Gateway) -> bool:
    return all(a.pages(w) == b.pages(w) for w in RANKS) and all(
        _held(a.fleet, w, p) == _held(b.fleet, w, p) for w in RANKS for p in PROMPTS
    )


async def test_the_process_that_binds_hands_every_ranks_events_to_the_other(nats: LocalNatsServer) -> None:
    port = _free_pair()
    endpoint = f"tcp://127.0.0.1:{port}"
    a = Gateway(await _dp_fleet(), nats.url, "a", endpoint)
    b = Gateway(await _dp_fleet(), nats.url, "b", endpoint)
    pubs = [Publisher(f"tcp://127.0.0.1:{port + r}") for r in (0, 1)]
    c: Gateway | None = None
    running = [a, b]
    try:
        await a.start()
        for pub in pubs:
            await pub.subscribed()
        await b.start()
        await _until(lambda: all(b.feeder.feeds[w].follower for w in RANKS))
        for w in RANKS:
            fa, fb = a.feeder.feeds[w], b.feeder.feeds[w]
            assert fa.connected and not fa.follower and not fb.stopped and "in use" in fb.last_error
            row = b.fleet.worker(w).describe()
            assert row["kv_events_source"] == fa.source and "kv_events" not in row["lacks"]  # type: ignore[operator]
            assert fb.describe()["follower"] is True
        await _until(lambda: "a" in b.bus.applier.peers and "b" in a.bus.applier.peers)

        # Stores on both ranks, a removal, a clear then new pages: b's shares follow a's.
        await pubs[0].send(_stored([11, 12], [1, 2, 3, 4]), rank=0)
        await pubs[1].send(_stored([21], [5, 6]), _stored([22], [7, 8], parent=21), rank=1)
        await _until(lambda: b.feeder.feeds[RANKS[1]].relayed == 1 and b.feeder.feeds[RANKS[0]].relayed == 1)
        assert _same(a, b) and _held(b.fleet, RANKS[0], [1, 2, 3, 4]) == 4 and _held(b.fleet, RANKS[1], [5, 6, 7, 8]) == 4
        assert _held(b.fleet, RANKS[1], [1, 2, 3, 4]) == 0
        await pubs[1].send({"type": "BlockRemoved", "block_hashes": [22], "medium": "GPU"}, rank=1)
        await pubs[0].send({"type": "AllBlocksCleared"}, _stored([13], [9, 10]), rank=0)
        await _until(lambda: b.feeder.feeds[RANKS[0]].relayed == 2 and b.feeder.feeds[RANKS[1]].relayed == 2)
        assert _same(a, b) and _held(b.fleet, RANKS[1], [5, 6, 7, 8]) == 2 and _held(b.fleet, RANKS[0], [1, 2]) == 0
        assert _held(b.fleet, RANKS[0], [9, 10]) == 2

        # A malformed frame resets the share in both; the next batch applies in both, with no second reset.
        await pubs[1].garbage()
        await pubs[1].send(_stored([23], [7, 8, 9, 10], size=4), rank=1)
        await _until(lambda: b.feeder.feeds[RANKS[1]].relayed == 4)
        assert _same(a, b) and _held(b.fleet, RANKS[1], [5, 6]) == 0 and _held(b.fleet, RANKS[1], [7, 8, 9, 10]) == 4
        assert a.feeder.feeds[RANKS[1]].blocks.stats.resets == b.feeder.feeds[RANKS[1]].blocks.stats.resets == 1

        # The process that binds goes away: b takes the endpoints over and reads them itself.
        running.remove(a)
        await a.stop()
        await _until(lambda: not any(b.feeder.feeds[w].follower for w in RANKS) and all(b.feeder.feeds[w].connected for w in RANKS))
        for pub in pubs:
            await pub.subscribed()
        await pubs[0].send(_stored([14], [11, 12], parent=13), rank=0)
        await _until(lambda: b.feeder.feeds[RANKS[0]].batches >= 3)
        assert _held(b.fleet, RANKS[0], [9, 10, 11, 12]) == 4

        # A process that (re)starts finds the endpoint taken, asks b for the share b holds (b
        # answers with its pages under a reset, numbered as its last batch), then follows it.
        c = Gateway(await _dp_fleet(), nats.url, "c", endpoint)
        running.append(c)
        await c.start()
        await _until(lambda: all(c.feeder.feeds[w].follower for w in RANKS))
        await _until(lambda: all(c.pages(w) == b.pages(w) and c.feeder.feeds[w].relayed == 1 for w in RANKS))
        assert _held(c.fleet, RANKS[0], [9, 10, 11, 12]) == 4 and _held(c.fleet, RANKS[1], [7, 8, 9, 10]) == 4
        assert all(c.feeder.feeds[w].last_sequence == b.feeder.feeds[w].last_sequence for w in RANKS)
        await pubs[1].send(_stored([24], [13, 14]), rank=1)
        await _until(lambda: c.feeder.feeds[RANKS[1]].relayed == 2)
        assert _held(c.fleet, RANKS[1], [13, 14]) == 2 and c.pages(RANKS[1]) == b.pages(RANKS[1])
        assert c.feeder.feeds[RANKS[1]].blocks.stats.resets == 1  # the share's reset only: no gap after it
    finally:
        for pub in pubs:
            pub.close()
        for g in running:
            await g.stop()


async def test_only_an_address_in_use_makes_a_follower_and_only_a_follower_takes_relayed_batches() -> None:
    """An address that is not this host's stops the feed even in a set (no process can bind
    it); a feed that reads its endpoint itself ignores batches relayed for its worker."""
    from gateway.proto import common_pb2

    f = await _dp_fleet()
    sent: list[tuple[str, int, bool]] = []
    stray = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://192.0.2.1:{_free_pair()}"]),
                          bind_retry_s=0.05)
    stray.share(lambda wid, batch, reset: sent.append((wid, batch.sequence_number, reset)))
    stray.start()
    try:
        await _until(lambda: all(stray.feeds[w].stopped for w in RANKS))
        assert not any(stray.feeds[w].follower for w in RANKS) and "ZMQError" in stray.feeds[RANKS[0]].last_error
    finally:
        await stray.close()
    g = await _dp_fleet()
    port = _free_pair()
    own = KvEventFeeder(g.registry, g.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://127.0.0.1:{port}"]))
    own.share(lambda wid, batch, reset: sent.append((wid, batch.sequence_number, reset)))
    own.start()
    try:
        await _until(lambda: all(own.feeds[w].connected for w in RANKS))
        relayed = common_pb2.KvEventBatch(sequence_number=1)
        relayed.events.add().stored.blocks.add(block_hash=5, token_ids=[1, 2], block_size=2)
        own.relayed(RANKS[0], relayed, False)  # another process's batch for a rank this one reads itself
        own.relayed("unknown:1@0", relayed, True)
        assert own.feeds[RANKS[0]].relayed == 0 and _held(g, RANKS[0], [1, 2]) == 0 and sent == []
    finally:
        await own.close()


async def test_a_batch_larger_than_the_bus_takes_reaches_the_follower_in_parts(nats: LocalNatsServer) -> None:
    """One engine step storing ~350k tokens: more than NATS's default 1 MiB payload once relayed.
    It travels after the tick's message, cut into parts; the follower's share equals the binder's."""
    port = _free_pair()
    endpoint = f"tcp://127.0.0.1:{port}"
    async def big_fleet() -> Fleet:
        f = await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2, "page_size": 16}), policy="cache_aware")
        f.worker(RANKS[0]).info.kv_capacity_tokens = 1 << 23  # a KV pool (and tree budget) for the whole prefill
        return f

    a = Gateway(await big_fleet(), nats.url, "a", endpoint)
    b = Gateway(await big_fleet(), nats.url, "b", endpoint)
    pub = Publisher(endpoint)
    try:
        await a.start()
        await pub.subscribed()
        await b.start()
        await _until(lambda: b.feeder.feeds[RANKS[0]].follower and "a" in b.bus.applier.peers)
        size, blocks = 16, 22_000
        tokens = [20_000 + i % 100_000 for i in range(size * blocks)]
        await pub.send(_stored(list(range(1, blocks + 1)), tokens, size=size), rank=0)
        fb = b.feeder.feeds[RANKS[0]]
        await _until(lambda: fb.batches >= 2 and fb.parts_left == 0)
        assert a.bus.stats.kv_event_messages >= 2 and fb.relayed == fb.batches and fb.blocks.stats.resets == 0
        assert len(b.pages(RANKS[0])) == blocks and a.pages(RANKS[0]) == b.pages(RANKS[0])
        assert _held(b.fleet, RANKS[0], tokens) == _held(a.fleet, RANKS[0], tokens) == len(tokens)
        # The next batch follows on with no gap, no reset.
        fresh = list(range(1, size + 1))
        await pub.send(_stored([blocks + 1], fresh, size=size), rank=0)
        await _until(lambda: _held(b.fleet, RANKS[0], fresh) == size)
        assert fb.blocks.stats.resets == 0 and fb.last_sequence == a.feeder.feeds[RANKS[0]].last_sequence

        # A continuation whose start was lost on the bus: the share reset, the part skipped.
        seq = fb.last_sequence + 1
        b.feeder.relayed(RANKS[0], _one(seq, 900, fresh), False, 1, 2)
        assert fb.blocks.stats.resets == 1 and _held(b.fleet, RANKS[0], fresh) == 0 and fb.last_sequence == seq
        # A batch whose last part never comes: the next batch resets the share before it applies.
        b.feeder.relayed(RANKS[0], _one(seq + 1, 901, fresh), False, 0, 2)
        assert fb.parts_left == 1 and _held(b.fleet, RANKS[0], fresh) == size
        b.feeder.relayed(RANKS[0], _one(seq + 2, 902, tokens[:size]), False, 0, 0)
        assert fb.blocks.stats.resets == 2 and fb.parts_left == 0 and "did not arrive" in fb.last_error
        assert _held(b.fleet, RANKS[0], fresh) == 0 and _held(b.fleet, RANKS[0], tokens[:size]) == size
    finally:
        pub.close()
        for g in (a, b):
            await g.stop()
