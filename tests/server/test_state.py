"""Everything one gateway process owns (server/state.py): a worker is probed, its model
loaded and only then in rotation; wrong models and the gateway's own port are refused and
leave nothing behind; listed workers not up at start are retried in the background."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.protocol.errors import InvalidRequestError
from gateway.server.config import GatewayConfig
from gateway.workers.worker import GATEWAY_INSTANCE_ARG
from tests.fake_transport import FakeTransport
from tests.server.http.gateway_app import gateway


async def test_a_worker_joins_with_its_model_loaded() -> None:
    async with gateway() as (state, _):
        worker = await state.add_worker("grpc://w1:1")
        assert state.registry.get("w1:1") is worker and state.catalog.names() == ["fake-model"]
        assert await state.add_worker("grpc://w1:1") is worker  # registering twice keeps the one worker
        removed = await state.remove_worker("w1:1")
        assert removed is worker and state.registry.all() == []


async def test_refused_workers_leave_nothing_behind() -> None:
    async with gateway() as (state, _):
        with pytest.raises(InvalidRequestError, match="serves model 'fake-model', not 'other'") as err:
            await state.add_worker("grpc://w1:1", model="other")
        assert err.value.param == "model" and state.registry.all() == []
        itself = FakeTransport("grpc://w3:1")  # this gateway's own gRPC port, named as a worker
        plain_info = itself.server_info

        async def self_info(*, timeout: float = 5.0) -> object:
            reply = await plain_info(timeout=timeout)
            reply.server_args.update({GATEWAY_INSTANCE_ARG: state.instance_id})
            return reply

        itself.server_info = self_info  # type: ignore[method-assign]
        state.transports[itself.url] = itself  # type: ignore[attr-defined]
        with pytest.raises(InvalidRequestError, match="own gRPC port"):
            await state.add_worker("grpc://w3:1")
        assert state.registry.all() == []


async def test_start_retries_listed_workers_that_are_not_up() -> None:
    config = GatewayConfig()
    config.server.worker_urls = ["grpc://up:1", "grpc://down:1"]
    async with gateway(config) as (state, _):
        def connect(url: str, tls: object, api_key: str | None) -> object:
            if "down" in url:
                raise ConnectionError("refused")
            return state.transports.setdefault(url, FakeTransport(url))  # type: ignore[attr-defined]

        state.registry._connect = connect  # type: ignore[assignment]
        await state.start()
        try:
            assert state.ready and [w.id for w in state.registry.all()] == ["up:1"]
            assert [p["url"] for p in state.late.describe()] == ["grpc://down:1"]
        finally:
            await state.stop()


async def test_a_text_only_worker_needs_no_tokenizer_and_its_models_are_served() -> None:
    async with gateway() as (state, _):
        text = FakeTransport("http://t:1", lacks=frozenset({"token_ids"}))
        text.models = ("hosted-a", "fake-model")  # type: ignore[attr-defined]
        state.transports[text.url] = text  # type: ignore[attr-defined]
        await state.add_worker("http://t:1")
        assert state.catalog.names() == []  # no tokenizer was loaded for it
        await state.add_worker("grpc://w1:1")
        assert state.model_names() == ["fake-model", "hosted-a"]  # each name once, token models first


def test_the_same_host_ring_is_made_only_inside_a_process_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from gateway.server.process_set import ENV_COUNT, ENV_INDEX, ENV_RUN_DIR
    from gateway.server.state import same_host_ring
    from gateway.sync.config import SyncConfig

    bus: Any = SimpleNamespace(applier=SimpleNamespace(target=lambda *a: None))
    monkeypatch.delenv(ENV_INDEX, raising=False)
    assert same_host_ring(SyncConfig(), bus) is None  # a lone process (replicas use the bus)
    monkeypatch.setenv(ENV_INDEX, "1")
    monkeypatch.setenv(ENV_COUNT, "2")
    monkeypatch.setenv(ENV_RUN_DIR, str(tmp_path))
    assert same_host_ring(SyncConfig(sync_same_host="bus"), bus) is None
    ring = same_host_ring(SyncConfig(), bus)
    assert ring is not None and (ring.index, ring.count) == (1, 2) and (tmp_path / "decisions-1.ring").exists()
    ring.close()
    monkeypatch.setenv(ENV_COUNT, "1")
    assert same_host_ring(SyncConfig(), bus) is None


def test_a_set_sharing_memory_names_itself_on_the_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.server.process_set import ENV_COUNT, ENV_INDEX, ENV_RUN_DIR
    from gateway.server.state import same_host_set
    from gateway.sync.config import SyncConfig

    monkeypatch.delenv(ENV_INDEX, raising=False)
    assert same_host_set(SyncConfig()) == ""  # a lone process or a replica: every peer's queued prompts come by the bus
    monkeypatch.setenv(ENV_COUNT, "2")
    monkeypatch.setenv(ENV_RUN_DIR, str(tmp_path))
    ids = []
    for index in ("0", "1"):
        monkeypatch.setenv(ENV_INDEX, index)
        ids.append(same_host_set(SyncConfig()))
    assert ids[0] and ids[0] == ids[1]  # both members name the same set
    assert same_host_set(SyncConfig(sync_same_host="bus")) == ""  # no rings: the bus is the only source


def test_a_synced_process_shares_the_kv_event_endpoints_it_binds() -> None:
    """With a sync bus and --kv-events, the feeder hands what it reads from an endpoint it
    binds to the outbox, and the applier hands the others' batches to the feeder."""
    from gateway.server.state import GatewayState
    from gateway.sync.config import SyncConfig

    config = GatewayConfig()
    config.server.kv_events = True
    config.sync = SyncConfig(sync_url="nats://127.0.0.1:1")
    state = GatewayState(config)
    assert state.kv_events is not None and state.sync is not None
    assert state.kv_events._relay == state.sync.outbox.kv_events
    assert state.sync.applier.on_kv_events == state.kv_events.relayed
    alone = GatewayConfig()
    alone.server.kv_events = True
    single = GatewayState(alone)
    assert single.sync is None and single.kv_events is not None and single.kv_events._relay is None


def test_http_workers_are_asked_for_their_kv_event_publisher_only_with_auto() -> None:
    """``--kv-events --kv-events-zmq auto`` makes the HTTP clients ask for the publisher where
    that costs a request of its own (vLLM's development-mode ``/server_info``); nothing else does."""
    from gateway.server.state import GatewayState
    from gateway.workers.sglang_http import SglangHttpClient

    def asks(**flags: object) -> bool:
        config = GatewayConfig()
        for name, value in flags.items():
            setattr(config.server, name, value)
        client = GatewayState(config).registry._connect("http://127.0.0.1:1", None, None)
        assert isinstance(client, SglangHttpClient)
        return client.kv_event_discovery

    assert asks(kv_events=True, kv_events_zmq=["auto"])
    assert not asks(kv_events=True, kv_events_zmq=["http://127.0.0.1:1=tcp://*:5557"])
    assert not asks(kv_events=True)
    assert not asks()
