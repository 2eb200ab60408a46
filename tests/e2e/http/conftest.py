"""An in-process gateway (real uvicorn on loopback) over in-process simulated workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from gateway.pipeline.pd import PdWorkerSpec
from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.http.guard import http_server_config
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.http_server import http_fleet
from gateway_lab.sim.worker import SimWorker

ZERO_COST = dict(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)

# Every worker kind the conformance checks run against: the gRPC services (SGLang's
# scheduler, vLLM's engine, TensorRT-LLM's service) and the HTTP servers (SGLang's native
# API, vLLM's OpenAI one).
ENGINES = ["sglang", "vllm", "trtllm", "sglang-http", "vllm-http"]


def only(engine: str, kinds: set[str], why: str) -> None:
    """Skip a conformance check on the worker kinds it does not apply to, saying why."""
    if engine not in kinds:
        pytest.skip(f"{engine}: {why}")


class _HttpFleet(SimFleet):
    """Simulated HTTP workers seen as a fleet: the same workers, their HTTP URLs."""

    def __init__(self, workers: list[SimWorker], urls: list[str]) -> None:
        super().__init__(workers)
        self._urls = urls

    @property
    def urls(self) -> list[str]:
        return self._urls


@contextlib.asynccontextmanager
async def _fleet(opts: StackOptions, sim: SimConfig) -> AsyncIterator[SimFleet]:
    if not opts.engine.endswith("-http"):
        async with SimFleet.start(opts.workers, sim, roles=opts.roles, engine=opts.engine) as fleet:
            yield fleet
        return
    if opts.roles:
        raise ValueError("the HTTP kinds of this stack serve the regular role only")
    async with http_fleet(opts.workers, sim, api=opts.engine.removesuffix("-http")) as workers:
        yield _HttpFleet([w.worker for w in workers], [w.url for w in workers])


@dataclass
class Stack:
    fleet: SimFleet
    state: GatewayState
    url: str
    client: openai.AsyncOpenAI
    http: httpx.AsyncClient

    @property
    def model(self) -> str:
        return self.state.catalog.names()[0]


@dataclasses.dataclass
class StackOptions:
    workers: int = 2
    sim: dict[str, Any] = dataclasses.field(default_factory=dict)
    policy: str = "round_robin"
    server: dict[str, Any] = dataclasses.field(default_factory=dict)
    retry: dict[str, Any] = dataclasses.field(default_factory=dict)
    dispatch: dict[str, Any] = dataclasses.field(default_factory=dict)
    # other GatewayConfig sections by name, e.g. {"admission": {"max_concurrent_requests": 1}}
    sections: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    roles: list[str] | None = None  # sim role per worker; prefill/decode ones join the PD pools
    pd: dict[str, Any] = dataclasses.field(default_factory=dict)
    engine: str = "sglang"  # one of ENGINES: the gRPC service or HTTP server the workers serve


@functools.cache
def _tls() -> ssl.SSLContext:
    """One client TLS context for the whole session: building one reads the CA bundle,
    a real share of a stack's start-up, and a loopback ``http://`` gateway never uses it."""
    return httpx.create_ssl_context()


async def _serve(state: GatewayState) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    app = create_app(state, manage_lifecycle=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(http_server_config(app, state.config.http))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def start_stack(opts: StackOptions, tmp_path: Any) -> AsyncIterator[Stack]:
    """A whole stack, torn down when the ``async with`` ends, a failing test's included."""
    sim = SimConfig(**{**ZERO_COST, **opts.sim})
    async with _fleet(opts, sim) as fleet:
        roles = opts.roles or ["regular"] * opts.workers
        by_role = {r: [u for u, ur in zip(fleet.urls, roles, strict=True) if ur == r] for r in ("regular", "prefill", "decode")}
        server = dict(opts.server)
        if opts.engine == "vllm-http":  # vLLM's HTTP server does not say where its tokenizer is
            server.setdefault("tokenizer_path", str(fleet.workers[0].vocab.path))
        config = GatewayConfig(server=ServerConfig(worker_urls=by_role["regular"], tokenizer_cache_dir=str(tmp_path / "tok"), **server))
        config.pd.prefill = [PdWorkerSpec(u) for u in by_role["prefill"]]
        config.pd.decode = [PdWorkerSpec(u) for u in by_role["decode"]]
        for k, v in opts.pd.items():
            setattr(config.pd, k, v)
        config.policy.policy = opts.policy
        config.history.history_path = str(tmp_path / "history.sqlite3")  # never the user's own store
        for k, v in opts.retry.items():
            setattr(config.retry, k, v)
        for k, v in opts.dispatch.items():
            setattr(config.dispatch, k, v)
        for section, values in opts.sections.items():
            for k, v in values.items():
                setattr(getattr(config, section), k, v)
        state = GatewayState(config)
        await state.start()
        # A fleet worker slow to answer its probe on a loaded host joins late, in the
        # background; the tests expect the whole fleet from their first request.
        if not await state.late.wait(30):
            late = state.late.describe()
            await state.stop()
            raise AssertionError(f"fleet workers not registered: {late}")
        server, task, url = await _serve(state)
        key = (opts.server.get("api_keys") or ["none"])[0]
        client = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=key, max_retries=0, timeout=30,
            http_client=openai.DefaultAsyncHttpxClient(verify=_tls()),
        )
        http = httpx.AsyncClient(base_url=url, timeout=30, verify=_tls())
        try:
            yield Stack(fleet, state, url, client, http)
        finally:
            await client.close()
            await http.aclose()
            server.should_exit = True
            await task
            await state.stop()


@pytest.fixture
def engine() -> str:
    """The kind of simulated worker (one of ENGINES); modules of conformance checks
    parametrize it to run against every kind."""
    return "sglang"


@pytest.fixture
async def stack(request: pytest.FixtureRequest, tmp_path: Any, engine: str) -> AsyncIterator[Stack]:
    marker = request.node.get_closest_marker("stack")
    opts = StackOptions(**{"engine": engine, **(marker.kwargs if marker else {})})
    async with start_stack(opts, tmp_path) as s:
        yield s
