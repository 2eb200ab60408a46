"""The Responses API object: its SSE framing, and what it answers for ids it does not
hold (the whole flows run against a real stack in tests/e2e/http/test_responses.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.endpoints.responses import sse_event, sse_stream
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import NotFoundError
from gateway.server.config import GatewayConfig
from gateway.server.state import GatewayState


def test_an_event_is_named_by_its_type() -> None:
    event = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "é"}
    name, data = sse_event(event).decode().split("\n")[:2]
    assert name == "event: response.output_text.delta" and orjson.loads(data.removeprefix("data: ")) == event


async def test_sse_stream_closes_its_source() -> None:
    closed = []

    async def source() -> AsyncIterator[dict[str, object]]:
        try:
            yield {"type": "a", "sequence_number": 0}
            yield {"type": "b", "sequence_number": 1}
        finally:
            closed.append(True)

    stream = sse_stream(source())
    assert (await anext(stream)).startswith(b"event: a\n")
    await stream.aclose()
    assert closed == [True]


@pytest.fixture
async def state() -> AsyncIterator[GatewayState]:
    config = GatewayConfig()
    config.history.history_backend = "memory"
    made = GatewayState(config)
    try:
        yield made
    finally:
        made.engine.close()
        await made.history.close()


async def test_unknown_ids(state: GatewayState) -> None:
    api, ctx = state.responses, RequestContext()
    for call in (api.retrieve(ctx, "resp_x"), api.delete(ctx, "resp_x"), api.cancel(ctx, "resp_x"),
                 api.input_items(ctx, "resp_x", after=None, limit=5, order="asc")):
        with pytest.raises(NotFoundError):
            await call
