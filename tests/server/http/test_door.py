"""What every HTTP route shares (server/http/door.py): the request context from the
headers (auth first), the response headers, and one error mapping for small JSON routes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import AuthenticationError, NotFoundError
from gateway.server.config import GatewayConfig
from gateway.server.http.door import CLIENT_CLOSED, HttpDoor
from gateway.server.http.util import ClientGone
from gateway.server.state import GatewayState


@pytest.fixture
def door() -> Iterator[HttpDoor]:
    config = GatewayConfig()
    config.server.api_keys = ["k1"]
    config.security.cache_salt_per_key = True
    state = GatewayState(config)
    try:
        yield HttpDoor(state)
    finally:
        state.engine.close()


def test_the_context_reads_auth_routing_headers_and_the_request_id(door: HttpDoor) -> None:
    headers = {"authorization": "Bearer k1", "x-routing-key": "sess", "x-smg-target-worker": "w2:1",
               "x-request-id": "abc-1", "x-priority": "5"}
    ctx = door.context_from(headers, door.state.auth.inference)
    assert (ctx.request_id, ctx.routing_key, ctx.target_worker, ctx.priority) == ("abc-1", "sess", "w2:1", 5)
    assert ctx.api_key_id is not None and ctx.cache_salt == f"key:{ctx.api_key_id}"
    fresh = door.context_from({"authorization": "Bearer k1", "x-request-id": "no spaces allowed"}, door.state.auth.inference)
    assert fresh.request_id != "no spaces allowed" and len(fresh.request_id) == 32
    with pytest.raises(AuthenticationError):
        door.context_from({"x-routing-key": "sess"}, door.state.auth.inference)  # auth runs before anything else


def test_response_headers_name_each_worker_once() -> None:
    ctx = RequestContext(request_id="r", worker_ids=["w1", "w2", "w1"])
    assert HttpDoor.headers_for(ctx) == {"x-request-id": "r", "x-worker-id": "w1,w2"}
    assert HttpDoor.headers_for(RequestContext(request_id="r")) == {"x-request-id": "r"}


def _client(door: HttpDoor, run: Any) -> httpx.AsyncClient:
    async def endpoint(request: Request) -> Response:
        return await door.handle(request, run, auth=lambda headers: None)

    app = Starlette(routes=[Route("/x", endpoint, methods=["GET"])])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_results_errors_bugs_and_a_client_gone(door: HttpDoor) -> None:
    async def ok(ctx: RequestContext) -> dict[str, str]:
        ctx.worker_ids.append("w1")
        return {"ok": "yes"}

    async def missing(ctx: RequestContext) -> None:
        raise NotFoundError("no such thing")

    async def bug(ctx: RequestContext) -> None:
        raise KeyError("oops")

    async def gone(ctx: RequestContext) -> None:
        raise ClientGone()

    async def response(ctx: RequestContext) -> Response:
        return PlainTextResponse("text")

    headers = {"x-request-id": "rid-7"}
    async with _client(door, ok) as c:
        r = await c.get("/x", headers=headers)
        assert r.json() == {"ok": "yes"} and r.headers["x-request-id"] == "rid-7" and r.headers["x-worker-id"] == "w1"
    async with _client(door, missing) as c:
        r = await c.get("/x", headers=headers)
        assert r.status_code == 404 and r.json()["error"]["message"] == "no such thing" and r.headers["x-request-id"] == "rid-7"
    async with _client(door, bug) as c:
        r = await c.get("/x", headers=headers)
        assert r.status_code == 500 and r.json()["error"]["message"] == "internal server error"  # no internals leak
        assert r.headers["x-request-id"] == "rid-7"
    async with _client(door, gone) as c:
        assert (await c.get("/x")).status_code == CLIENT_CLOSED
    async with _client(door, response) as c:
        r = await c.get("/x", headers=headers)
        assert r.text == "text" and r.headers["x-request-id"] == "rid-7"
