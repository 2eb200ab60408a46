"""A real gateway app (``GatewayState`` + ``create_app``) over in-memory workers, for the
unit tests of the HTTP routers: workers are ``FakeTransport``s registered through the
registry's ``connect`` hook, the tokenizer is the real Qwen3 one from a local folder."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache

import httpx

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.server.config import GatewayConfig
from gateway.server.http.app import create_app
from gateway.server.state import GatewayState
from gateway.tokenization import TokenizerRegistry
from tests.fake_transport import FakeTransport
from tests.tokenization.helpers import qwen_files


@cache
def _tokenizers() -> TokenizerRegistry:
    """One registry for every test gateway: the tokenizer is loaded once per session."""
    return TokenizerRegistry(tempfile.mkdtemp(prefix="gw-tokenizers-"))


@asynccontextmanager
async def gateway(config: GatewayConfig | None = None) -> AsyncIterator[tuple[GatewayState, httpx.AsyncClient]]:
    """The state and an HTTP client of a gateway with no workers yet (add them with ``add``)."""
    config = config or GatewayConfig()
    config.server.tokenizer_path = str(qwen_files())
    state = GatewayState(config)
    state.catalog.registry = _tokenizers()
    transports: dict[str, FakeTransport] = {}
    state.transports = transports  # type: ignore[attr-defined]

    def connect(url: str, tls: object, api_key: str | None) -> FakeTransport:
        return transports.setdefault(url, FakeTransport(url))

    state.registry._connect = connect  # type: ignore[assignment]
    app = create_app(state, manage_lifecycle=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield state, client
    finally:
        await state.registry.close()
        state.engine.close()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def add_model_worker(state: GatewayState, url: str, model: str) -> FakeTransport:
    """Register a fake worker that serves ``model`` (every other fake serves ``fake-model``)."""
    transport = FakeTransport(url)

    async def model_info(*, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            served_model_name=model, model_path=model, max_context_length=4096, vocab_size=1000, is_generation=True
        )

    transport.model_info = model_info  # type: ignore[method-assign]
    state.transports[url] = transport  # type: ignore[attr-defined]
    await state.add_worker(url)
    return transport
