"""vLLM's per-rank KV-event publishers read over ZMQ (workers/zmq_kv_events.py and the
feeder's per-rank feeds): endpoints and which end binds, frames read into common batches,
and a fake publisher per rank over real loopback ZMQ sockets: each rank's events reach
that rank's share only; another rank's batch, a malformed frame, a restarted publisher and
a sequence gap are logged, counted, and never end the feed."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.server.config import ServerConfig
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.zmq_kv_events import (
    BadFrame,
    BadZmqSource,
    WrongRank,
    block_key,
    parse_endpoint,
    parse_sources,
    read_frame,
)
from tests.fake_transport import MODEL, FakeTransport, Fleet, fleet

ENGINE = "127.0.0.1:1"


def _stored(hashes: list[Any], tokens: list[int], *, parent: Any = None, size: int = 2, medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": size, "lora_id": None, "medium": medium, "lora_name": None}


def _payload(*events: dict[str, Any], rank: int | None = 0) -> bytes:
    """A batch encoded as vLLM 0.34's publisher encodes it: an array [ts, events, rank] (the
    rank left out when unset), each event a map tagged by its class name."""
    batch: list[Any] = [1.5, list(events)]
    if rank is not None:
        batch.append(rank)
    return msgspec.msgpack.encode(batch)


def _frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


# --- endpoints -------------------------------------------------------------------------


def test_which_end_binds_follows_vllms_rule() -> None:
    wild = parse_endpoint("tcp://*:5557")
    assert wild.vllm_binds and wild.for_rank(0, "10.0.0.5") == ("tcp://10.0.0.5:5557", False)
    assert wild.for_rank(3, "vllm-0.svc") == ("tcp://vllm-0.svc:5560", False)
    here = parse_endpoint("tcp://127.0.0.1:5557")
    assert not here.vllm_binds and here.for_rank(1, "10.0.0.5") == ("tcp://127.0.0.1:5558", True)
    # vLLM binds any endpoint with "::" in it: the gateway connects, to that address or the worker's host.
    assert parse_endpoint("tcp://[::1]:7000").for_rank(1, "x") == ("tcp://[::1]:7001", False)
    assert parse_endpoint("tcp://[::]:7000").for_rank(1, "::1") == ("tcp://[::1]:7001", False)
    assert parse_endpoint("tcp://[fd00::5]:7000").for_rank(0, "x") == ("tcp://[fd00::5]:7000", False)
    assert parse_endpoint("tcp://[fd00:1:2:3:4:5:6:7]:7000").for_rank(0, "x") == ("tcp://[fd00:1:2:3:4:5:6:7]:7000", True)
    ipc = parse_endpoint("ipc:///run/kv.ipc")
    assert ipc.for_rank(0, "h") == ("ipc:///run/kv.ipc", False)
    with pytest.raises(BadZmqSource, match="ranks above 0"):
        ipc.for_rank(1, "h")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("tcp://0.0.0.0:5557", "never binds every interface"),
        ("tcp://vllm-host:5557", "must be an IP address"),
        ("tcp://127.0.0.1", "host and a port"),
        ("tcp://127.0.0.1:0", "host and a port"),
        ("udp://127.0.0.1:5557", "tcp://HOST:PORT or ipc://PATH"),
    ],
)
def test_bad_endpoints_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(BadZmqSource, match=why):
        parse_endpoint(text)


def test_sources_are_keyed_by_the_engine_and_checked_at_start() -> None:
    sources = parse_sources(["http://localhost:8000=tcp://*:5557", "grpc://10.0.0.2:9=tcp://127.0.0.1:6000"])
    assert set(sources) == {"127.0.0.1:8000", "10.0.0.2:9"}
    for bad, why in [(["http://h:1"], "WORKER_URL=ENDPOINT"), (["ftp://h:1=tcp://*:1"], "grpc://"),
                     (["http://h:1=tcp://*:1", "http://h:1=tcp://*:2"], "twice")]:
        with pytest.raises(BadZmqSource, match=why):
            parse_sources(bad)
    with pytest.raises(ValueError, match="needs --kv-events"):
        ServerConfig(kv_events_zmq=["http://h:1=tcp://*:5557"])
    with pytest.raises(BadZmqSource):
        ServerConfig(kv_events=True, kv_events_zmq=["http://h:1=tcp://0.0.0.0:5557"])
    assert ServerConfig(kv_events=True, kv_events_zmq=["http://h:1=tcp://*:5557"]).kv_events_zmq


# --- frames ----------------------------------------------------------------------------


def test_a_batch_becomes_the_common_batch_numbered_from_one() -> None:
    payload = _payload(
        _stored([11, 12], [1, 2, 3, 4], parent=2**64 - 1),
        _stored([b"\x01" * 32], [5, 6], parent=12),
        _stored([99], [7, 8], medium="CPU"),  # an offloaded copy: not the GPU cache
        {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
        rank=1,
    )
    batch = read_frame(_frames(0, payload), 1)
    assert batch.sequence_number == 1 and batch.dp_rank == 1 and batch.timestamp == 1.5
    assert [e.WhichOneof("data") for e in batch.events] == ["stored", "stored", "removed", "cleared"]
    first = batch.events[0].stored
    assert first.parent_block_hash == -1  # 2**64 - 1 as an int64
    assert [(b.block_hash, list(b.token_ids), b.block_size) for b in first.blocks] == [(11, [1, 2], 2), (12, [3, 4], 2)]
    assert batch.events[1].stored.blocks[0].block_hash == block_key(b"\x01" * 32)
    assert list(batch.events[2].removed.block_hashes) == [12]
    assert read_frame(_frames(4, _payload(rank=None)), 2).sequence_number == 5  # no rank said: taken as the socket's
    # Releases that encode a batch as a map read the same.
    as_map = msgspec.msgpack.encode({"ts": 2.0, "events": [_stored([11], [1, 2])], "data_parallel_rank": 3})
    assert read_frame(_frames(0, as_map), 3).events[0].stored.blocks[0].token_ids == [1, 2]


def test_frames_that_are_not_batches_are_told_apart() -> None:
    with pytest.raises(WrongRank, match="rank 1's, read on rank 0's"):
        read_frame(_frames(3, _payload(rank=1)), 0)
    with pytest.raises(BadFrame, match="frame") as err:
        read_frame([b"", b"\x00"], 0)
    assert err.value.sequence is None
    for payload in (b"\x93garbage", msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "BlockMoved"}]}),
                    _payload(_stored([1, 2], [1, 2, 3])), _payload(_stored([1], [-1, 2]))):
        # not msgpack; an unknown event; tokens that are not whole blocks; an id no token has
        with pytest.raises(BadFrame) as err:
            read_frame(_frames(7, payload), 0)
        assert err.value.sequence == 7


# --- the feeder over real ZMQ sockets ------------------------------------------------------


def _free_pair() -> int:
    """A loopback port P with P and P + 1 both free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free loopback ports")


