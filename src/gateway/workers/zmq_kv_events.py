"""An engine's KV-cache events read from its own ZMQ publishers, one per data-parallel rank (vLLM, SGLang).

vLLM's gRPC servicer relays the events of rank 0 only, and its OpenAI server relays none.
A data-parallel vLLM (``--data-parallel-size N``) gives each rank's scheduler its own
publisher on the configured port plus the rank, and each rank's events describe that
rank's cache, which is its own routing target here. So the gateway reads each rank's
publisher itself (``serve --kv-events-zmq URL=ENDPOINT``, ENDPOINT as given to vLLM's
``--kv-events-config``) and hands the batches to the feeder (``workers.kv_events``).

Which end binds follows vLLM's own rule for its publisher socket:

* ``tcp://*:PORT``: vLLM binds (every interface); the gateway connects to the worker's
  host at PORT + rank;
* ``tcp://ADDRESS:PORT``: vLLM connects; the gateway binds ADDRESS (an address of its own
  host, e.g. 127.0.0.1; never a wildcard) at PORT + rank. vLLM binds an address with
  ``::`` in it instead (``[::1]``), and the gateway then connects to it;
* ``ipc://PATH``: vLLM binds; the gateway connects. vLLM refuses it for a rank above 0.

vLLM's replay endpoint (``replay_endpoint``, given after a comma: ``ENDPOINT,REPLAY``) is a
socket vLLM always binds, rank N at its port + N: the gateway connects to it (a wildcard
host means the worker's) to ask for missed batches (``workers.kv_replay``).

SGLang's publisher (``--kv-events-config``, read in 0.5.23) speaks the same protocol, batch
and events with the same rule (one publisher per attention-DP rank, or per DP replica
without DP attention, at the port + that rank; ``*``, ``::`` and ipc bound), except that it
also binds ``0.0.0.0``, which the gateway refuses (it would bind it for vLLM): write
``tcp://*:PORT`` for an SGLang worker that listens. Its config's ``bind`` overrides the
rule; the entry must then be written the way the rule reads it. Its gRPC
``SubscribeKvEvents`` stream is rank 0's, so this is how an SGLang engine's other ranks are
read.

A frame is ``[topic, sequence (8 bytes, big-endian), msgpack batch]``. The batch is read
with msgspec into the classes below (vLLM's field names; fields it adds later are
ignored, as are the fields SGLang adds to a stored block), its events as maps (vLLM 0.34,
SGLang 0.5.23) or as arrays led by the type's name (earlier releases of both) and becomes the common ``KvEventBatch`` the feeder applies to the rank's share
of the tree, numbered sequence + 1 so that 0 keeps meaning "nothing seen yet" there.
Block hashes (ints of any width, or bytes) are reduced to the int64 the common batch
carries. Events of another medium than the GPU (an offloading connector's CPU copies) are
left out: the tree models the cache a request's prefill reuses.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import msgspec
import xxhash
import zmq
import zmq.asyncio

from gateway.proto import common_pb2
from gateway.workers.address import parse_worker_url

_INT64_SIGN = 1 << 63
_UINT64_MASK = (1 << 64) - 1


class BadZmqSource(ValueError):
    """A ``--kv-events-zmq`` entry that is not ``WORKER_URL=ENDPOINT``."""


class BadFrame(ValueError):
    """A frame that is not one of vLLM's event batches; ``sequence`` is its number when readable."""

    def __init__(self, message: str, sequence: int | None = None) -> None:
        super().__init__(message)
        self.sequence = sequence


class WrongRank(ValueError):
    """A batch that says it comes from another data-parallel rank than the socket's."""


@dataclass(frozen=True, slots=True)
class ReplayEndpoint:
    """vLLM's replay endpoint as configured there, for rank 0: vLLM binds it, the gateway connects."""

    scheme: str  # "tcp" or "ipc"
    host: str  # "" for a wildcard (the worker's host is dialled) and for ipc
    port: int  # 0 for ipc
    path: str = ""  # ipc only

    def for_rank(self, rank: int, worker_host: str) -> str:
        """The address of ``rank``'s replay socket on a worker at ``worker_host``."""
        if self.scheme == "ipc":
            if rank:
                raise BadZmqSource(f"ipc://{self.path}: vLLM gives ranks above 0 no ipc replay endpoint (use tcp)")
            return f"ipc://{self.path}"
        host = self.host or worker_host
        shown = f"[{host}]" if ":" in host else host
        return f"tcp://{shown}:{self.port + rank}"


def _split_endpoint(text: str, what: str) -> tuple[str, str, int]:
    """(scheme, host or ipc path, port) of a ZMQ endpoint as vLLM's config takes it:
    ``tcp://HOST:PORT`` (a bracketed IPv6 host unbracketed) or ``ipc://PATH`` (port 0)."""
    scheme, sep, rest = text.strip().partition("://")
    if not sep or scheme not in ("tcp", "ipc") or not rest:
        raise BadZmqSource(f"{what} must be tcp://HOST:PORT or ipc://PATH, got {text!r}")
    if scheme == "ipc":
        return scheme, rest, 0
    host, sep, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadZmqSource(f"{what} needs a host and a port in 1-65535: {text!r}")
    return scheme, host, int(port)


