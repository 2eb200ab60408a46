"""Prefill/decode rendezvous between simulated workers, over loopback TCP.

A prefill worker runs a :class:`BootstrapServer` on its bootstrap port. When it
finishes the prefill of a request carrying DisaggregatedParams it registers the
request's bootstrap room there. A decode worker given the same params calls
:func:`wait_for_room` against the host:port *named in the request*: it gets an
answer only if the prefill really happened at the worker the gateway named, so
a gateway that pairs the wrong workers (or forgets the prefill) sees the decode
side fail after ``pd_timeout_s``, as a real KV transfer would.

Wire format (one line each way): the decode side sends ``WAIT <room>\\n``; the
prefill side answers ``{"prompt_tokens": P, "cached_tokens": C}\\n`` once the
room is ready. A room is handed to one waiter only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from dataclasses import dataclass

import grpc

_MAX_READY_ROOMS = 65536
_CONNECT_RETRY_S = 0.05


class RendezvousError(Exception):
    """The decode side could not meet its prefill partner."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RoomInfo:
    prompt_tokens: int
    cached_tokens: int


class BootstrapServer:
    """The prefill worker's side: rooms whose prefill is done, and who waits for them."""

    def __init__(self) -> None:
        self._ready: OrderedDict[int, RoomInfo] = OrderedDict()
        self._waiters: dict[int, list[asyncio.Future[RoomInfo]]] = {}
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for w in list(self._conns):
            w.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None
        for futures in self._waiters.values():
            for fut in futures:
                fut.cancel()
        self._waiters.clear()

    def register(self, room: int, info: RoomInfo) -> None:
        """The prefill for ``room`` is done: hand it to a waiter, or keep it for one."""
        for fut in self._waiters.pop(room, []):
            if not fut.done():
                fut.set_result(info)
                return
        self._ready[room] = info
        while len(self._ready) > _MAX_READY_ROOMS:
            self._ready.popitem(last=False)

    async def _wait(self, room: int) -> RoomInfo:
        info = self._ready.pop(room, None)
        if info is not None:
            return info
        fut: asyncio.Future[RoomInfo] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(room, []).append(fut)
        try:
            return await fut
        finally:
            waiters = self._waiters.get(room)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[room]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            line = await reader.readline()
            parts = line.decode(errors="replace").split()
            if len(parts) != 2 or parts[0] != "WAIT":
                writer.write(b'{"error": "expected WAIT <room>"}\n')
                return
            wait = asyncio.ensure_future(self._wait(int(parts[1])))
            gone = asyncio.ensure_future(reader.read())  # EOF: the decode side gave up
            done, _ = await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
            if wait in done:
                gone.cancel()
                info = wait.result()
                payload = {"prompt_tokens": info.prompt_tokens, "cached_tokens": info.cached_tokens}
                writer.write(json.dumps(payload).encode() + b"\n")
                await writer.drain()
            else:
                wait.cancel()
        except (ConnectionError, ValueError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()


async def wait_for_room(host: str, port: int, room: int, timeout: float) -> RoomInfo:
    """Block until the prefill worker at ``host:port`` has prefilled ``room``.

    Raises :class:`RendezvousError` with UNAVAILABLE when nothing answers at
    ``host:port`` and DEADLINE_EXCEEDED when the room never becomes ready.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    where = f"{host}:{port}"
    last_error = ""
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise RendezvousError(
                grpc.StatusCode.UNAVAILABLE,
                f"PD rendezvous failed: no bootstrap server reachable at {where} within {timeout:g}s"
                f" ({last_error}); is that the prefill worker's bootstrap port?",
            )
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # arrives as the connection opens, and the decode side would wait on alone.
            async with asyncio.timeout(remaining):
                reader, writer = await asyncio.open_connection(host, port)
            break
        except (OSError, TimeoutError) as e:
            last_error = str(e) or type(e).__name__
            await asyncio.sleep(min(_CONNECT_RETRY_S, max(0.0, deadline - loop.time())))
    try:
        writer.write(f"WAIT {room}\n".encode())
        await writer.drain()
        async with asyncio.timeout_at(deadline):
            line = await reader.readline()
    except TimeoutError:
        raise RendezvousError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"PD rendezvous failed: the prefill worker at {where} did not prefill bootstrap room {room}"
            f" within {timeout:g}s (was the prefill request sent to that worker?)",
        ) from None
    except OSError as e:
        raise RendezvousError(
            grpc.StatusCode.UNAVAILABLE, f"PD rendezvous with {where} broke: {e}"
        ) from None
    finally:
        writer.close()
    try:
        data = json.loads(line)
        return RoomInfo(int(data["prompt_tokens"]), int(data["cached_tokens"]))
    except (ValueError, KeyError, TypeError):
        raise RendezvousError(
            grpc.StatusCode.UNAVAILABLE,
            f"PD rendezvous with {where} failed: unexpected answer {line[:200]!r}",
        ) from None
