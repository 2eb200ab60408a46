"""One Generate call on an HTTP/2 connection, read in the transport's terms.

The connection hands each call the bytes of its DATA frames as they come off the
socket; the call cuts them into gRPC messages and holds them until the connection has
gone through the whole socket read, which then parses the messages of every call together
(``batch.BatchParser``: one protobuf arena per read, not per token) and hands each call
its own, in order, before the read's next non-DATA frame; a lone message in a read is
parsed at once. A reader that finds messages queued takes them all without waiting
(``ready`` says so; ``take_all``), which is what lets the relay write several tokens that arrived
together as one socket write.

What the gateway relies on (``workers/transport.GenerateCall``, as grpc.aio's
``UnaryStreamCall`` behaves):
- ``read()`` returns the next message, ``END_OF_STREAM`` after the last one when the
  status is OK, and raises ``WorkerCallError`` with the worker's status for any other
  (after the messages that came before it);
- ``cancel()`` resets the stream; a pending ``read()`` then raises
  ``asyncio.CancelledError`` (without cancelling the reader's task), and so does any
  later one;
- cancelling the reading task cancels the call.

A reader may also take messages as they arrive, without waking (``pusher``): while it
waits in ``read()``, each delivery first calls ``pusher`` with the queue of messages,
which takes what it can from its left there and then; the reader wakes only for what it
left (or the end).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote

from gateway.workers.h2 import frames
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError

Deserialize = Callable[[bytes], Any]


class Link(Protocol):
    """What a call asks of its connection (``H2Connection``)."""

    def detach(self, call: H2Call, reset: int | None) -> None: ...

    def credit(self, stream_id: int, amount: int, force: bool) -> bool: ...

    def defer(self, call: H2Call) -> None: ...

    def flush(self) -> None: ...


_OK = CallCode.OK
_EOF = END_OF_STREAM
_PREFIX = frames.MESSAGE_PREFIX.unpack_from


class CallStatus:
    """How a call ended: the status code, its details and the trailing metadata."""

    __slots__ = ("code", "details", "error", "trailing")

    def __init__(
        self, code: CallCode, details: str = "", trailing: tuple[tuple[str, str], ...] = (),
        error: WorkerCallError | None = None,
    ) -> None:
        self.code = code
        self.details = details
        self.trailing = trailing
        self.error = error  # what ``read()`` raises, when more particular than the code


class H2Call:
    """A Generate stream: messages in, read with ``read()``, or stopped with ``cancel()``."""

    __slots__ = (
        "_conn", "_credit", "_credit_step", "_inbox", "_initial", "_loop", "_max_message", "_parse_one", "_partial",
        "_starting", "_status", "_waiter", "cancelled", "headers_seen", "parser", "pending", "pusher", "send_offset",
        "send_payload", "send_window", "stream_id", "timer",
    )  # fmt: skip

    def __init__(self, loop: asyncio.AbstractEventLoop, deserialize: Deserialize, max_message: int) -> None:
        self._loop = loop
        self.parser = deserialize  # the connection parses with it (``many`` when it has one)
        self._parse_one: Deserialize = getattr(deserialize, "one", deserialize)
        self._max_message = max_message
        self._inbox: deque[Any] = deque()
        self._partial = bytearray()  # the start of a message whose end has not arrived
        self.pending: list[bytes] = []  # messages of this socket read, not yet parsed
        self._waiter: asyncio.Future[None] | None = None
        self._status: CallStatus | None = None
        self._initial: tuple[tuple[str, str], ...] = ()
        self._credit = 0  # bytes received and not yet given back as stream window
        self._credit_step = 0  # the connection's threshold for giving them back (``attach``)
        self._conn: Link | None = None
        self._starting: asyncio.Task[None] | None = None  # the wait for a connection, if any
        self.timer: asyncio.TimerHandle | None = None
        self.cancelled = False
        self.stream_id = 0
        self.headers_seen = False
        # The request body still to send (flow control may hold part of it back).
        self.send_payload = b""
        self.send_offset = 0
        self.send_window = 0
        # Called with the queued messages on each delivery while the reader waits; it takes
        # from the left what it will (the reader gets the rest). It must not raise.
        self.pusher: Callable[[deque[Any]], None] | None = None

    # ------------------------------------------------------------------ reader side
    def ready(self) -> bool:
        """``read()`` would return (or raise) without waiting."""
        return bool(self._inbox) or self._status is not None or self.cancelled

    def take_all(self) -> list[Any]:
        """Every message that has arrived, in order, as ``read()`` would return them one by
        one, without its coroutine; empty when none has (nothing yet, or the end, a failure
        or a cancel, which ``read()`` reports). Tokens that came together are taken together:
        one call, not one per token."""
        inbox = self._inbox
        if not inbox or self.cancelled:
            return []
        messages = list(inbox)
        inbox.clear()
        if self._credit and (self._credit >= self._credit_step or self._partial):
            self._give_credit()
        return messages

    def done(self) -> bool:
        return self._status is not None

    @property
    def status(self) -> CallStatus | None:
        return self._status

    @property
    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        """The worker's response headers (not pseudo-headers), for diagnostics."""
        return self._initial

    async def read(self) -> Any:
        """The next message; ``END_OF_STREAM`` after the last; raises ``WorkerCallError``
        on a failed call."""
        while True:
            if self.cancelled:
                raise asyncio.CancelledError
            inbox = self._inbox
            if inbox:
                message = inbox.popleft()
                # The connection's own test, first here: per message, it would say no.
                if not inbox and self._credit and (self._credit >= self._credit_step or self._partial):
                    self._give_credit()
                return message
            status = self._status
            if status is not None:
                if status.code is _OK:
                    return _EOF
                raise status.error or WorkerCallError(status.code, status.details)
            starting = self._starting
            if starting is not None:
                if not starting.done():
                    try:
                        await asyncio.wait((starting,))  # raises only if the reader is cancelled
                    except asyncio.CancelledError:
                        self._cancel_on_reader_exit()
                        raise
                self._starting = None
                continue
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self._waiter = None
                self._cancel_on_reader_exit()
                raise
            self._waiter = None

    def _cancel_on_reader_exit(self) -> None:
        """The reader's task was cancelled (not the call): stop the call, as grpc.aio does."""
        if not self.cancelled and self._status is None:
            self.cancel()

    def __aiter__(self) -> H2Call:
        return self

    async def __anext__(self) -> Any:
        message = await self.read()
        if message is _EOF:
            raise StopAsyncIteration
        return message

    def cancel(self) -> bool:
        """Reset the stream; False when the call had already ended."""
        if self._status is not None or self.cancelled:
            return False
        self.cancelled = True
        self._inbox.clear()
        self._end(CallStatus(CallCode.CANCELLED, "Locally cancelled by application!"), reset=frames.CANCEL)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.cancel()
        return True

    # ------------------------------------------------------------------ connection side
    def attach(self, conn: Link, stream_id: int, send_window: int, credit_step: int = 0) -> None:
        """On ``conn`` as ``stream_id``; ``credit_step``: received bytes below which (and
        with no message incomplete) ``conn.credit`` gives nothing back, so the reader
        need not ask after every message."""
        self._conn = conn
        self.stream_id = stream_id
        self.send_window = send_window
        self._credit_step = credit_step

    def starting(self, task: asyncio.Task[None]) -> None:
        """The call waits for a connection: ``read()`` waits for ``task`` first (the task
        attaches the call to a connection, or ends it; it never raises)."""
        self._starting = task

    def set_deadline(self, deadline: float) -> None:
        self.timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self._status is None:
            self._end(CallStatus(CallCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), reset=frames.CANCEL)

    def on_data(self, data: bytes | memoryview, last: bool = False) -> None:
        """DATA payload of this stream: cut into gRPC messages (5-byte prefix each).
        ``last``: nothing else of this socket read is waiting to be parsed or still to come,
        so a lone message is parsed here and now (the common case at a GPU's pace)."""
        if self._status is not None:
            return
        self._credit += len(data)
        partial = self._partial
        if not partial and not last and type(data) is bytes and len(data) >= 5:
            # A frame that is one whole message, with more of the read to come (a burst's
            # tokens, one frame each): queued for the read's one parse, nothing else to do.
            compressed, size = _PREFIX(data, 0)
            if size + 5 == len(data) and not compressed and size <= self._max_message:
                pending = self.pending
                pending.append(data[5:])
                if len(pending) == 1 and self._conn is not None:
                    self._conn.defer(self)  # parsed with the read's other messages
                return
        if partial:
            partial += data
            buf: bytes | bytearray | memoryview = partial
        else:
            buf = data
        pos, end = 0, len(buf)
        pending = self.pending
        had = len(pending)
        prefix = _PREFIX
        while end - pos >= 5:
            compressed, size = prefix(buf, pos)
            if size > self._max_message:  # refused before any of it is held
                self._fail_after_pending(had, ReplyTooLarge(size, self._max_message))
                return
            stop = pos + 5 + size
            if stop > end:
                break
            if compressed:
                self._fail_after_pending(had, WorkerCallError(CallCode.INTERNAL, "compressed message, but no compression was negotiated"))
                return
            raw = buf[pos + 5:stop]
            pending.append(raw if type(raw) is bytes else bytes(raw))  # a slice of bytes is bytes already
            pos = stop
        if partial:
            del partial[:pos]
        elif pos < end:
            self._partial = bytearray(buf[pos:])
        if pending:
            if last and not had and len(pending) == 1:
                self.pending = []
                try:
                    message = self._parse_one(pending[0])
                except Exception as exc:  # a malformed message fails this call, not the connection
                    self._fail(CallCode.INTERNAL, f"could not parse the worker's message: {exc}")
                    return
                self._inbox.append(message)
                self._wake()
            elif not had and self._conn is not None:
                self._conn.defer(self)  # parsed with the read's other messages
        elif not self._inbox and self._credit:
            self._give_credit()  # nothing queued for the reader: the worker may go on

    def deliver(self, messages: list[Any]) -> None:
        """The parsed ``pending`` messages (the connection parsed them)."""
        self.pending = []
        if self._status is None:
            self._inbox.extend(messages)
            self._wake()

    def deliver_one_by_one(self) -> None:
        """Parse ``pending`` here, one message at a time, and deliver them up to a malformed
        one, which fails this call only: for a lone message, a parser without ``many``, or
        after a batch with a malformed message in it failed."""
        pending, self.pending = self.pending, []
        parse = self._parse_one
        parsed: list[Any] = []
        for payload in pending:
            try:
                parsed.append(parse(payload))
            except Exception as exc:  # a malformed message fails this call, not the connection
                self.deliver(parsed)
                self._fail(CallCode.INTERNAL, f"could not parse the worker's message: {exc}")
                return
        self.deliver(parsed)

    def _fail_after_pending(self, had: int, error: WorkerCallError) -> None:
        """Fail the call once the messages that came before the fault are delivered
        (``had``: how many were pending, so already deferred, before this DATA frame)."""
        conn = self._conn
        if self.pending and conn is not None:
            if not had:
                conn.defer(self)
            conn.flush()
        self._end(CallStatus(error.code, error.message, error=error), reset=frames.CANCEL)

    def on_headers(self, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        """Response headers, trailers, or both at once ("trailers-only")."""
        if self._status is not None:
            return
        if not self.headers_seen:
            self.headers_seen = True
            fields = _decode(headers)
            status = dict(fields).get(":status", "")
            if status != "200":
                code = frames.status_for_http(int(status)) if status.isdigit() else CallCode.INTERNAL
                self._end(CallStatus(code, f"Received http2 header with status: {status or 'none'}"), reset=frames.CANCEL)
                return
            if not end_stream:
                self._initial = tuple((k, v) for k, v in fields if not k.startswith(":"))
                return
            self._trailers(fields)
            return
        if not end_stream:
            self._fail(CallCode.INTERNAL, "headers in the middle of the response")
            return
        self._trailers(_decode(headers))

    def _trailers(self, fields: list[tuple[str, str]]) -> None:
        number: int | None = None
        details = ""
        trailing: list[tuple[str, str]] = []
        for key, value in fields:
            if key == "grpc-status":
                number = int(value) if value.isdigit() else None
            elif key == "grpc-message":
                details = unquote(value, errors="replace")
            elif not key.startswith(":"):
                trailing.append((key, value))
        if number is None:
            self._end(CallStatus(CallCode.UNKNOWN, "missing grpc-status in the trailers"))
            return
        code = frames.status_from_number(number)
        if code is _OK and self._partial:
            code, details = CallCode.INTERNAL, "stream ended inside a message"
        self._end(CallStatus(code, details, tuple(trailing)))

    def on_end_without_trailers(self) -> None:
        """END_STREAM on a DATA frame: gRPC always ends with trailers."""
        self._fail(CallCode.INTERNAL, "the worker ended the stream without a status")

    def on_reset(self, code: int) -> None:
        self._end(CallStatus(frames.status_for_reset(code), f"stream reset by the worker (HTTP/2 error {code})"))

    def on_lost(self, code: CallCode, details: str) -> None:
        """The connection is gone, or going away without this stream."""
        self._end(CallStatus(code, details))

    def _fail(self, code: CallCode, details: str) -> None:
        self._end(CallStatus(code, details), reset=frames.CANCEL)

    def _end(self, status: CallStatus, *, reset: int | None = None) -> None:
        if self._status is not None:
            return
        self._status = status
        self.pusher = None  # it held the reader's side: no cycle outlives the call
        self._partial.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        starting = self._starting
        if starting is not None and not starting.done() and starting is not asyncio.current_task():
            starting.cancel()  # still waiting for a connection: stop waiting (the reader goes on)
        conn = self._conn
        if conn is not None:
            conn.detach(self, reset)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            pusher = self.pusher
            if pusher is not None and self._status is None:
                inbox = self._inbox
                pusher(inbox)
                if not inbox and self._status is None:  # it took them all: nothing for the reader yet
                    if self._credit and (self._credit >= self._credit_step or self._partial):
                        self._give_credit()  # as ``read()`` gives it when it empties the queue
                    return
            if not waiter.done():  # (a pusher may end the call, which wakes the reader itself)
                waiter.set_result(None)

    def _give_credit(self) -> None:
        """Give received bytes back as stream window once there are enough of them, or at
        once while a message is incomplete (its rest may need more than the window left)."""
        conn = self._conn
        if conn is not None and self._status is None and conn.credit(self.stream_id, self._credit, bool(self._partial)):
            self._credit = 0


def _decode(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
