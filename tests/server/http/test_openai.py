"""OpenAI's ``GET /v1/models`` (server/http/openai.py): every served model with its context
length and parsers, behind the inference key."""

from __future__ import annotations

from gateway.server.config import GatewayConfig
from tests.server.http.gateway_app import bearer, gateway


async def test_models_lists_each_served_model() -> None:
    async with gateway() as (state, client):
        assert (await client.get("/v1/models")).json()["data"] == []
        await state.add_worker("grpc://w1:1")
        await state.add_worker("grpc://w2:1")  # the same model: one card
        r = await client.get("/v1/models", headers={"x-request-id": "req-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "req-1"
        body = r.json()
        assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["fake-model"]
        card = body["data"][0]
        assert card["object"] == "model" and card["root"] == "fake-model"
        assert card["max_model_len"] == state.catalog.get("fake-model").max_context_length


async def test_models_need_an_inference_key_when_keys_are_set() -> None:
    config = GatewayConfig()
    config.server.api_keys = ["k1"]
    async with gateway(config) as (_, client):
        refused = await client.get("/v1/models")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert (await client.get("/v1/models", headers=bearer("k1"))).status_code == 200
