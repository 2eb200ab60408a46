"""Admin endpoints (server/http/admin.py): the worker registry over HTTP behind the admin
key, loads and cache flushes fanned out to every worker, and no secret in any answer."""

from __future__ import annotations

from gateway.server.config import GatewayConfig
from gateway.workers.transport import CallCode, WorkerCallError
from tests.server.http.gateway_app import bearer, gateway


def _config() -> GatewayConfig:
    config = GatewayConfig()
    config.server.api_keys = ["k1"]
    config.security.admin_api_key = "adm"
    return config


async def test_workers_are_added_listed_and_removed_with_the_admin_key() -> None:
    async with gateway(_config()) as (state, client):
        body = {"url": "grpc://w1:1", "api_key": "worker-secret"}
        assert (await client.post("/workers", json=body, headers=bearer("k1"))).status_code == 403
        assert (await client.post("/workers", json=body)).status_code == 401
        added = await client.post("/workers", json=body, headers=bearer("adm"))
        assert added.status_code == 201 and added.json()["created"] is True and added.json()["id"] == "w1:1"
        assert "worker-secret" not in added.text
        again = await client.post("/workers", json=body, headers=bearer("adm"))
        assert again.status_code == 200 and again.json()["registration"] == ["already registered"]
        listed = await client.get("/workers", headers=bearer("adm"))
        assert [w["id"] for w in listed.json()["workers"]] == ["w1:1"] and listed.json()["models"][0]["name"] == "fake-model"
        assert "worker-secret" not in listed.text
        assert (await client.get("/workers", headers=bearer("k1"))).status_code == 403  # it names hosts and ports
        assert (await client.get("/workers/w1:1", headers=bearer("adm"))).json()["url"] == "grpc://w1:1"
        assert (await client.get("/workers/zz:9", headers=bearer("adm"))).status_code == 404
        removed = await client.delete("/workers/w1:1", headers=bearer("adm"))
        assert removed.json()["removed"] is True and state.registry.all() == []
        assert (await client.delete("/workers/w1:1", headers=bearer("adm"))).status_code == 404


async def test_bad_registrations_say_why() -> None:
    async with gateway(_config()) as (_, client):
        for body, status, param in [
            ({"url": "grpc://w1:1", "role": "leader"}, 400, "role"),
            ({"url": "grpc://w1:1", "surprise": 1}, 400, "surprise"),
            ({"url": "ftp://w1:1"}, 400, "url"),
            ({"url": "grpc://w1:1", "model": "other-model"}, 400, "model"),
        ]:
            r = await client.post("/workers", json=body, headers=bearer("adm"))
            assert r.status_code == status and r.json()["error"]["param"] == param, (body, r.text)


async def test_loads_and_flushes_reach_every_worker_and_report_failures() -> None:
    async with gateway(_config()) as (state, client):
        await state.add_worker("grpc://w1:1")
        await state.add_worker("grpc://w2:1")
        failing = state.transports["grpc://w2:1"]  # type: ignore[attr-defined]

        async def broken_flush(timeout_s: float = 0.0, *, timeout: float = 30.0) -> object:
            raise WorkerCallError(CallCode.UNAVAILABLE, "down")

        loads = (await client.get("/get_loads", headers=bearer("adm"))).json()["workers"]
        assert sorted(row["id"] for row in loads) == ["w1:1", "w2:1"] and all("loads" in row for row in loads)
        flushed = (await client.post("/flush_cache", headers=bearer("adm"))).json()
        assert flushed["success"] is True and len(flushed["workers"]) == 2
        failing.flush_cache = broken_flush
        partial = (await client.post("/flush_cache", json={"timeout_s": 1}, headers=bearer("adm"))).json()
        assert partial["success"] is False
        assert {r["id"]: r["message"] for r in partial["workers"] if not r["success"]} == {"w2:1": "UNAVAILABLE: down"}
        assert (await client.post("/flush_cache", json={"timeout_s": -1}, headers=bearer("adm"))).status_code == 400
        assert (await client.post("/flush_cache", headers=bearer("k1"))).status_code == 403
