"""One HTTP/2 gRPC call (workers/h2/call.py), driven frame by frame against a fake
connection: messages cut anywhere, headers and trailers, resets, cancel, the deadline,
malformed messages failing the call only, and stream window given back as messages go."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from gateway.workers.h2 import frames
from gateway.workers.h2.call import H2Call
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError

OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-worker", b"w1")]


def _trailers(status: int = 0, message: str = "") -> list[tuple[bytes, bytes]]:
    out = [(b"grpc-status", str(status).encode())]
    if message:
        out.append((b"grpc-message", message.encode()))
    return out


def _msg(payload: bytes, *, compressed: bool = False) -> bytes:
    return bytes([int(compressed)]) + len(payload).to_bytes(4, "big") + payload


class _Link:
    """The connection side as the call sees it: records detaches, credit and deferrals."""

    def __init__(self) -> None:
        self.detached: list[tuple[int, int | None]] = []
        self.credits: list[int] = []
        self.deferred: list[H2Call] = []

    def detach(self, call: H2Call, reset: int | None) -> None:
        self.detached.append((call.stream_id, reset))

    def credit(self, stream_id: int, amount: int, force: bool) -> bool:
        self.credits.append(amount)
        return True

    def defer(self, call: H2Call) -> None:
        self.deferred.append(call)

    def flush(self) -> None:
        for call in self.deferred:
            call.deliver_one_by_one()
        self.deferred.clear()


def _parse(data: bytes) -> str:
    text = data.decode()
    if text == "bad":
        raise ValueError("malformed")
    return text


async def _call(max_message: int = 1 << 20) -> tuple[H2Call, _Link]:
    call = H2Call(asyncio.get_running_loop(), _parse, max_message)
    link = _Link()
    call.attach(link, 1, 65535)
    return call, link


async def test_messages_cut_anywhere_come_out_whole_then_the_status() -> None:
    call, link = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    assert call.initial_metadata == (("content-type", "application/grpc"), ("x-worker", "w1"))
    wire = _msg(b"hello") + _msg(b"world")
    for i in range(0, len(wire), 3):
        call.on_data(wire[i:i + 3], last=True)
        link.flush()
    call.on_headers(_trailers(0), end_stream=True)
    assert [m async for m in call] == ["hello", "world"]
    assert await call.read() is END_OF_STREAM and call.done() and call.status.code is CallCode.OK  # type: ignore[union-attr]
    assert link.detached == [(1, None)] and sum(link.credits) > 0


async def test_an_error_status_after_the_messages_before_it() -> None:
    call, _ = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    call.on_data(_msg(b"one"), last=True)
    call.on_headers(_trailers(8, "queue%20full"), end_stream=True)
    assert await call.read() == "one"
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert err.value.code is CallCode.RESOURCE_EXHAUSTED and err.value.message == "queue full"


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ([(b":status", b"503")], CallCode.UNAVAILABLE),
        ([(b":status", b"200"), *_trailers(5, "nope")], CallCode.NOT_FOUND),  # trailers-only
        ([(b":status", b"200")], CallCode.UNKNOWN),  # no grpc-status at all
    ],
)
async def test_http_errors_and_trailers_only(headers: list[tuple[bytes, bytes]], code: CallCode) -> None:
    call, _ = await _call()
    call.on_headers(headers, end_stream=True)
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert err.value.code is code


async def test_malformed_compressed_or_oversized_messages_fail_the_call() -> None:
    call, link = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    call.on_data(_msg(b"bad"), last=True)
    with pytest.raises(WorkerCallError, match="could not parse"):
        await call.read()
    assert link.detached[-1] == (1, frames.CANCEL)  # the stream is reset, the connection lives on
    compressed, _ = await _call()
    compressed.on_headers(OK_HEADERS, end_stream=False)
    compressed.on_data(_msg(b"x", compressed=True), last=True)
    with pytest.raises(WorkerCallError, match="compressed"):
        await compressed.read()
    small, _ = await _call(max_message=4)
    small.on_headers(OK_HEADERS, end_stream=False)
    small.on_data(_msg(b"too long"), last=True)
    with pytest.raises(ReplyTooLarge) as err:
        await small.read()
    assert err.value.code is CallCode.RESOURCE_EXHAUSTED and (err.value.size, err.value.bound) == (8, 4)


async def test_whole_message_frames_of_one_read_wait_for_its_one_parse() -> None:
    """Frames that are each one whole message, with more of the read to come (a burst's
    tokens), are queued for the read's one parse (the call deferred once); a compressed or
    oversized one still fails the call after the messages before it."""
    call, link = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    call.on_data(_msg(b"one"), last=False)
    call.on_data(_msg(b"two"), last=False)
    assert call.pending == [b"one", b"two"] and link.deferred == [call] and not call.ready()
    link.flush()
    assert call.take_all() == ["one", "two"]
    compressed, _ = await _call()
    compressed.on_headers(OK_HEADERS, end_stream=False)
    compressed.on_data(_msg(b"one"), last=False)
    compressed.on_data(_msg(b"x", compressed=True), last=False)
    assert await compressed.read() == "one"
    with pytest.raises(WorkerCallError, match="compressed"):
        await compressed.read()
    small, _ = await _call(max_message=4)
    small.on_headers(OK_HEADERS, end_stream=False)
    small.on_data(_msg(b"ok"), last=False)
    small.on_data(_msg(b"too long"), last=False)
    assert await small.read() == "ok"
    with pytest.raises(ReplyTooLarge):
        await small.read()


async def test_cancel_fails_a_pending_read_and_cancelling_the_reader_cancels_the_call() -> None:
    call, link = await _call()
    reader = asyncio.ensure_future(call.read())
    await asyncio.sleep(0)
    assert call.cancel() and not call.cancel()  # a second cancel does nothing
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert link.detached == [(1, frames.CANCEL)]
    other, other_link = await _call()
    task = asyncio.ensure_future(other.read())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert other.cancelled and other_link.detached == [(1, frames.CANCEL)]


async def test_resets_losses_and_the_deadline() -> None:
    reset, _ = await _call()
    reset.on_reset(frames.CANCEL)
    with pytest.raises(WorkerCallError, match="stream reset by the worker"):
        await reset.read()
    lost, _ = await _call()
    lost.on_lost(CallCode.UNAVAILABLE, "connection lost")
    with pytest.raises(WorkerCallError, match="connection lost"):
        await lost.read()
    late, link = await _call()
    late.set_deadline(asyncio.get_running_loop().time() + 0.01)
    with pytest.raises(WorkerCallError) as err:
        await late.read()
    assert err.value.code is CallCode.DEADLINE_EXCEEDED and link.detached == [(1, frames.CANCEL)]
    truncated, _ = await _call()
    truncated.on_headers(OK_HEADERS, end_stream=False)
    truncated.on_data(_msg(b"hello")[:4], last=True)
    truncated.on_headers(_trailers(0), end_stream=True)
    with pytest.raises(WorkerCallError, match="inside a message"):
        await truncated.read()
    no_trailers, _ = await _call()
    no_trailers.on_end_without_trailers()
    with pytest.raises(WorkerCallError, match="without a status"):
        await no_trailers.read()


async def test_a_reader_asks_for_credit_only_past_the_connections_step_or_inside_a_message() -> None:
    call = H2Call(asyncio.get_running_loop(), _parse, 1 << 20)
    link = _Link()
    call.attach(link, 1, 65535, credit_step=20)
    call.on_headers(OK_HEADERS, end_stream=False)
    call.on_data(_msg(b"one"), last=True)  # 8 bytes held
    assert await call.read() == "one" and link.credits == []  # below the step: not asked
    call.on_data(_msg(b"two") + _msg(b"three")[:4], last=True)  # 20 held, a message begun
    assert await call.read() == "two" and link.credits == [20]  # at the step (and inside a message)
    call.on_data(_msg(b"three")[4:] + _msg(b"x"), last=True)  # 12 more; 5 + 6 bytes delivered
    link.flush()
    assert await call.read() == "three" and link.credits == [20]  # the next message is waiting
    assert await call.read() == "x" and link.credits == [20]  # 12 bytes, nothing incomplete: below
    call.on_data(_msg(b"four")[:3], last=True)  # nothing queued for the reader: given at once
    assert link.credits == [20, 15]


async def _waiting(call: H2Call) -> asyncio.Task[object]:
    """A reader waiting in ``read()`` (its wait has begun when this returns)."""
    reader = asyncio.ensure_future(call.read())
    await asyncio.sleep(0)
    assert not reader.done()
    return reader


async def test_a_pusher_takes_messages_as_they_arrive_and_the_reader_waits_on() -> None:
    call, link = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    taken: list[str] = []

    def push(inbox: deque[str]) -> None:  # takes everything up to "stop"
        while inbox and inbox[0] != "stop":
            taken.append(inbox.popleft())

    call.pusher = push
    reader = await _waiting(call)
    call.on_data(_msg(b"one"), last=True)
    call.on_data(_msg(b"two") + _msg(b"three"), last=True)
    link.flush()
    await asyncio.sleep(0)
    assert taken == ["one", "two", "three"] and not reader.done()
    call.on_data(_msg(b"four") + _msg(b"stop") + _msg(b"after"), last=True)
    link.flush()
    # The first message the pusher leaves wakes the reader, and it reads from there on.
    assert await reader == "stop" and taken == ["one", "two", "three", "four"]
    assert await call.read() == "after"
    assert sum(link.credits) > 0  # taken messages give their window back as read ones do


async def test_a_pusher_that_ends_the_call_wakes_the_reader_once() -> None:
    call, _ = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)

    def push(inbox: deque[str]) -> None:
        call.cancel()

    call.pusher = push
    reader = await _waiting(call)
    call.on_data(_msg(b"one"), last=True)
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert call.pusher is None  # an ended call holds no pusher (nor what it holds)


async def test_the_end_of_the_call_wakes_the_reader_past_the_pusher() -> None:
    call, _ = await _call()
    call.on_headers(OK_HEADERS, end_stream=False)
    pushed: list[int] = []
    call.pusher = lambda inbox: pushed.append(len(inbox))
    reader = await _waiting(call)
    call.on_headers(_trailers(0), end_stream=True)
    assert await reader is END_OF_STREAM and pushed == []


async def test_take_all_returns_what_has_arrived_as_read_would_and_leaves_the_end_to_read() -> None:
    async def run(take: bool) -> tuple[list[object], list[int]]:
        call = H2Call(asyncio.get_running_loop(), _parse, 1 << 20)
        link = _Link()
        call.attach(link, 1, 65535, credit_step=20)
        call.on_headers(OK_HEADERS, end_stream=False)
        got: list[object] = []
        if take:
            got.append(call.take_all())  # nothing yet
        for wire in (_msg(b"one"), _msg(b"two") + _msg(b"three")[:4], _msg(b"three")[4:] + _msg(b"x")):
            call.on_data(wire, last=True)
            link.flush()
            if take:
                got.append(call.take_all())  # what this read brought, in one call
            while call.ready() and not call.done():
                got.append(await call.read())
        call.on_headers(_trailers(8, "full"), end_stream=True)
        if take:
            got.append(call.take_all())  # the failure is read()'s to raise
        with pytest.raises(WorkerCallError):
            await call.read()
        return got, link.credits

    taken, credits = await run(take=True)
    assert taken == [[], ["one"], ["two"], ["three", "x"], []]
    read, read_credits = await run(take=False)
    assert ([m for batch in taken for m in batch], credits) == (read, read_credits)  # the same messages and credit as read()
    cancelled, _ = await _call()
    cancelled.on_headers(OK_HEADERS, end_stream=False)
    cancelled.on_data(_msg(b"one"), last=True)
    cancelled.cancel()
    assert cancelled.take_all() == []
