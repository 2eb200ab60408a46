"""Kubernetes discovery: pod -> worker on the library's own V1Pod objects, and the
list+watch loop against a fake API server on 127.0.0.1 that answers in the API's
JSON (a list, then watch events as JSON lines)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client import (
    V1Container,
    V1ContainerPort,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
)

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.kubernetes import KubernetesDiscovery, pod_target
from gateway.workers.discovery.reconcile import Reconciler, Target
from gateway.workers.discovery.targets import selector_string

CONFIG = DiscoveryConfig(k8s_discovery=True, k8s_selector=["app=sglang"], k8s_port=30000)


def pod(name: str, ip: str | None = "10.0.0.1", *, ready: bool = True, phase: str = "Running",
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        grpc_port: int | None = None, deleting: bool = False) -> V1Pod:
    ports = [V1ContainerPort(container_port=8080, name="http")]
    if grpc_port is not None:
        ports.append(V1ContainerPort(container_port=grpc_port, name="grpc"))
    return V1Pod(
        metadata=V1ObjectMeta(name=name, namespace="inference", uid=f"uid-{name}", labels=labels or {"app": "sglang"},
                              annotations=annotations, deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None),
        spec=V1PodSpec(containers=[V1Container(name="sglang", ports=ports)]),
        status=V1PodStatus(phase=phase, pod_ip=ip, conditions=[V1PodCondition(type="Ready", status="True" if ready else "False")]),
    )


def test_pod_to_worker() -> None:
    assert pod_target(pod("a"), "regular", CONFIG) == Target("grpc://10.0.0.1:30000", role="regular")
    assert pod_target(pod("a", grpc_port=50051), "regular", CONFIG).url == "grpc://10.0.0.1:50051"  # type: ignore[union-attr]
    assert pod_target(pod("a", "fd00::5"), "decode", CONFIG).url == "grpc://[fd00::5]:30000"  # type: ignore[union-attr]
    for not_yet in (pod("a", ready=False), pod("a", None), pod("a", phase="Pending"), pod("a", deleting=True)):
        assert pod_target(not_yet, "regular", CONFIG) is None
    labelled = pod("p", labels={"app": "sglang", "token-gateway.io/role": "prefill"},
                   annotations={"sglang.ai/bootstrap-port": "8998"})
    assert pod_target(labelled, "regular", CONFIG) == Target("grpc://10.0.0.1:30000", role="prefill", bootstrap_port=8998)
    assert pod_target(pod("d", annotations={"sglang.ai/bootstrap-port": "8998"}), "decode", CONFIG).bootstrap_port is None  # type: ignore[union-attr]
    assert selector_string(["app=sglang", "tier=gpu"]) == "app=sglang,tier=gpu"
    with pytest.raises(ValueError):
        selector_string(["app"])


class FakeApi:
    """GET /api/v1/namespaces/NS/pods: a PodList, or with watch=true the queued events."""

    def __init__(self, pods: list[V1Pod]) -> None:
        self.serializer = client.ApiClient()
        self.pods = pods
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.selectors: list[str] = []
        self.lists = 0
        self.version = 100

    def _json(self, obj: Any) -> Any:
        return self.serializer.sanitize_for_serialization(obj)

    def push(self, kind: str, p: V1Pod) -> None:
        self.version += 1
        p.metadata.resource_version = str(self.version)
        self.events.put_nowait({"type": kind, "object": self._json(p)})

    async def pods_handler(self, request: web.Request) -> web.StreamResponse:
        self.selectors.append(request.query.get("labelSelector", ""))
        if request.query.get("watch") not in ("true", "True", "1"):
            self.lists += 1
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "100"},
                    "items": [self._json(p) for p in self.pods]}
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while True:
            event = await self.events.get()
            if event is None:  # the server ends the watch (as on its timeout)
                break
            await response.write(json.dumps(event).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response


@pytest.fixture
async def fake_api() -> AsyncIterator[tuple[FakeApi, str]]:
    api = FakeApi([pod("a", "10.0.0.1"), pod("b", "10.0.0.2", ready=False)])
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods", api.pods_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield api, f"http://127.0.0.1:{port}"
    finally:
        api.events.put_nowait(None)
        await runner.cleanup()
        await api.serializer.close()


async def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert check()


async def test_list_then_watch(fake_api: tuple[FakeApi, str]) -> None:
    api, host = fake_api
    registered: dict[str, Target] = {}

    async def add(t: Target) -> object:
        registered[t.url] = t
        return t

    async def remove(url: str) -> object:
        return registered.pop(url)

    def api_client() -> client.ApiClient:
        conf = client.Configuration()
        conf.host = host
        return client.ApiClient(configuration=conf)

    config = DiscoveryConfig(k8s_discovery=True, k8s_selector=["app=sglang"], k8s_namespace="inference")
    source = KubernetesDiscovery(config, Reconciler("k8s", add, remove), api_client=api_client, retry_s=0.05)
    await source.first_round()
    assert set(registered) == {"grpc://10.0.0.1:30000"}  # b is not ready
    assert api.selectors[0] == "app=sglang"
    source.start()
    try:
        api.push("MODIFIED", pod("b", "10.0.0.2", ready=True))
        await _until(lambda: set(registered) == {"grpc://10.0.0.1:30000", "grpc://10.0.0.2:30000"})
        api.push("DELETED", pod("a", "10.0.0.1"))
        await _until(lambda: set(registered) == {"grpc://10.0.0.2:30000"})
        api.push("MODIFIED", pod("b", "10.0.0.2", deleting=True))  # terminating: out at once
        await _until(lambda: registered == {})
        # the server ends the watch: the loop watches again from where it was, no re-list
        lists = api.lists
        api.events.put_nowait(None)
        api.push("ADDED", pod("c", "10.0.0.3"))
        await _until(lambda: set(registered) == {"grpc://10.0.0.3:30000"})
        assert api.lists == lists
        # an error event (resourceVersion too old): list again
        api.events.put_nowait({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Gone", "message": "too old"}})
        await _until(lambda: api.lists == lists + 1)
        await _until(lambda: set(registered) == {"grpc://10.0.0.1:30000"})  # the list holds a (and not-ready b)
    finally:
        await source.stop()


async def test_pods_feed_the_gateway_registry(fake_api: tuple[FakeApi, str], tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Through GatewayState: pods become registered workers (probe, tokenizer) and leave again."""
    import socket

    from gateway.server.config import GatewayConfig, ServerConfig
    from gateway.server.state import GatewayState
    from gateway.workers.discovery import kubernetes as k8s
    from gateway_lab.sim.config import SimConfig
    from gateway_lab.sim.worker import SimWorker

    api, host = fake_api
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = int(s.getsockname()[1])
    workers = []
    for address in ("127.0.0.2", "127.0.0.3"):
        w = SimWorker(SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0))
        await w.start(address, port)
        workers.append(w)
    api.pods = [pod("a", "127.0.0.2", grpc_port=port), pod("b", "127.0.0.3", grpc_port=port, ready=False)]

    def api_client() -> client.ApiClient:
        conf = client.Configuration()
        conf.host = host
        return client.ApiClient(configuration=conf)

    monkeypatch.setattr(k8s, "default_api_client", api_client)
    config = GatewayConfig(
        server=ServerConfig(tokenizer_cache_dir=str(tmp_path / "tok"), worker_drain_timeout_s=1.0),
        discovery=DiscoveryConfig(k8s_discovery=True, k8s_selector=["app=sglang"], k8s_namespace="inference"),
    )
    state = GatewayState(config)
    try:
        await state.start()
        assert state.ready and [w.id for w in state.registry.all()] == [f"127.0.0.2:{port}"]
        api.push("MODIFIED", pod("b", "127.0.0.3", grpc_port=port))
        await _until(lambda: {w.id for w in state.registry.all()} == {f"127.0.0.2:{port}", f"127.0.0.3:{port}"})
        api.push("DELETED", pod("a", "127.0.0.2", grpc_port=port))
        await _until(lambda: [w.id for w in state.registry.all()] == [f"127.0.0.3:{port}"])
    finally:
        await state.stop()
        for w in workers:
            await w.stop(0.1)
