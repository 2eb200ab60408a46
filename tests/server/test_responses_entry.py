"""The Responses entry both doors share: its paging rules, and a create's admission (the
whole flows run through both doors in tests/e2e/http and tests/e2e/grpc)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.responses_api import ResponsesRequest
from gateway.server.config import GatewayConfig
from gateway.server.responses_entry import paging
from gateway.server.state import GatewayState


def test_paging() -> None:
    assert paging(None, None, None) == (None, 20, "desc")
    assert paging("item_1", "100", "asc") == ("item_1", 100, "asc")
    assert paging("", 5, None) == (None, 5, "desc")
    for limit, order, param in (("0", None, "limit"), ("101", None, "limit"), ("x", None, "limit"), (None, "up", "order")):
        with pytest.raises(InvalidRequestError) as bad:
            paging(None, limit, order)
        assert bad.value.param == param


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


async def test_a_background_stream_is_refused_before_any_slot(state: GatewayState) -> None:
    taken: list[int] = []

    async def admit(n: int) -> None:
        taken.append(n)

    ctx = RequestContext(admit=admit)
    with pytest.raises(InvalidRequestError) as bad:
        await state.responses_entry.create(ResponsesRequest(input="x", background=True, stream=True), ctx, sse=True)
    assert bad.value.param == "stream" and taken == [] and state.admission.in_flight == 0
