"""The NATS side of sync: one connection per process, one subject per gateway set.

Never in a request's way: the connection is made in the background (a gateway whose
bus is down routes on local knowledge), publishing only appends to the client's
buffer, and a lost server is retried forever by nats-py. Each transition logs one
line and moves ``token_gateway_sync_connected``. After a reconnect the process
re-announces its full load at once and its recent decisions (twice, the second time
after peers have had time to re-subscribe), so the others' trees catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.proto import sync_pb2
from gateway.sync import kv_split
from gateway.sync.apply import Applier, PolicySource, WorkerSource
from gateway.sync.config import SyncConfig
from gateway.sync.outbox import Outbox
from gateway.sync.prefix_book import PrefixBook
from gateway.workers.load import WorkerLoad

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 0.2  # first wait after a failed initial connect (doubles up to CONNECT_RETRY_MAX_S)
CONNECT_RETRY_MAX_S = 2.0
RECONNECT_WAIT_S = 0.5  # nats-py's pause between reconnect attempts
REPLAY_AGAIN_S = 1.0
FULL_EVERY = 4  # heartbeats between two full restatements of this process's load
DEFAULT_MAX_PAYLOAD = 1 << 20  # NATS's own default, until the server says its limit
ENVELOPE_BYTES = 512  # a message's fields beside its relayed KV events (origin, number, time, set)


@dataclass
class BusStats:
    connected: bool = False
    connects: int = 0
    disconnects: int = 0
    published_batches: int = 0
    published_bytes: int = 0
    published_decisions: int = 0
    dropped_batches: int = 0  # not connected yet, or the client's buffer was full
    replayed_decisions: int = 0
    kv_event_messages: int = 0  # messages of their own for relayed KV events a tick's batch was too large to carry


def make_origin() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class SyncBus:
    def __init__(
        self,
        config: SyncConfig,
        router: PolicySource,
        workers: WorkerSource,
        *,
        url: str | None = None,
        origin: str | None = None,
        on_lag: Callable[[list[float]], None] = lambda seconds: None,
        host_set: str = "",
    ) -> None:
        """``host_set``: the same-host set this process belongs to when its siblings share
        its requests in prefill through memory (empty otherwise; ``Batch.host_set``)."""
        self.config = config
        self.url = url or config.sync_url or ""
        self.origin = origin or make_origin()
        self.workers = workers
        self.book = PrefixBook(config.sync_block_tokens) if config.sync_encoding == "blocks" else None
        self.outbox = Outbox(
            self.origin, self._own_load, self._page_size, on_pending=self._wake, book=self.book, host_set=host_set
        )
        self.applier = Applier(
            self.origin, router, workers, peer_timeout_s=config.sync_peer_timeout_s, on_lag=on_lag, book=self.book,
            host_set=host_set,
        )
        self.stats = BusStats()
        self._nc: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending = asyncio.Event()
        self._closing = False

    # ------------------------------------------------------------ outbox inputs
    def _own_load(self, worker_id: str) -> WorkerLoad | None:
        w = self.workers.get(worker_id)
        return None if w is None else w.load

    def _page_size(self, worker_id: str) -> int:
        w = self.workers.get(worker_id)
        return 1 if w is None else max(1, w.info.page_size)

    def _wake(self) -> None:
        self._pending.set()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Connect and serve in the background; returns at once."""
        self._tasks = [
            asyncio.create_task(self._connect(), name="sync-connect"),
            asyncio.create_task(self._publisher(), name="sync-publish"),
            asyncio.create_task(self._heartbeat(), name="sync-heartbeat"),
        ]

    async def stop(self) -> None:
        self._closing = True
        nc = self._nc
        if nc is not None and nc.is_connected:
            await self._send(self.outbox.take(goodbye=True))
            with contextlib.suppress(Exception):
                await nc.flush(timeout=1)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 2.0)
        self.stats.connected = False

    async def _connect(self) -> None:
        import nats

        delay = CONNECT_RETRY_S
        warned = False
        while True:
            try:
                self._nc = await nats.connect(
                    servers=[self.url], name=f"token-gateway {self.origin}", no_echo=True,
                    allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]
                    connect_timeout=1, pending_size=self.config.sync_max_pending_bytes,
                    disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                    error_cb=self._on_error, closed_cb=self._on_closed,
                )
                break
            except Exception as exc:
                if not warned:
                    warned = True
                    log.warning("sync: NATS at %s unreachable (%s); routing on local knowledge until it answers", self.url, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONNECT_RETRY_MAX_S)
        await self._nc.subscribe(self.config.sync_subject, cb=self._on_message)
        self.stats.connected = True
        self.stats.connects += 1
        log.info("sync: joined %s on %s as %s", self.config.sync_subject, self.url, self.origin)
        await self._announce()

    async def _on_message(self, msg: Any) -> None:
        self.applier.apply_bytes(msg.data)

    async def _on_disconnected(self) -> None:
        if self.stats.connected and not self._closing:
            self.stats.disconnects += 1
            log.warning("sync: lost NATS at %s; routing on local knowledge while reconnecting", self.url)
        self.stats.connected = False

    async def _on_reconnected(self) -> None:
        if self.book is not None:
            self.book.new_epoch()  # peers may have missed blocks while we were away
        self.stats.connected = True
        self.stats.connects += 1
        log.info("sync: NATS at %s is back; re-announcing load and recent decisions", self.url)
        await self._announce()
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(self._replay(REPLAY_AGAIN_S), name="sync-replay"))

    async def _on_error(self, exc: Exception) -> None:
        log.debug("sync: NATS client error: %s", exc)

    async def _on_closed(self) -> None:
        self.stats.connected = False

    # ------------------------------------------------------------ publishing
    async def _announce(self) -> None:
        await self._send(self.outbox.take(full=[w.id for w in self.workers.all()]))
        await self._replay()

    async def _replay(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self._closing:
            return
        batch = self.outbox.replay()
        if batch is not None:
            self.stats.replayed_decisions += len(batch.decisions)
            await self._send(batch)

    async def _send(self, batch: sync_pb2.Batch | None) -> None:
        if batch is None:
            return
        nc = self._nc
        if nc is None or nc.is_closed:
            self.stats.dropped_batches += 1
            return
        data = batch.SerializeToString()
        limit = int(getattr(nc, "max_payload", 0) or DEFAULT_MAX_PAYLOAD)
        if len(data) > limit and batch.kv_events:
            await self._send_apart(nc, batch, limit)
            return
        await self._publish(nc, batch, data)

    async def _send_apart(self, nc: Any, batch: sync_pb2.Batch, limit: int) -> None:
        """A tick's batch over the server's payload limit for the KV events it relays (a long
        prefill's pages): the rest goes as the tick's message, the events after it in messages
        of their own, a batch too large alone cut into parts (``sync.kv_split``)."""
        rest = sync_pb2.Batch()
        rest.CopyFrom(batch)
        rest.ClearField("kv_events")
        await self._publish(nc, rest, rest.SerializeToString())
        try:
            groups = kv_split.pack(batch.kv_events, limit - ENVELOPE_BYTES)
        except ValueError as exc:  # a single block beyond the limit: the followers see a gap and reset
            self.stats.dropped_batches += 1
            log.warning("sync: relayed KV events not sent: %s", exc)
            return
        for group in groups:
            extra = self.outbox.envelope()
            extra.kv_events.extend(group)
            self.stats.kv_event_messages += 1
            await self._publish(nc, extra, extra.SerializeToString())

    async def _publish(self, nc: Any, batch: sync_pb2.Batch, data: bytes) -> None:
        try:  # appends to the client's buffer (flushed by nats-py's own task); raises when it is full
            await nc.publish(self.config.sync_subject, data)
        except Exception as exc:
            self.stats.dropped_batches += 1
            log.debug("sync: publish failed: %s", exc)
            return
        self.stats.published_batches += 1
        self.stats.published_bytes += len(data)
        if not batch.replay:
            self.stats.published_decisions += len(batch.decisions)

    async def _publisher(self) -> None:
        """One message per window: a message costs both ends a syscall and a few task
        switches, so coalescing events (at the price of at most one window of lag) is what
        keeps sync cheap per request."""
        window = self.config.sync_flush_interval_s
        while True:
            await self._pending.wait()
            if window > 0:
                await asyncio.sleep(window)
            self._pending.clear()
            await self.flush()

    async def flush(self) -> sync_pb2.Batch | None:
        """Send what is pending now, in one message (the publisher's step); returns the batch
        taken, or None when there was nothing to say."""
        batch = self.outbox.take()
        await self._send(batch)
        return batch

    async def _heartbeat(self) -> None:
        """Every beat: the loads that changed since last sent (first tokens move prefill to
        decode without an event) and a sign of life; every FULL_EVERY-th beat all of them."""
        for beat in itertools.count(1):
            await asyncio.sleep(self.config.sync_heartbeat_s)
            gone = self.applier.expire()
            if gone:
                log.info("sync: forgot %d silent peer(s)", len(gone))
            if self.stats.connected:
                ids = [w.id for w in self.workers.all()]
                await self._send(self.outbox.take(full=ids) if beat % FULL_EVERY == 0 else self.outbox.take(scan=ids))
