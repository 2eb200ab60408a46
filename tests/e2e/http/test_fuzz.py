"""Schema-driven fuzzing: schemathesis generates valid and invalid requests for every
operation in the gateway's OpenAPI document; none may get a 5xx or break the gateway.

The gateway runs for real (uvicorn + simulated workers on loopback) in a background
thread with its own event loop, because schemathesis calls it synchronously. The
simulated model has a short context so generated ``max_tokens`` stay cheap.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from gateway.server.config import GatewayConfig
from gateway.server.http.app import create_app
from gateway.server.state import GatewayState
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

KEY = "sk-fuzz"
AUTH = {"authorization": f"Bearer {KEY}"}
EXAMPLES = 25  # per operation: ~1.5k requests in all, well under a minute on 2 cores


def _openapi() -> dict[str, Any]:
    """The document a live gateway serves at /openapi.json (building it needs no workers)."""
    state = GatewayState(GatewayConfig())
    try:
        return create_app(state, manage_lifecycle=False).openapi()
    finally:
        state.engine.close()


schema = schemathesis.openapi.from_dict(_openapi())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=EXAMPLES)


class LiveGateway:
    """A stack served from its own thread and event loop."""

    def __init__(self, tmp: Any) -> None:
        self._tmp = tmp
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.stack: Stack | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-gateway", daemon=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        opts = StackOptions(workers=2, sim={"context_length": 2048}, server={"api_keys": [KEY], "max_body_bytes": 1 << 20},
                            sections={"limits": {"max_tokens_cap": 16}})
        async with start_stack(opts, self._tmp) as stack:
            self.stack = stack
            self._ready.set()
            await self._stop.wait()

    def start(self) -> LiveGateway:
        self._thread.start()
        self._ready.wait(60)
        if self.error is not None or self.stack is None:
            raise RuntimeError(f"gateway did not start: {self.error!r}")
        return self

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the gateway's loop and return its result."""
        async def wrap() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(10)

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    gateway = LiveGateway(tmp_path_factory.mktemp("fuzz")).start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.mark.slow
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, live: LiveGateway) -> None:
    assert live.stack is not None
    response = case.call(base_url=live.stack.url, headers=AUTH, timeout=30)
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"]


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(), st.none())
INTS = st.one_of(st.integers(-(2**40), 2**40), st.booleans(), st.floats(allow_nan=True), st.none(), st.text(max_size=5))


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """Bodies aimed at the issue-16 limits: batches around --max-batch-size, NaN and
    infinite sampling values, booleans for integers, out-of-vocabulary logit_bias keys,
    bad constraints, long ids and salts. Each gets a clean answer, never a 5xx."""
    prompt = draw(st.one_of(st.just("hi"), st.lists(st.just("hi"), max_size=300), st.lists(st.integers(-5, 200_000), min_size=1, max_size=5)))
    body: dict[str, Any] = {"max_tokens": draw(INTS), "temperature": draw(FLOATS), "top_p": draw(FLOATS),
                            "n": draw(INTS), "prompt": prompt}
    if draw(st.booleans()):
        body["logit_bias"] = draw(st.dictionaries(st.integers(-5, 10**7).map(str), FLOATS, max_size=3))
    if draw(st.booleans()):
        body["regex"] = draw(st.sampled_from(["(a|b", "[0-9]+", "(?P<", "a" * 70_000]))
    if draw(st.booleans()):
        body["cache_salt"] = draw(st.one_of(st.text(max_size=300), st.just("")))
    if draw(st.booleans()):
        body["rid"] = draw(st.one_of(st.text(max_size=200), st.just("r" * 10_000)))
    path = draw(st.sampled_from(["/v1/completions", "/v1/embeddings", "/generate"]))
    if path == "/v1/embeddings":
        body = {"input": prompt}
    elif path == "/generate":
        body = {"text" if not prompt or isinstance(prompt, str) or isinstance(prompt[0], str) else "input_ids": prompt,
                "sampling_params": {k: body.get(k) for k in ("temperature", "top_p", "n") if k in body} | {"max_new_tokens": body["max_tokens"]},
                **({"rid": body["rid"]} if "rid" in body else {})}
    return path, body


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=hostile_bodies())
def test_hostile_bodies_get_clean_answers(case: tuple[str, dict[str, Any]], live: LiveGateway) -> None:
    assert live.stack is not None
    path, body = case
    content = json.dumps(body).encode()  # NaN and Infinity as JSON extensions, as a careless client sends them
    response = httpx.post(live.stack.url + path, content=content, headers={**AUTH, "content-type": "application/json"}, timeout=30)
    assert response.status_code < 500, f"{path} {body!r} -> {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"]


@pytest.mark.slow
def test_gateway_idle_and_healthy_after_fuzzing(live: LiveGateway) -> None:
    stack = live.stack
    assert stack is not None
    in_flight = live.call(lambda: [w.load.in_flight for w in stack.state.registry.all()])
    running = live.call(lambda: [w.scheduler.num_running + w.scheduler.num_waiting for w in stack.fleet.workers])
    assert in_flight == [0, 0] and running == [0, 0]
    metrics = live.call(lambda: stack.state.metrics.render().decode())
    assert 'status="5' not in metrics
