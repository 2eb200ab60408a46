"""The HTTP observability middleware (server/observability.py): the request id settled and
echoed, outcomes counted under bounded labels, the first streamed byte timed, and a
guarded /metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from starlette.responses import PlainTextResponse, StreamingResponse

from gateway.observability.metrics import NO_MODEL, GatewayMetrics
from gateway.observability.request_log import ACCESS_LOGGER
from gateway.protocol.errors import AuthenticationError
from gateway.server.observability import UNMATCHED, install_observability


def _sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def _app(metrics: GatewayMetrics, guard: object = None, access_log: bool = False) -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item}")
    async def item(item: str) -> PlainTextResponse:
        return PlainTextResponse(item)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("bug")

    install_observability(app, metrics, access_log=access_log, guard=guard)  # type: ignore[arg-type]
    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://gw")


async def test_request_ids_are_echoed_when_sane_and_made_otherwise() -> None:
    async with _client(_app(GatewayMetrics())) as c:
        assert (await c.get("/items/a", headers={"x-request-id": "abc-1"})).headers["x-request-id"] == "abc-1"
        made = (await c.get("/items/a", headers={"x-request-id": "bad id!"})).headers["x-request-id"]
        assert made != "bad id!" and len(made) == 32
        assert (await c.get("/items/a")).headers["x-request-id"] != made


async def test_outcomes_are_counted_by_route_template_not_by_path() -> None:
    metrics = GatewayMetrics()
    async with _client(_app(metrics)) as c:
        for name in ("a", "b", "c"):
            await c.get(f"/items/{name}")
        await c.get("/no/such/path")
        assert (await c.get("/boom")).status_code == 500
    series = "token_gateway_requests_total"
    assert _sample(metrics, series, endpoint="/items/{item}", model=NO_MODEL, status="200") == 3
    assert _sample(metrics, series, endpoint=UNMATCHED, model=NO_MODEL, status="404") == 1  # bounded labels
    assert _sample(metrics, series, endpoint="/boom", model=NO_MODEL, status="500") == 1
    assert metrics.in_flight._value.get() == 0


async def test_the_first_streamed_byte_is_timed() -> None:
    metrics = GatewayMetrics()
    async with _client(_app(metrics)) as c:
        assert (await c.get("/stream")).text == "data: 1\n\ndata: 2\n\n"
        await c.get("/items/x")
    assert _sample(metrics, "token_gateway_time_to_first_token_seconds_count", endpoint="/stream") == 1
    assert _sample(metrics, "token_gateway_time_to_first_token_seconds_count", endpoint="/items/{item}") == 0


async def test_metrics_behind_a_guard() -> None:
    def guard(headers: object) -> None:
        if dict(headers).get("authorization") != "Bearer k":  # type: ignore[call-overload]
            raise AuthenticationError("needs a key")

    async with _client(_app(GatewayMetrics(), guard)) as c:
        refused = await c.get("/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["message"] == "needs a key"
        ok = await c.get("/metrics", headers={"authorization": "Bearer k"})
        assert ok.status_code == 200 and "token_gateway_requests_total" in ok.text


async def test_scrapes_are_not_access_logged(caplog: pytest.LogCaptureFixture) -> None:
    async with _client(_app(GatewayMetrics(), access_log=True)) as c:
        with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
            await c.get("/metrics")
            await c.get("/items/a")
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 1 and lines[0].startswith("GET /items/{item} 200 ")
