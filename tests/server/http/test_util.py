"""HTTP plumbing (server/http/util.py): the one body reader (bounded, refusing a declared
length up front, noticing a client that left), JSON parsing errors that say what is
wrong, and the one error writer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from gateway.protocol.errors import InvalidRequestError, PayloadTooLargeError, QueueFullError
from gateway.server.http.util import (
    ClientGone,
    error_response,
    json_values_bound,
    parse_json,
    parse_model,
    read_body,
)


def _receive(*messages: dict[str, Any]) -> tuple[Callable[[], Awaitable[dict[str, Any]]], list[int]]:
    queue = list(messages)
    calls = [0]

    async def receive() -> dict[str, Any]:
        calls[0] += 1
        return queue.pop(0)

    return receive, calls


def _chunk(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_body_in_one_or_many_chunks() -> None:
    receive, _ = _receive(_chunk(b"abc"))
    assert await read_body(receive, "3", 10) == b"abc"
    receive, _ = _receive(_chunk(b"ab", True), _chunk(b"", True), _chunk(b"cd"))
    assert await read_body(receive, None, 10) == b"abcd"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    receive, calls = _receive(_chunk(b"x"))
    with pytest.raises(PayloadTooLargeError, match="larger than 10 bytes"):
        await read_body(receive, "11", 10)
    assert calls == [0]
    receive, _ = _receive(_chunk(b"x" * 11))  # a body longer than it declared (or undeclared)
    with pytest.raises(PayloadTooLargeError):
        await read_body(receive, "abc", 10)
    receive, _ = _receive(_chunk(b"x" * 6, True), _chunk(b"x" * 6, True), _chunk(b""))
    with pytest.raises(PayloadTooLargeError):
        await read_body(receive, None, 10)


async def test_a_client_that_leaves_midway_is_noticed() -> None:
    receive, _ = _receive({"type": "http.disconnect"})
    with pytest.raises(ClientGone):
        await read_body(receive, None, 10)
    receive, _ = _receive(_chunk(b"ab", True), {"type": "http.disconnect"})
    with pytest.raises(ClientGone):
        await read_body(receive, None, 10)


def test_json_errors_say_what_is_wrong() -> None:
    assert parse_json(b'{"a": [1]}') == {"a": [1]}
    with pytest.raises(InvalidRequestError, match="empty"):
        parse_json(b"")
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        parse_json(b"{oops")
    with pytest.raises(InvalidRequestError, match=r"not valid UTF-8: byte 0xff at offset 7"):
        parse_json(b'{"a": "\xff"}')


@pytest.mark.parametrize(
    "value",
    [[1, 2, 3], {"a": [1, {"b": []}], "c": "x"}, [[[]]], "just a string", 7, [{"k": [1, 2]}, {}, "s,[{"], []],
)
def test_the_values_bound_is_never_below_the_values_a_text_holds(value: Any) -> None:
    def values(v: Any) -> int:
        if isinstance(v, list):
            return 1 + sum(values(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(values(x) for x in v.values())
        return 1

    assert json_values_bound(orjson.dumps(value)) >= values(value)


async def test_a_body_of_more_values_than_the_bound_is_refused_before_its_parse() -> None:
    ids = orjson.dumps({"prompt": list(range(1000))})  # 999 commas, a bracket, a brace: 1,002 values

    async def read(*chunks: bytes, bound: int) -> bytes:
        receive, _ = _receive(*(_chunk(c, more=i < len(chunks) - 1) for i, c in enumerate(chunks)))
        return await read_body(receive, None, 1 << 20, bound)

    assert await read(ids, bound=1002) == ids
    with pytest.raises(PayloadTooLargeError, match=r"may hold 1,002 JSON values \(.*\); at most 1,001") as refused:
        await read(ids, bound=1001)
    assert refused.value.status == 413
    halves = (ids[:2000], ids[2000:])
    assert await read(*halves, bound=1002) == ids  # counted chunk by chunk: the same count
    with pytest.raises(PayloadTooLargeError, match="more than 1,001"):
        await read(*halves, bound=1001)
    receive, calls = _receive(_chunk(b"[" + b"1," * 600, more=True), _chunk(b"1," * 600, more=True), _chunk(b"1]"))
    with pytest.raises(PayloadTooLargeError):  # refused at the chunk that passes it, before the body's end
        await read_body(receive, None, 1 << 20, 1000)
    assert calls[0] == 2
    text = orjson.dumps({"prompt": "a, b, " * 1000})  # one value, but its commas count: a bound, not a count
    with pytest.raises(PayloadTooLargeError):
        await read(text, bound=1000)
    long = orjson.dumps({"prompt": "a b " * 1000})
    assert await read(long, bound=1000) == long  # long, few values: accepted
    assert await read(ids, bound=0) == ids  # 0: no bound


class _Body(BaseModel):
    n: int


def test_a_model_from_json_or_a_400_naming_the_field() -> None:
    assert parse_model(_Body, {"n": 3}).n == 3
    with pytest.raises(InvalidRequestError, match="must be a JSON object"):
        parse_model(_Body, [1])
    with pytest.raises(InvalidRequestError) as err:
        parse_model(_Body, {"n": "x"})
    assert err.value.param == "n"


def test_the_error_writer_sends_status_body_and_retry_after() -> None:
    resp = error_response(QueueFullError("busy", retry_after=0.2), headers={"x-request-id": "r"})
    assert resp.status_code == 429 and resp.media_type == "application/json"
    assert resp.headers["retry-after"] == "1" and resp.headers["x-request-id"] == "r"  # never 0 s
    assert orjson.loads(resp.body)["error"]["code"] == "queue_full"
    assert "retry-after" not in error_response(InvalidRequestError("bad")).headers
    assert error_response(QueueFullError("busy", retry_after=2.6)).headers["retry-after"] == "3"