class Publisher:
    """One rank's publisher, as vLLM's: sends [topic, sequence, batch]. An XPUB socket, so
    the test knows when the gateway's subscription has arrived (nothing is lost before)."""

    def __init__(self, address: str, *, bind: bool) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(address)

    async def subscribed(self) -> None:
        await asyncio.wait_for(self.sock.recv(), 10)

    async def send(self, seq: int, payload: bytes) -> None:
        await self.sock.send_multipart(_frames(seq, payload))

    def close(self) -> None:
        self.sock.close(linger=0)


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _held(f: Fleet, worker_id: str, ids: list[int]) -> int:
    policy = f.router.policy(MODEL, "regular")
    assert isinstance(policy, CacheAwarePolicy)
    return policy.tree(MODEL).match(ids).per_worker.get(worker_id, 0)


@pytest.fixture
async def dp_engine() -> AsyncIterator[Fleet]:
    f = await fleet(FakeTransport(f"grpc://{ENGINE}", server_args={"dp_size": 2}), policy="cache_aware")
    yield f


async def test_each_ranks_publisher_feeds_its_own_share_and_bad_input_is_counted(dp_engine: Fleet) -> None:
    """vLLM connects (an endpoint with an address): the gateway binds that address at port + rank."""
    f, port = dp_engine, _free_pair()
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://127.0.0.1:{port}"]))
    feeder.start()
    pubs = [Publisher(f"tcp://127.0.0.1:{port + r}", bind=False) for r in (0, 1)]
    try:
        zero, one = feeder.feeds[f"{ENGINE}@0"], feeder.feeds[f"{ENGINE}@1"]
        assert (zero.source, one.source) == (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
        f.worker(f"{ENGINE}@0").client.lacks = frozenset({"kv_events"})  # type: ignore[misc]  # as vLLM's HTTP client says
        for rank in (0, 1):
            row = f.worker(f"{ENGINE}@{rank}").describe()
            assert "kv_events" not in row["lacks"] and row["kv_events_source"] == f"tcp://127.0.0.1:{port + rank}"  # type: ignore[operator]
        for pub in pubs:
            await pub.subscribed()

        await pubs[1].send(0, _payload(_stored([11, 12], [1, 2, 3, 4]), rank=1))
        await _until(lambda: one.batches == 1)
        assert _held(f, f"{ENGINE}@1", [1, 2, 3, 4]) == 4 and _held(f, f"{ENGINE}@0", [1, 2, 3, 4]) == 0

        # Rank 1's batch on rank 0's endpoint (ports crossed): dropped, counted; rank 0 keeps its share.
        await pubs[0].send(0, _payload(_stored([21], [5, 6]), rank=0))
        await _until(lambda: zero.batches == 1)
        await pubs[0].send(1, _payload(_stored([31], [7, 8]), rank=1))
        await _until(lambda: zero.wrong_rank == 1)
        assert _held(f, f"{ENGINE}@0", [5, 6]) == 2 and _held(f, f"{ENGINE}@0", [7, 8]) == 0 and zero.blocks.stats.resets == 0
        assert "rank 1's" in zero.last_error and zero.describe()["wrong_rank"] == 1

        # A malformed frame: counted, the rank's share reset (its events are lost); the next batch applies.
        await pubs[1].send(1, b"\x93garbage")
        await _until(lambda: one.malformed == 1)
        assert _held(f, f"{ENGINE}@1", [1, 2, 3, 4]) == 0 and one.blocks.stats.resets == 1
        await pubs[1].send(2, _payload(_stored([41], [9, 10]), rank=1))
        await _until(lambda: one.batches == 2)
        assert _held(f, f"{ENGINE}@1", [9, 10]) == 2 and one.blocks.stats.resets == 1  # no second reset

        # The publisher restarts (its numbers begin at 0 again), then loses batches: each a reset.
        await pubs[1].send(0, _payload(_stored([51], [11, 12]), rank=1))
        await _until(lambda: one.batches == 3)
        assert one.blocks.stats.resets == 2 and _held(f, f"{ENGINE}@1", [9, 10]) == 0 and _held(f, f"{ENGINE}@1", [11, 12]) == 2
        await pubs[1].send(5, _payload(_stored([61], [13, 14]), rank=1))
        await _until(lambda: one.batches == 4)
        assert one.blocks.stats.resets == 3 and one.last_sequence == 6 and one.connected
        assert feeder._tasks[f"{ENGINE}@1"].done() is False  # the feed goes on
    finally:
        for pub in pubs:
            pub.close()
        await feeder.close()


async def test_the_gateway_connects_where_vllm_binds_every_interface(dp_engine: Fleet) -> None:
    """``tcp://*:PORT`` in vLLM's config: vLLM binds, the gateway connects to the worker's host."""
    f, port = dp_engine, _free_pair()
    pubs = [Publisher(f"tcp://127.0.0.1:{port + r}", bind=True) for r in (0, 1)]
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://*:{port}"]))
    feeder.start()
    try:
        for pub in pubs:
            await pub.subscribed()
        await pubs[0].send(7, _payload(_stored([11], [1, 2]), rank=0))
        await pubs[1].send(3, _payload(_stored([12], [3, 4]), rank=1))
        zero, one = feeder.feeds[f"{ENGINE}@0"], feeder.feeds[f"{ENGINE}@1"]
        await _until(lambda: zero.batches == 1 and one.batches == 1)
        assert _held(f, f"{ENGINE}@0", [1, 2]) == 2 and _held(f, f"{ENGINE}@1", [3, 4]) == 2
        assert _held(f, f"{ENGINE}@1", [1, 2]) == 0 and zero.source == f"tcp://127.0.0.1:{port}"
    finally:
        for pub in pubs:
            pub.close()
        await feeder.close()


async def test_a_port_that_cannot_be_bound_stops_that_feed_only(dp_engine: Fleet) -> None:
    f, port = dp_engine, _free_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://127.0.0.1:{port}"]))
        feeder.start()
        try:
            zero, one = feeder.feeds[f"{ENGINE}@0"], feeder.feeds[f"{ENGINE}@1"]
            await _until(lambda: one.stopped)
            assert "ZMQError" in one.last_error and not one.connected
            assert zero.connected and not zero.stopped
        finally:
            await feeder.close()


# --- SGLang's publisher: the same frames and batch -------------------------------------------


class _Sg(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """SGLang 0.5.23's event classes as it declares them: maps tagged by class name, a field
    left at None omitted, a stored block with fields vLLM's lacks."""


class _SgStored(_Sg, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class _SgRemoved(_Sg, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _SgEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    """Earlier releases' event classes (array-like, tagged by class name)."""


class BlockStored(_SgEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class _SgMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class _SaltedStored(BlockStored, tag="BlockStored", kw_only=True):
    metadata: _SgMetadata


class BlockRemoved(_SgEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(_SgEvent):
    pass


class _SgBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


def _sglang(*events: msgspec.Struct, rank: int | None) -> bytes:
    return msgspec.msgpack.encode(_SgBatch(2.5, list(events), rank))


def test_sglang_0523s_batches_read_as_vllms() -> None:
    payload = _sglang(
        _SgStored([2**63 + 5, 12], None, [1, 2, 3, 4], 2, None, cache_salt="tenant-a", session_id="s1"),
        _SgStored([99], 12, [7, 8], 2, None, medium="CPU_PINNED"),  # a host-memory copy: not the GPU cache
        _SgRemoved([12], "GPU"),
        rank=1,
    )
    events = msgspec.msgpack.decode(payload)[1]
    assert events[0]["type"] == "BlockStored" and "medium" not in events[0] and events[0]["cache_salt"] == "tenant-a"
    batch = read_frame(_frames(2, payload), 1)
    assert batch.sequence_number == 3 and batch.dp_rank == 1
    assert [e.WhichOneof("data") for e in batch.events] == ["stored", "removed"]
    assert [b.block_hash for b in batch.events[0].stored.blocks] == [block_key(2**63 + 5), 12]
    assert list(batch.events[1].removed.block_hashes) == [12]


def test_earlier_releases_array_events_read_too() -> None:
    payload = _sglang(
        BlockStored([2**63 + 5, 12], None, [1, 2, 3, 4], 2, None, "GPU"),
        _SaltedStored([13], 12, [5, 6], 2, None, "GPU", metadata=_SgMetadata("tenant-a")),
        BlockStored([99], None, [7, 8], 2, None, "CPU_PINNED"),  # a host-memory copy: not the GPU cache
        BlockRemoved([12], "GPU"),
        AllBlocksCleared(),
        rank=1,
    )
    assert msgspec.msgpack.decode(payload)[1][0][0] == "BlockStored"  # arrays led by the type's name
    batch = read_frame(_frames(6, payload), 1)
    assert batch.sequence_number == 7 and batch.dp_rank == 1
    assert [e.WhichOneof("data") for e in batch.events] == ["stored", "stored", "removed", "cleared"]
    assert [b.block_hash for b in batch.events[0].stored.blocks] == [block_key(2**63 + 5), 12]
    assert batch.events[1].stored.parent_block_hash == 12 and list(batch.events[1].stored.blocks[0].token_ids) == [5, 6]
    with pytest.raises(WrongRank):
        read_frame(_frames(0, _sglang(AllBlocksCleared(), rank=0)), 1)
    with pytest.raises(BadZmqSource, match=r"write tcp://\*:PORT"):
        parse_endpoint("tcp://0.0.0.0:5557")  # SGLang binds it; the gateway cannot tell it from vLLM's connect


async def test_an_sglang_engines_ranks_learn_from_their_own_publishers(dp_engine: Fleet) -> None:
    """An engine with DP ranks (the fake worker answers as SGLang's scheduler service): without an entry
    its ranks learn from routing; with one, each rank's publisher feeds its share."""
    f, port = dp_engine, _free_pair()
    assert "kv_events" in f.worker(f"{ENGINE}@1").describe()["lacks"]  # type: ignore[operator]
    pubs = [Publisher(f"tcp://127.0.0.1:{port + r}", bind=True) for r in (0, 1)]  # SGLang binds tcp://*:PORT
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=parse_sources([f"grpc://{ENGINE}=tcp://*:{port}"]))
    feeder.start()
    try:
        for pub in pubs:
            await pub.subscribed()
        await pubs[1].send(0, _sglang(BlockStored([31, 32], None, [1, 2, 3, 4], 2, None), rank=1))
        one = feeder.feeds[f"{ENGINE}@1"]
        await _until(lambda: one.batches == 1)
        assert _held(f, f"{ENGINE}@1", [1, 2, 3, 4]) == 4 and _held(f, f"{ENGINE}@0", [1, 2, 3, 4]) == 0
        assert "kv_events" not in f.worker(f"{ENGINE}@1").describe()["lacks"]  # type: ignore[operator]
    finally:
        for pub in pubs:
            pub.close()
        await feeder.close()
