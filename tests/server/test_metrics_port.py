"""``--prometheus-port`` (server/metrics_port.py): a bare ASGI app that serves GET/HEAD
/metrics only, on a port of its own beside the API port."""

from __future__ import annotations

import httpx

from gateway.observability.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from gateway.server.metrics_port import MetricsApp, MetricsPortConfig, start_metrics_server


def _client(metrics: GatewayMetrics) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=MetricsApp(metrics)), base_url="http://m")


async def test_only_get_and_head_of_metrics_are_served() -> None:
    metrics = GatewayMetrics()
    metrics.requests.labels(endpoint="/v1/chat/completions", model="m", status="200").inc()
    async with _client(metrics) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
        assert 'endpoint="/v1/chat/completions"' in r.text
        head = await c.head("/metrics")
        assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) == len(r.content)
        assert (await c.get("/v1/models")).status_code == 404
        assert (await c.post("/metrics")).status_code == 404


async def test_a_process_set_answers_for_every_member() -> None:
    metrics = GatewayMetrics()

    async def federate(own: bytes) -> bytes:
        return own + b"# and the other processes' series\n"

    metrics.federate = federate
    async with _client(metrics) as c:
        assert (await c.get("/metrics")).text.endswith("# and the other processes' series\n")


async def test_the_port_is_off_unless_asked_and_serves_on_its_own_socket() -> None:
    metrics = GatewayMetrics()
    assert await start_metrics_server(metrics, MetricsPortConfig(), "127.0.0.1") is None
    server = await start_metrics_server(metrics, MetricsPortConfig(prometheus_port=0), "127.0.0.1")
    assert server is not None and server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
    try:
        async with httpx.AsyncClient() as c:
            r = await c.get(server.url)
        assert r.status_code == 200 and "token_gateway_" in r.text
    finally:
        await server.stop()
