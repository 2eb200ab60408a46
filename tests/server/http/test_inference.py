"""The inference routes' one ASGI path: which requests take it, and its answers where no
worker is needed (bad input, auth, the body limit, a client gone, an unexpected error).

The whole-stack behaviour (streams, usage, disconnects mid-stream, admission) is covered
by ``tests/e2e/http``, which runs every request of those routes through this path.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.server.config import GatewayConfig
from gateway.server.http.app import GatewayApp, create_app
from gateway.server.state import GatewayState

INFERENCE = [
    "/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings", "/v1/tokenize", "/v1/detokenize",
    "/admin/inspect", "/v1/responses",
]
ANTHROPIC = ["/v1/messages", "/v1/messages/count_tokens"]  # the same path, Anthropic's error shape


@pytest.fixture
async def app() -> AsyncIterator[GatewayApp]:
    config = GatewayConfig()
    config.server.max_body_bytes = 1000
    state = GatewayState(config)
    try:
        made = create_app(state, manage_lifecycle=False)
        assert isinstance(made, GatewayApp)
        yield made
    finally:
        state.engine.close()


def _client(app: GatewayApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


def _assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_only_post_on_the_inference_routes_takes_the_path(app: GatewayApp) -> None:
    assert sorted(app.inference.routes) == sorted(INFERENCE + ANTHROPIC)
    for path in INFERENCE + ANTHROPIC:
        assert app.inference.match({"type": "http", "method": "POST", "path": path})
        assert not app.inference.match({"type": "http", "method": "GET", "path": path})
    for path in ("/v1/models", "/health", "/parse/reasoning", "/flush_cache", "/v1/chat/completions/x"):
        assert not app.inference.match({"type": "http", "method": "POST", "path": path})


@pytest.mark.parametrize("path", ANTHROPIC)
async def test_bad_bodies_get_the_anthropic_error_shape(app: GatewayApp, path: str) -> None:
    async with _client(app) as c:
        for body, status in ((b"", 400), (b"{not json", 400), (b'{"model": 5}', 400), (b"x" * 2000, 413)):
            r = await c.post(path, content=body, headers={"x-request-id": "abc-2"})
            assert r.status_code == status and r.headers["x-request-id"] == "abc-2"
            got = r.json()
            assert got["type"] == "error" and set(got["error"]) == {"type", "message"} and got["error"]["message"]
            assert got["error"]["type"] == ("request_too_large" if status == 413 else "invalid_request_error")


@pytest.mark.parametrize("path", INFERENCE)
async def test_bad_bodies_get_the_openai_error_shape(app: GatewayApp, path: str) -> None:
    async with _client(app) as c:
        _assert_openai_error(await c.post(path, content=b""), 400)
        _assert_openai_error(await c.post(path, content=b"{not json"), 400)
        _assert_openai_error(await c.post(path, content=b"[1, 2]"), 400)
        _assert_openai_error(await c.post(path, content=b"x" * 2000), 413)
        for body in (b'{"model": 5}', b'{"stream": "yes"}', b'{"input": {"a": 1}, "text": 5, "tokens": "x"}'):
            r = await c.post(path, content=body, headers={"x-request-id": "abc-1"})
            _assert_openai_error(r, 400)
            assert r.headers["x-request-id"] == "abc-1"


@pytest.mark.parametrize("path", INFERENCE)
async def test_other_methods_get_405_from_fastapi(app: GatewayApp, path: str) -> None:
    async with _client(app) as c:
        r = await c.get(path)
    _assert_openai_error(r, 405)


async def test_auth_is_checked_before_the_body(app: GatewayApp) -> None:
    state: GatewayState = app.state.gateway
    state.auth._keys = ["sekret"]  # as --api-keys sekret
    async with _client(app) as c:
        _assert_openai_error(await c.post("/v1/completions", content=b"x" * 2000), 401)
        r = await c.post("/v1/completions", content=b"", headers={"authorization": "Bearer sekret"})
        _assert_openai_error(r, 400)


async def test_a_client_gone_while_sending_its_body_gets_499_and_no_work(app: GatewayApp) -> None:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b'{"model"', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    state: GatewayState = app.state.gateway
    assert 'endpoint="/v1/completions"' in state.metrics.render().decode()


async def test_an_unexpected_error_is_a_500_in_the_openai_shape(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(*args: Any) -> Any:
        raise RuntimeError("bug")

    routes = {path: dataclasses.replace(r, open=boom) for path, r in app.inference.routes.items()}
    monkeypatch.setattr(app.inference, "routes", routes)
    async with _client(app) as c:
        r = await c.post("/generate", json={"text": "hi"})
    _assert_openai_error(r, 500)


async def test_the_disconnect_watcher_starts_after_the_requests_own_turn(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's first ``receive`` runs after what the route scheduled in its first turn
    (grpc.aio's send of the worker call), and a client that leaves later still cancels it."""
    order: list[str] = []
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def send_task() -> None:  # stands for grpc.aio's _send_unary_request
        order.append("send")

    async def slow(req: Any, ctx: Any) -> Any:
        asyncio.get_running_loop().create_task(send_task())
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    routes = {path: dataclasses.replace(r, open=slow) for path, r in app.inference.routes.items()}
    monkeypatch.setattr(app.inference, "routes", routes)
    gone = asyncio.Event()
    messages = [{"type": "http.request", "body": b'{"text": "hi"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        order.append("receive")
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": [], "query_string": b""}
    request = asyncio.get_running_loop().create_task(app(scope, receive, send))
    await started.wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["send", "receive"]
    gone.set()
    await asyncio.wait_for(request, 5)
    assert cancelled.is_set() and sent[0]["status"] == 499


async def test_a_request_done_before_its_watcher_starts_leaves_none_behind(app: GatewayApp) -> None:
    before = len(asyncio.all_tasks())
    async with _client(app) as c:
        for _ in range(3):
            _assert_openai_error(await c.post("/generate", content=b"{not json"), 400)
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) <= before


async def test_a_server_disconnect_hook_cancels_the_request_without_a_watcher_task(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the gateway's own server the request watches its client through the scope's
    ``DisconnectHook``: no task waits on ``receive``, and the hook firing cancels the route."""
    from gateway.server.http.guard import DISCONNECT_HOOK, DisconnectHook

    started = asyncio.Event()
    cancelled = asyncio.Event()
    tasks_while_running: list[int] = []

    async def slow(req: Any, ctx: Any) -> Any:
        for _ in range(3):
            await asyncio.sleep(0)
        tasks_while_running.append(len(asyncio.all_tasks()))
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    routes = {path: dataclasses.replace(r, open=slow) for path, r in app.inference.routes.items()}
    monkeypatch.setattr(app.inference, "routes", routes)
    messages = [{"type": "http.request", "body": b'{"text": "hi"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        raise AssertionError("nothing may wait on receive once the body is read")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    hook = DisconnectHook()
    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": [], "query_string": b"",
             "extensions": {DISCONNECT_HOOK: hook}}
    before = len(asyncio.all_tasks())
    request = asyncio.get_running_loop().create_task(app(scope, receive, send))
    await started.wait()
    assert tasks_while_running == [before + 1]  # the request's own task, nothing else
    hook.fire()
    await asyncio.wait_for(request, 5)
    assert cancelled.is_set() and sent[0]["status"] == 499
    assert hook.callback is None


class _Stream:
    """A generation's worker stream, as ``Events.aclose`` sees it."""

    def __init__(self) -> None:
        self.closed = False
        self.aborts: list[str] = []

    async def abort(self, reason: str = "client gone") -> None:
        self.aborts.append(reason)
        self.closed = True


async def _run_streamed(app: GatewayApp, monkeypatch: pytest.MonkeyPatch, events: Any, *, fire_in_open: bool) -> tuple[list[dict[str, Any]], _Stream, asyncio.Task[None], Any]:
    """One streamed request on the path whose route opens ``events()``; the client leaves
    (its ``DisconnectHook`` fires) inside ``open`` or once the first event went out."""
    from types import SimpleNamespace

    from gateway.endpoints.events import Events
    from gateway.server.http.guard import DISCONNECT_HOOK, DisconnectHook

    hook = DisconnectHook()
    stream = _Stream()

    async def open_(req: Any, ctx: Any) -> Any:
        if fire_in_open:
            hook.fire()
        return Events(events(), [SimpleNamespace(stream=stream)])  # type: ignore[list-item]

    routes = {path: dataclasses.replace(r, open=open_) for path, r in app.inference.routes.items()}
    monkeypatch.setattr(app.inference, "routes", routes)
    messages = [{"type": "http.request", "body": b'{"text": "hi", "stream": true}', "more_body": False}]
    sent: list[dict[str, Any]] = []
    first = asyncio.Event()

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body"):
            first.set()

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": [], "query_string": b"",
             "extensions": {DISCONNECT_HOOK: hook}}
    request = asyncio.get_running_loop().create_task(app(scope, receive, send))
    if not fire_in_open:
        await asyncio.wait_for(first.wait(), 5)
        hook.fire()
    await asyncio.wait_for(request, 5)
    return sent, stream, request, hook


async def test_a_stream_is_relayed_in_a_task_of_its_own_that_a_client_leaving_cancels(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    relayed_in: list[asyncio.Task[Any] | None] = []
    ended: list[str] = []

    async def events() -> Any:
        relayed_in.append(asyncio.current_task())
        try:
            yield b"data: one\n\n"
            await asyncio.sleep(30)
            yield b"data: never\n\n"
        finally:
            ended.append("generator closed")

    sent, stream, request, _ = await _run_streamed(app, monkeypatch, events, fire_in_open=False)
    assert relayed_in and relayed_in[0] is not request and relayed_in[0] is not None and relayed_in[0].cancelled()
    assert ended == ["generator closed"] and stream.aborts == ["client gone"]
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"data: one\n\n"]


async def test_a_client_that_leaves_before_its_relay_ever_ran_still_ends_its_generations(app: GatewayApp, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[bool] = []

    async def events() -> Any:
        ran.append(True)
        yield b"data: never\n\n"

    sent, stream, _, _ = await _run_streamed(app, monkeypatch, events, fire_in_open=True)
    assert ran == [] and stream.aborts == ["client gone"]
    assert sent[0]["status"] == 499  # nothing of the stream went out: nginx's 499
