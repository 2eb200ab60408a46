"""The stored-state routes over HTTP (no workers needed): conversations, list paging
checks, and 404s for what the caller does not own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.server.config import GatewayConfig
from gateway.server.http.app import create_app
from gateway.server.state import GatewayState


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = GatewayConfig()
    config.history.history_backend = "memory"
    config.server.api_keys = ["k1", "k2"]
    state = GatewayState(config)
    app = create_app(state, manage_lifecycle=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", headers={"authorization": "Bearer k1"}) as c:
            yield c
    finally:
        state.engine.close()
        await state.history.close()


async def test_conversation_routes(client: httpx.AsyncClient) -> None:
    made = (await client.post("/v1/conversations", json={"metadata": {"a": "1"}})).json()
    cid = made["id"]
    added = await client.post(f"/v1/conversations/{cid}/items", json={"items": [{"role": "user", "content": "x"}]})
    assert added.status_code == 200 and added.json()["data"][0]["content"][0]["text"] == "x"
    listed = await client.get(f"/v1/conversations/{cid}/items", params={"limit": 5, "order": "asc"})
    assert [i["role"] for i in listed.json()["data"]] == ["user"]
    for params in ({"limit": 0}, {"limit": "x"}, {"order": "up"}):
        bad = await client.get(f"/v1/conversations/{cid}/items", params=params)
        assert bad.status_code == 400 and bad.json()["error"]["param"] in ("limit", "order")
    other = await client.get(f"/v1/conversations/{cid}", headers={"authorization": "Bearer k2"})
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
    assert (await client.get(f"/v1/conversations/{cid}", headers={"authorization": "Bearer nope"})).status_code == 401
    assert (await client.delete(f"/v1/conversations/{cid}")).json()["deleted"] is True


async def test_response_routes_answer_404_and_400(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/responses/resp_none")).status_code == 404
    assert (await client.delete("/v1/responses/resp_none")).status_code == 404
    assert (await client.post("/v1/responses/resp_none/cancel")).status_code == 404
    assert (await client.get("/v1/responses/resp_none/input_items")).status_code == 404
    bad = await client.get("/v1/responses/resp_none", params={"stream": "true", "starting_after": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"
