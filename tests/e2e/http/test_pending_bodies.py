"""Request bodies still arriving are bounded all connections together: the connection
that passes ``--max-pending-body-bytes`` gets a 503 (OpenAI shape) and is closed; what
it held is counted free again, and normal requests are served throughout."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from gateway.server.http.guard import GuardedHttpTools
from tests.e2e.http.conftest import Stack

LIMITS = {"max_pending_body_bytes": 3 * 1024 * 1024, "body_timeout_s": 30.0}
pytestmark = pytest.mark.stack(workers=1, sections={"http": LIMITS})
HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 8000000\r\n\r\n"


def _pending(stack: Stack) -> int:
    guarded = [t for t in GuardedHttpTools.__subclasses__() if t.limits is stack.state.config.http]
    return sum(t._pending[0] for t in guarded)


async def _unfinished(stack: Stack, size: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(HEAD + b"x" * size)
    await writer.drain()
    return reader, writer


async def test_bodies_past_the_budget_get_503(stack: Stack) -> None:
    held = [await _unfinished(stack, 1024 * 1024) for _ in range(2)]
    for _ in range(100):
        if _pending(stack) >= 2 * 1024 * 1024:
            break
        await asyncio.sleep(0.02)
    assert _pending(stack) >= 2 * 1024 * 1024
    reader, writer = await _unfinished(stack, 1536 * 1024)
    answer = await asyncio.wait_for(reader.read(), 10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert json.loads(body)["error"]["code"] == "body_budget_exceeded"
    writer.close()
    ok = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=2)
    assert ok.choices
    for _, w in held:
        w.close()
        with contextlib.suppress(ConnectionError):
            await w.wait_closed()
    for _ in range(100):
        if _pending(stack) == 0:
            break
        await asyncio.sleep(0.02)
    assert _pending(stack) == 0