def parse_replay(text: str) -> ReplayEndpoint:
    """``tcp://*:5558``, ``tcp://HOST:5558`` or ``ipc:///path``, as vLLM's config takes them."""
    scheme, host, port = _split_endpoint(text, "KV-event replay endpoint")
    if scheme == "ipc":
        return ReplayEndpoint("ipc", "", 0, host)
    return ReplayEndpoint("tcp", "" if host in ("*", "0.0.0.0", "::") else host, port)


@dataclass(frozen=True, slots=True)
class ZmqEndpoint:
    """vLLM's publisher endpoint as configured there, for rank 0."""

    scheme: str  # "tcp" or "ipc"
    host: str  # "*" when vLLM binds every interface; "" for ipc
    port: int  # 0 for ipc
    path: str = ""  # ipc only
    vllm_binds: bool = True  # vLLM's rule: it binds a wildcard, any "::" and ipc, connects to the rest
    replay: ReplayEndpoint | None = None  # where missed batches can be asked again (none: a gap resets)

    def for_rank(self, rank: int, worker_host: str) -> tuple[str, bool]:
        """(address, the gateway binds it) of ``rank``'s publisher on a worker at ``worker_host``."""
        if self.scheme == "ipc":
            if rank:
                raise BadZmqSource(f"ipc://{self.path}: vLLM gives ranks above 0 no ipc endpoint (use tcp)")
            return f"ipc://{self.path}", False
        host = worker_host if self.host == "*" else self.host
        shown = f"[{host}]" if ":" in host else host
        return f"tcp://{shown}:{self.port + rank}", not self.vllm_binds


def parse_endpoint(text: str) -> ZmqEndpoint:
    """``tcp://*:5557``, ``tcp://127.0.0.1:5557`` or ``ipc:///path``, as vLLM's config takes them."""
    scheme, host, port = _split_endpoint(text, "KV-event endpoint")
    if scheme == "ipc":
        return ZmqEndpoint("ipc", "", 0, host)
    vllm_binds = "*" in host or "::" in host
    if host == "*":
        return ZmqEndpoint("tcp", host, port)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise BadZmqSource(
            f"KV-event endpoint {text!r}: vLLM connects to it and the gateway binds it, so its host must be"
            " an IP address of the gateway's host (a name is not bound)"
        ) from None
    if address.is_unspecified:
        if vllm_binds:  # [::]: vLLM binds every interface, as with *
            return ZmqEndpoint("tcp", "*", port)
        raise BadZmqSource(
            f"KV-event endpoint {text!r}: the gateway never binds every interface; name one address (for a"
            " worker that binds every interface, write tcp://*:PORT)"
        )
    return ZmqEndpoint("tcp", address.compressed, port, vllm_binds=vllm_binds)


AUTO = "auto"
"""The ``--kv-events-zmq`` item that reads each worker's publisher from what it reports
(``workers.kv_event_discovery``) where no entry names one."""


def wants_discovery(items: Iterable[str]) -> bool:
    """Whether ``--kv-events-zmq`` has the ``auto`` item."""
    return any(item.strip() == AUTO for item in items)


def parse_sources(items: Iterable[str]) -> dict[str, ZmqEndpoint]:
    """``["grpc://h:1=tcp://*:5557", "grpc://h:2=tcp://*:5557,tcp://*:5558", ...]`` -> {engine id
    ``h:1``: endpoint}; a second endpoint after a comma is the replay endpoint. The ``auto``
    item is not an entry (``wants_discovery``)."""
    out: dict[str, ZmqEndpoint] = {}
    for item in items:
        if item.strip() == AUTO:
            continue
        url, sep, endpoint = item.partition("=")
        if not sep:
            raise BadZmqSource(f"--kv-events-zmq takes WORKER_URL=ENDPOINT, got {item!r}")
        try:
            target = parse_worker_url(url).target
        except ValueError as exc:
            raise BadZmqSource(f"--kv-events-zmq {item!r}: {exc}") from None
        if target in out:
            raise BadZmqSource(f"--kv-events-zmq names {url} twice")
        endpoint, comma, replay = endpoint.partition(",")
        parsed = parse_endpoint(endpoint)
        out[target] = dataclasses.replace(parsed, replay=parse_replay(replay)) if comma else parsed
    return out


# --- vLLM's batch as it is encoded (msgspec structs, map-encoded, events tagged by class name) ---


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


