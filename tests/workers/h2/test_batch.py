"""One protobuf parse for the messages of a socket read: the same messages as parsing them
one by one, and every call still gets its own, in order, with its status after them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hpack import Encoder

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.h2 import H2Call, H2Connection, frames
from gateway.workers.h2.batch import BatchParser
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError


def replies() -> list[pb.GenerateResponse]:
    chunk = pb.GenerateResponse(request_id="r-1")
    chunk.chunk.token_ids.extend([7, 300, 70000])
    chunk.chunk.prompt_tokens, chunk.chunk.cached_tokens = 2176, 2048
    lone = pb.GenerateResponse()
    lone.chunk.token_ids.append(151643)
    done = pb.GenerateResponse(request_id="r-1")
    done.complete.output_ids.extend(range(200))  # a payload past one varint byte of length
    done.complete.finish_reason = "stop"
    second = pb.GenerateResponse(request_id="r-2")
    second.chunk.token_ids.append(9)
    second.chunk.index = 1
    second.chunk.output_logprobs.token_logprobs.extend([-0.25])
    return [chunk, lone, pb.GenerateResponse(), done, second]


def test_many_parses_what_one_by_one_parses() -> None:
    parser = BatchParser(pb.GenerateResponse)
    payloads = [m.SerializeToString() for m in replies()]
    assert len(payloads[3]) > 127
    many = parser.many(payloads)
    assert [type(m) for m in many] == [pb.GenerateResponse] * len(payloads)
    assert many == [pb.GenerateResponse.FromString(p) for p in payloads] == replies()
    assert [m.WhichOneof("response") for m in many] == ["chunk", "chunk", None, "complete", "chunk"]
    assert parser.many(payloads[:1]) == replies()[:1]
    assert parser(payloads[0]) == replies()[0]


def test_a_malformed_payload_fails_the_batch() -> None:
    parser = BatchParser(pb.GenerateResponse)
    good = replies()[0].SerializeToString()
    with pytest.raises(DecodeError):
        parser.many([good, b"\x0a\xff\xff\xff", good])


def test_the_wrapper_type_is_made_once_per_message_type() -> None:
    a, b = BatchParser(pb.GenerateResponse), BatchParser(pb.GenerateResponse)
    assert a._wrapper.__self__ is b._wrapper.__self__


# ---------------------------------------------------------------- the connection's side
class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class CountingParser(BatchParser):
    """The real parser, counting its parses."""

    __slots__ = ("batches",)

    def __init__(self) -> None:
        super().__init__(pb.GenerateResponse)
        self.batches: list[int] = []

    def many(self, payloads: list[bytes]) -> list[Any]:
        self.batches.append(len(payloads))
        return super().many(payloads)


STATUS_200 = [(":status", "200")]


def _message(reply: pb.GenerateResponse) -> bytes:
    payload = reply.SerializeToString()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _data(stream_id: int, *messages: bytes) -> bytes:
    return frames.frame(frames.DATA, 0, stream_id, b"".join(messages))


def _headers(encoder: Encoder, stream_id: int, fields: list[tuple[str, str]], *, end: bool) -> bytes:
    flags = frames.END_HEADERS | (frames.END_STREAM if end else 0)
    return frames.frame(frames.HEADERS, flags, stream_id, encoder.encode(fields))


async def _connection(parser: BatchParser, n: int) -> tuple[H2Connection, list[H2Call]]:
    conn = H2Connection("worker:1", keepalive_s=0)
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    calls = [H2Call(loop, parser, 1 << 20) for _ in range(n)]
    for call in calls:
        conn.open(call, b"", b"\x00\x00\x00\x00\x00")
    return conn, calls


async def test_one_read_is_one_parse_across_calls_and_each_call_gets_its_own_in_order() -> None:
    parser = CountingParser()
    conn, (a, b) = await _connection(parser, 2)
    enc = Encoder()
    ok = [("grpc-status", "0")]
    r = replies()
    conn.data_received(
        _headers(enc, 1, STATUS_200, end=False)
        + _headers(enc, 3, STATUS_200, end=False)
    )
    conn.data_received(_data(3, _message(r[1])))  # one message alone in its read
    assert parser.batches == []
    assert await b.read() == r[1]
    conn.data_received(
        _data(1, _message(r[0]), _message(r[1]))
        + _data(3, _message(r[2]))
        + _data(1, _message(r[3]))
    )
    assert parser.batches == [4]  # both calls' messages, one parse
    assert [await a.read() for _ in range(3)] == [r[0], r[1], r[3]]
    assert await b.read() == r[2]
    assert not a.ready() and not b.ready()
    # Trailers in the same read as messages: the messages are parsed (and queued) first.
    conn.data_received(_data(3, _message(r[4]), _message(r[0])) + _headers(enc, 3, ok, end=True) + _data(1, _message(r[1])))
    assert parser.batches == [4, 2]  # the read's last frame, a lone message: parsed at once
    assert [await b.read(), await b.read()] == [r[4], r[0]]
    assert await b.read() is END_OF_STREAM
    assert await a.read() == r[1]


async def test_a_malformed_message_fails_its_own_call_after_the_ones_before_it() -> None:
    parser = CountingParser()
    conn, (a, b) = await _connection(parser, 2)
    enc = Encoder()
    r = replies()
    bad = b"\x00\x00\x00\x00\x03\x0a\xff\xff"
    conn.data_received(
        _headers(enc, 1, STATUS_200, end=False) + _headers(enc, 3, STATUS_200, end=False)
        + _data(1, _message(r[0]), bad, _message(r[1])) + _data(3, _message(r[3]))
    )
    assert await a.read() == r[0]
    with pytest.raises(WorkerCallError) as err:
        await a.read()
    assert err.value.code is CallCode.INTERNAL and "could not parse" in err.value.message
    assert await b.read() == r[3]  # the other call is untouched
    assert b.status is None and not conn.lost


async def test_an_oversized_message_fails_the_call_after_the_messages_before_it() -> None:
    parser = CountingParser()
    conn, (a,) = await _connection(parser, 1)
    enc = Encoder()
    r = replies()
    huge = b"\x00" + (2 << 20).to_bytes(4, "big")
    conn.data_received(_headers(enc, 1, STATUS_200, end=False) + _data(1, _message(r[0]), _message(r[1]), huge))
    assert [await a.read(), await a.read()] == [r[0], r[1]]
    with pytest.raises(WorkerCallError) as err:
        await a.read()
    assert err.value.code is CallCode.RESOURCE_EXHAUSTED


async def test_a_protocol_violation_still_delivers_what_came_before_it() -> None:
    parser = CountingParser()
    conn, (a,) = await _connection(parser, 1)
    enc = Encoder()
    r = replies()
    conn.data_received(
        _headers(enc, 1, STATUS_200, end=False)
        + _data(1, _message(r[0]))
        + frames.frame(frames.PUSH_PROMISE, 0, 1, b"\x00\x00\x00\x02")
    )
    assert conn.lost
    assert await a.read() == r[0]
    with pytest.raises(WorkerCallError) as err:
        await a.read()
    assert err.value.code is CallCode.UNAVAILABLE


async def test_end_stream_on_data_and_a_reset_come_after_the_messages_of_their_read() -> None:
    parser = CountingParser()
    conn, (a, b) = await _connection(parser, 2)
    enc = Encoder()
    r = replies()
    conn.data_received(
        _headers(enc, 1, STATUS_200, end=False) + _headers(enc, 3, STATUS_200, end=False)
        + _data(3, _message(r[2]))
        + frames.frame(frames.DATA, frames.END_STREAM, 1, _message(r[0]) + _message(r[1]))
        + _data(3, _message(r[3]))
        + frames.frame(frames.RST_STREAM, 0, 3, (2).to_bytes(4, "big"))
    )
    assert parser.batches == [3]  # flushed before the END_STREAM; the lone one before the reset alone
    assert [await a.read(), await a.read()] == [r[0], r[1]]
    with pytest.raises(WorkerCallError) as err:
        await a.read()
    assert err.value.code is CallCode.INTERNAL and "without a status" in err.value.message
    assert [await b.read(), await b.read()] == [r[2], r[3]]
    with pytest.raises(WorkerCallError) as err:
        await b.read()
    assert "reset by the worker" in err.value.message
