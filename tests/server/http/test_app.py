"""The HTTP front door (server/http/app.py): inference routes on their own path (other
methods 405), FastAPI for the rest with the OpenAI error shape, and /metrics behind a key
unless the gateway is on loopback or the operator opens it."""

from __future__ import annotations

import pytest

from gateway.server.config import GatewayConfig
from gateway.server.http.app import GatewayApp, metrics_guard
from gateway.server.state import GatewayState
from tests.server.http.gateway_app import bearer, gateway


@pytest.mark.parametrize(
    ("host", "access", "guarded"),
    [("127.0.0.1", "auto", False), ("0.0.0.0", "auto", True), ("0.0.0.0", "open", False), ("127.0.0.1", "key", True)],
)
def test_who_may_scrape(host: str, access: str, guarded: bool) -> None:
    config = GatewayConfig()
    config.server.host, config.security.metrics_access = host, access
    state = GatewayState(config)
    try:
        assert (metrics_guard(state) is not None) is guarded
    finally:
        state.engine.close()


async def test_routes_methods_and_error_shapes() -> None:
    config = GatewayConfig()
    config.server.host, config.server.api_keys = "0.0.0.0", ["k1"]
    async with gateway(config) as (state, client):
        app = client._transport.app  # type: ignore[attr-defined]
        assert isinstance(app, GatewayApp) and app.state.gateway is state
        missing = await client.get("/no/such/route")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        wrong_method = await client.get("/v1/chat/completions")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
        assert (await client.get("/metrics")).status_code == 401  # not on loopback: a key is needed
        assert (await client.get("/metrics", headers=bearer("k1"))).status_code == 200
        schema = (await client.get("/openapi.json")).json()
        assert "/v1/chat/completions" in schema["paths"] and "post" in schema["paths"]["/v1/chat/completions"]
        assert (await client.get("/health")).json()["status"] == "ok"
