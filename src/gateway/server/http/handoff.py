"""A parked process of a ``serve --processes N`` set passes its new HTTP connections to an active sibling.

The kernel spreads new connections over the set's listeners by their addresses
(SO_REUSEPORT) and cannot be told to skip one without dropping what waits in its queue.
So a parked process (``server.parking``) keeps listening, and sends each connection it
accepts, before reading a byte of it, to an active sibling over a unix datagram socket
(the descriptor travels as SCM_RIGHTS; the sibling opens it with the same protocol as
its own listener's). Its own keep-alive connections close after their current response
(``GuardedHttpTools.shed``); their clients reconnect, and land on an active process or
are passed on. When a hand-off fails (the sibling restarting, its queue full) the
parked process serves the connection itself: a connection is never dropped.

Each process binds ``handoff-INDEX.sock`` in the set's run folder. TLS connections are
never passed (the handshake has read from them by the time the protocol sees them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gateway.server.process_set import read_parking

log = logging.getLogger(__name__)


def handoff_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"handoff-{index}.sock"


@dataclass
class HandOffStats:
    given: int = 0  # connections passed to a sibling
    kept: int = 0  # connections served here although parked (no sibling took them)
    taken: int = 0  # connections a sibling passed here


class HandOffCollector(Collector):
    """The hand-off's counts on ``/metrics`` (each process's own; a set's scrape labels them by process)."""

    def __init__(self, handoff: HandOff) -> None:
        self._handoff = handoff

    def describe(self) -> Iterable[object]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        st = self._handoff.stats
        for name, doc, value in (
            ("given", "HTTP connections this process passed to an active sibling while parked", st.given),
            ("kept", "HTTP connections this process served although parked (no sibling took them: restarting, queue full)", st.kept),
            ("taken", "HTTP connections a parked sibling passed to this process", st.taken),
        ):
            yield CounterMetricFamily(f"token_gateway_process_handoff_{name}", doc, value=value)


class HandOff:
    """This process's end: ``give`` a connection to an active sibling, take theirs with ``adopt``.

    A sequenced-packet unix socket per process (a message a connection, with room for
    thousands in flight: a datagram socket's queue holds ten, fewer than one client pool's
    burst of new connections); each process connects to a sibling the first time it passes
    it a connection, and again after that sibling restarted."""

    def __init__(self, run_dir: Path, index: int) -> None:
        self.run_dir = run_dir
        self.index = index
        self.targets: list[int] = []  # active siblings while this process is parked; empty: serve here
        self.stats = HandOffStats()
        self._turn = 0
        self._adopt: Callable[[socket.socket], None] | None = None
        self._out: dict[int, socket.socket] = {}  # sibling -> our connection to its listener
        self._in: set[socket.socket] = set()  # siblings' connections to ours
        path = handoff_path(run_dir, index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this slot's previous process
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        self.sock.listen(64)
        self.sock.setblocking(False)

    @property
    def parked(self) -> bool:
        return bool(self.targets)

    def park(self, active: Sequence[int]) -> None:
        """Pass new connections to ``active`` (this process parked), or serve them here
        (``active`` names this process, or is empty)."""
        self.targets = [] if self.index in active else [i for i in active if i != self.index]

    def start(self, adopt: Callable[[socket.socket], None]) -> None:
        """Take siblings' connections from now on, opening each with ``adopt``."""
        self._adopt = adopt
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._accept)

    def give(self, fd: int) -> bool:
        """Send the connection ``fd`` to an active sibling; False when this process is not
        parked or no sibling took it (then it is served here). The caller closes its copy."""
        targets = self.targets
        if not targets:
            return False
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [fd]))]
        for _ in range(len(targets)):
            target = targets[self._turn % len(targets)]
            self._turn += 1
            for _attempt in range(2):  # a sibling that restarted: connect to its new listener once
                peer = self._peer(target)
                if peer is None:
                    break
                try:
                    peer.sendmsg([b"c"], rights)
                except (BlockingIOError, InterruptedError):
                    break  # its queue is full: the next sibling, else keep it
                except OSError:
                    self._drop(target)
                    continue
                self.stats.given += 1
                return True
        self.stats.kept += 1
        return False

    def _peer(self, index: int) -> socket.socket | None:
        peer = self._out.get(index)
        if peer is None:
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                peer.setblocking(False)
                peer.connect(str(handoff_path(self.run_dir, index)))
            except OSError:  # not there (restarting) or its backlog is full
                peer.close()
                return None
            self._out[index] = peer
        return peer

    def _drop(self, index: int) -> None:
        peer = self._out.pop(index, None)
        if peer is not None:
            peer.close()

    def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("hand-off listener: %s", exc)
                return
            conn.setblocking(False)
            self._in.add(conn)
            loop.add_reader(conn.fileno(), self._receive, conn)

    def _receive(self, peer: socket.socket) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(peer, 16, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("hand-off connection: %s", exc)
                data, fds = b"", []
            for fd in fds:
                conn = socket.socket(fileno=fd)
                if self._adopt is None:
                    conn.close()
                    continue
                conn.setblocking(False)
                self.stats.taken += 1
                self._adopt(conn)
            if not data and not fds:  # the sibling went away
                asyncio.get_running_loop().remove_reader(peer.fileno())
                self._in.discard(peer)
                peer.close()
                return

    def close(self) -> None:
        loop: asyncio.AbstractEventLoop | None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for s in (self.sock, *self._in):
            if loop is not None and s.fileno() >= 0:
                loop.remove_reader(s.fileno())
            s.close()
        for s in self._out.values():
            s.close()
        self._in.clear()
        self._out.clear()
        with contextlib.suppress(OSError):
            handoff_path(self.run_dir, self.index).unlink()


@runtime_checkable
class Shedding(Protocol):
    def shed(self) -> None: ...


def follow_supervisor(
    run_dir: Path, index: int, count: int, handoff: HandOff | None,
    connections: Callable[[], Iterable[object]], adopt: Callable[[socket.socket], None] | None,
    on_active: Callable[[list[int]], object] | None = None,
) -> Callable[[], None]:
    """Apply the supervisor's word now and on each SIGUSR1 (the handler is installed even
    without a hand-off, so that the signal never ends the process); returns the applier.

    On a change this process's own connections move: all of them when it is parked (to
    the active siblings), and when the set grew (so that the kernel spreads their
    reconnections over the processes again); ``on_active`` hears the active processes
    (this process's share of the set's admission limits follows them)."""
    previous = [list(range(count))]

    def apply() -> None:
        if handoff is None:
            return
        active = read_parking(run_dir) or list(range(count))
        grew = len(active) > len(previous[0])
        changed = active != previous[0]
        previous[0] = active
        if changed and on_active is not None:
            on_active(active)
        handoff.park(active)
        if handoff.parked or grew:
            for conn in list(connections()):
                if isinstance(conn, Shedding):
                    conn.shed()

    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGUSR1, apply)
    if handoff is not None and adopt is not None:
        handoff.start(adopt)
    apply()
    return apply
