"""Liveness and readiness (server/http/health.py): /health answers while the process runs,
/readiness only once a worker is available and its model is loaded."""

from __future__ import annotations

from gateway.server.config import GatewayConfig
from tests.server.http.gateway_app import gateway


async def test_alive_but_not_ready_without_workers_then_ready() -> None:
    async with gateway() as (state, client):
        assert (await client.get("/health")).json() == {"status": "ok"}
        not_ready = await client.get("/readiness")
        assert not_ready.status_code == 503 and not_ready.json()["error"]["message"] == "no available worker"
        await state.add_worker("grpc://w1:1")
        ready = await client.get("/readiness")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "workers": 1, "models": ["fake-model"]}
        state.registry.get("w1:1").healthy = False  # type: ignore[union-attr]
        assert (await client.get("/readiness")).status_code == 503


async def test_readiness_names_the_listed_workers_still_awaited() -> None:
    async with gateway(GatewayConfig()) as (state, client):
        state.late.retry("grpc://late:1", ConnectionError("refused"))
        try:
            body = (await client.get("/readiness")).json()
            assert body["error"]["message"] == "no available worker; waiting for grpc://late:1"
            await state.add_worker("grpc://w1:1")
            ready = (await client.get("/readiness")).json()
            assert ready["status"] == "ready" and [p["url"] for p in ready["pending_workers"]] == ["grpc://late:1"]
        finally:
            await state.late.stop()


async def test_one_process_of_a_set_speaks_for_the_set() -> None:
    class _Set:
        def describe(self) -> dict[str, object]:
            return {"index": 0, "of": 2}

    async with gateway() as (state, client):
        state.process_set = _Set()  # type: ignore[assignment]
        assert (await client.get("/health")).json() == {"status": "ok", "processes": {"index": 0, "of": 2}}