# The same events encoded as arrays, the type's name first (earlier releases of both engines). Trailing
# elements these do not name (SGLang's request metadata on a salted block) are ignored.
class _StoredArray(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class _RemovedArray(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None


class _ClearedArray(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None  # SGLang's attn_dp_rank, in the same place


class _ArrayEventsBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_StoredArray | _RemovedArray | _ClearedArray]
    data_parallel_rank: int | None = None


class _MapBatch(msgspec.Struct):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


# vLLM 0.34 and SGLang 0.5.23 encode a batch as an array ([ts, events, rank]) of map events;
# other vLLM releases the batch as a map; earlier releases of both the batch and its events as arrays.
_ARRAY = msgspec.msgpack.Decoder(_Batch)
_MAP = msgspec.msgpack.Decoder(_MapBatch)
_ARRAY_EVENTS = msgspec.msgpack.Decoder(_ArrayEventsBatch)
_AnyBatch = _Batch | _MapBatch | _ArrayEventsBatch
_STORED = (_Stored, _StoredArray)
_REMOVED = (_Removed, _RemovedArray)


def _decode(payload: bytes) -> _AnyBatch:
    try:
        return _ARRAY.decode(payload)
    except msgspec.DecodeError as first:
        for decoder in (_ARRAY_EVENTS, _MAP):
            try:
                return decoder.decode(payload)
            except msgspec.DecodeError:
                continue
        raise first


def block_key(value: int | bytes) -> int:
    """A block hash as the int64 the common batch carries: an int's low 64 bits, or a
    hash of a byte string's bytes (vLLM names blocks either way, by its configuration)."""
    if isinstance(value, bytes):
        value = xxhash.xxh3_64_intdigest(value)
    value &= _UINT64_MASK
    return value - (1 << 64) if value & _INT64_SIGN else value


def _on_gpu(medium: str | None) -> bool:
    return medium is None or medium.upper() == "GPU"


def read_frame(frames: list[bytes], rank: int) -> common_pb2.KvEventBatch:
    """One multipart message of ``rank``'s publisher as a common batch; ``BadFrame`` or
    ``WrongRank`` when it is not one."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise BadFrame(f"expected [topic, 8-byte sequence, batch], got {len(frames)} frame(s)")
    sequence = int.from_bytes(frames[1], "big")
    try:
        batch = _decode(frames[2])
    except msgspec.DecodeError as exc:  # ValidationError is one
        raise BadFrame(f"batch {sequence}: {exc}", sequence) from None
    if batch.data_parallel_rank is not None and batch.data_parallel_rank != rank:
        raise WrongRank(f"batch {sequence} is rank {batch.data_parallel_rank}'s, read on rank {rank}'s endpoint")
    try:
        return _common(batch, sequence, rank)
    except (ValueError, TypeError) as exc:  # ids or sizes out of the common batch's ranges
        raise BadFrame(f"batch {sequence}: {exc}", sequence) from None


def _common(batch: _AnyBatch, sequence: int, rank: int) -> common_pb2.KvEventBatch:
    """The batch's GPU events in the common shape (ValueError for ids or sizes it cannot hold)."""
    out = common_pb2.KvEventBatch(sequence_number=sequence + 1, timestamp=batch.ts, dp_rank=rank)
    for event in batch.events:
        if isinstance(event, _STORED):
            if not _on_gpu(event.medium):
                continue
            size = event.block_size
            if size < 1 or len(event.token_ids) != size * len(event.block_hashes):
                raise ValueError(f"{len(event.block_hashes)} block(s) of {size} tokens carry {len(event.token_ids)} token ids")
            stored = out.events.add().stored
            if event.parent_block_hash is not None:
                stored.parent_block_hash = block_key(event.parent_block_hash)
            for i, h in enumerate(event.block_hashes):
                stored.blocks.add(block_hash=block_key(h), token_ids=event.token_ids[i * size : (i + 1) * size], block_size=size)
        elif isinstance(event, _REMOVED):
            if _on_gpu(event.medium):
                out.events.add().removed.block_hashes.extend(block_key(h) for h in event.block_hashes)
        else:
            out.events.add().cleared.SetInParent()
    return out


class RankSubscriber:
    """One rank's publisher, subscribed to (or bound for) on the event loop's ZMQ context."""

    def __init__(self, endpoint: ZmqEndpoint, rank: int, worker_host: str) -> None:
        self.rank = rank
        self.address, self.binds = endpoint.for_rank(rank, worker_host)
        self._socket: zmq.asyncio.Socket | None = None

    def open(self) -> None:
        """Bind or connect now (a bind error, e.g. a port in use, raises ``zmq.ZMQError``)."""
        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: the endpoint is the rank's alone
        try:
            if self.binds:
                sock.bind(self.address)
            else:
                sock.connect(self.address)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        self._socket = sock

    async def frames(self) -> AsyncIterator[list[bytes]]:
        """Every multipart message, as it comes (ZMQ reconnects a lost peer by itself)."""
        if self._socket is None:
            self.open()
        assert self._socket is not None
        while True:
            yield await self._socket.recv_multipart()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None


__all__ = [
    "AUTO",
    "BadFrame",
    "BadZmqSource",
    "RankSubscriber",
    "ReplayEndpoint",
    "WrongRank",
    "ZmqEndpoint",
    "block_key",
    "parse_endpoint",
    "parse_replay",
    "parse_sources",
    "read_frame",
    "wants_discovery",
]
