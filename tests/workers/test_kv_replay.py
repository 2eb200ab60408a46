"""vLLM's replay socket asked for missed batches (workers/kv_replay.py and the feeder's use of
it): a ROUTER responder over real loopback ZMQ answering as vLLM's publisher does (one message
per kept batch from the asked number, then the end mark); a gap it closes keeps the rank's
share, one it cannot close (batches no longer kept, no answer, too wide) falls back to the reset."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from gateway.workers import kv_replay
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.zmq_kv_events import BadZmqSource, parse_replay, parse_sources
from tests.fake_transport import FakeTransport, Fleet, fleet
from tests.workers.test_zmq_kv_events import (
    ENGINE,
    Publisher,
    _free_pair,
    _held,
    _payload,
    _stored,
    _until,
)


class Responder:
    """A rank's replay socket: the batches it keeps, served from the asked number on."""

    def __init__(self, address: str, *, answers: bool = True, topic: bytes | None = None) -> None:
        """``topic``: answer as SGLang 0.5.23 does, the topic before each sequence number."""
        self.sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.kept: list[tuple[int, bytes]] = []
        self.asked: list[int] = []
        self.answers = answers
        self.topic = [] if topic is None else [topic]
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            peer, delimiter, start = await self.sock.recv_multipart()
            first = int.from_bytes(start, "big")
            self.asked.append(first)
            if not self.answers:
                continue
            for seq, payload in self.kept:
                if seq >= first:
                    await self.sock.send_multipart([peer, delimiter, *self.topic, seq.to_bytes(8, "big"), payload])
            await self.sock.send_multipart([peer, delimiter, *[b"" for _ in self.topic], kv_replay.END, b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sock.close(linger=0)


@pytest.fixture
async def dp_engine() -> Fleet:
    return await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2}), policy="cache_aware")


@pytest.fixture
async def responder() -> AsyncIterator[tuple[Responder, str]]:
    address = f"tcp://127.0.0.1:{_free_pair()}"
    r = Responder(address)
    try:
        yield r, address
    finally:
        await r.close()


def test_replay_endpoints_are_dialled_at_port_plus_rank() -> None:
    assert parse_replay("tcp://*:5558").for_rank(2, "10.0.0.5") == "tcp://10.0.0.5:5560"
    assert parse_replay("tcp://0.0.0.0:5558").for_rank(0, "vllm-0") == "tcp://vllm-0:5558"
    assert parse_replay("tcp://[::]:5558").for_rank(1, "::1") == "tcp://[::1]:5559"
    assert parse_replay("tcp://10.0.0.7:5558").for_rank(1, "x") == "tcp://10.0.0.7:5559"
    assert parse_replay("ipc:///run/replay").for_rank(0, "x") == "ipc:///run/replay"
    with pytest.raises(BadZmqSource, match="ranks above 0"):
        parse_replay("ipc:///run/replay").for_rank(1, "x")
    for bad in ("udp://h:1", "tcp://h", "tcp://h:0"):
        with pytest.raises(BadZmqSource, match="replay endpoint"):
            parse_replay(bad)
    sources = parse_sources(["grpc://h:1=tcp://127.0.0.1:5557,tcp://*:5567", "grpc://h:2=tcp://*:6000"])
    assert sources["h:1"].replay == parse_replay("tcp://*:5567") and sources["h:2"].replay is None
    with pytest.raises(BadZmqSource, match="replay endpoint"):
        parse_sources(["grpc://h:1=tcp://*:5557,nope"])


async def test_fetch_returns_the_asked_batches_in_order(responder: tuple[Responder, str]) -> None:
    r, address = responder
    r.kept = [(seq, f"batch {seq}".encode()) for seq in range(3, 9)]
    assert await kv_replay.fetch(address, 4, 6) == [(4, b"batch 4"), (5, b"batch 5"), (6, b"batch 6")]
    assert await kv_replay.fetch(address, 1, 4) == [(3, b"batch 3"), (4, b"batch 4")]  # 1-2 no longer kept
    assert await kv_replay.fetch(address, 1, 20_000) == []  # wider than any buffer: not asked
    assert r.asked == [4, 1]


async def test_fetch_reads_sglangs_answers_with_their_topic() -> None:
    address = f"tcp://127.0.0.1:{_free_pair()}"
    r = Responder(address, topic=b"kv")
    r.kept = [(seq, f"batch {seq}".encode()) for seq in range(5)]
    try:
        assert await kv_replay.fetch(address, 2, 3) == [(2, b"batch 2"), (3, b"batch 3")]
        assert await kv_replay.fetch(address, 3, 9) == [(3, b"batch 3"), (4, b"batch 4")]  # to the end mark
    finally:
        await r.close()


async def test_fetch_gives_up_at_its_time_limit() -> None:
    address = f"tcp://127.0.0.1:{_free_pair()}"
    silent = Responder(address, answers=False)
    try:
        assert await kv_replay.fetch(address, 1, 2, timeout_s=0.2) == []
        assert silent.asked == [1]
    finally:
        await silent.close()


async def test_a_gap_the_replay_closes_keeps_the_share(dp_engine: Fleet, responder: tuple[Responder, str]) -> None:
    f, port = dp_engine, _free_pair()
    r, address = responder
    replay_port = int(address.rsplit(":", 1)[1])
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources(
        [f"grpc://{ENGINE}=tcp://127.0.0.1:{port},tcp://127.0.0.1:{replay_port}"]), replay_timeout_s=0.3)
    feeder.start()
    pub = Publisher(f"tcp://127.0.0.1:{port}", bind=False)  # rank 0 (its replay socket at replay_port + 0)
    try:
        zero = feeder.feeds[f"{ENGINE}@0"]
        assert zero.replay_source == address and zero.describe()["replay_source"] == address
        await pub.subscribed()
        batches = [_payload(_stored([11], [1, 2]), rank=0), _payload(_stored([12], [3, 4], parent=11), rank=0),
                   _payload(_stored([13], [5, 6], parent=12), rank=0), _payload(_stored([14], [7, 8], parent=13), rank=0)]
        r.kept = list(enumerate(batches))
        await pub.send(0, batches[0])
        await pub.send(3, batches[3])  # 1 and 2 lost on the way: asked again, applied in order
        await _until(lambda: zero.batches == 4)
        assert zero.blocks.stats.resets == 0 and _held(f, f"{ENGINE}@0", [1, 2, 3, 4, 5, 6, 7, 8]) == 8
        assert (zero.replays, zero.replays_filled, zero.replayed, r.asked) == (1, 1, 2, [1])

        # A gap the replay socket cannot close (its buffer moved on): the reset, as without one.
        r.kept = [(9, _payload(_stored([19], [9, 10]), rank=0))]
        await pub.send(10, _payload(_stored([20], [11, 12]), rank=0))
        await _until(lambda: zero.batches == 5)
        assert zero.blocks.stats.resets == 1 and (zero.replays, zero.replays_filled) == (2, 1) and r.asked == [1, 4]
        assert _held(f, f"{ENGINE}@0", [1, 2]) == 0 and _held(f, f"{ENGINE}@0", [11, 12]) == 2
    finally:
        pub.close()
        await feeder.close()
