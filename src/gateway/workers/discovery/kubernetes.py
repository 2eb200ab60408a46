"""Workers from Kubernetes pods chosen by label selectors (kubernetes-asyncio).

One selector per role (``--k8s-selector`` regular, ``--k8s-prefill-selector``,
``--k8s-decode-selector``, SMG's ``--selector``/``--prefill-selector``/``--decode-selector``).
A pod matched by the regular selector may carry its role in ``--k8s-role-label``.
A pod becomes a worker when it is Running, Ready, has an IP and is not being
deleted; its gRPC port is the container port named ``grpc`` (else ``--k8s-port``),
a prefill pod's bootstrap port comes from the ``sglang.ai/bootstrap-port``
annotation (else what the worker reports). Each selector is listed, then watched
from the list's resourceVersion; a broken watch is re-listed after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.dns import worker_url
from gateway.workers.discovery.reconcile import Reconciler, Target

log = logging.getLogger(__name__)

ROLES = ("regular", "prefill", "decode")


def selector_string(pairs: list[str]) -> str:
    """``["app=sglang", "tier=gpu"]`` -> ``"app=sglang,tier=gpu"`` (the API's labelSelector)."""
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"label selector {pair!r}: use KEY=VALUE")
    return ",".join(pairs)


def _ready(pod: Any) -> bool:
    status = pod.status
    if status is None or status.phase != "Running" or not status.pod_ip:
        return False
    if pod.metadata is not None and pod.metadata.deletion_timestamp is not None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def _grpc_port(pod: Any, default: int) -> int:
    for container in (pod.spec.containers if pod.spec is not None else None) or []:
        for port in container.ports or []:
            if port.name == "grpc":
                return int(port.container_port)
    return default


def pod_target(pod: Any, role: str, config: DiscoveryConfig) -> Target | None:
    """The worker a pod stands for, or None while it cannot serve (``V1Pod`` in)."""
    if not _ready(pod):
        return None
    labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
    annotations = (pod.metadata.annotations if pod.metadata is not None else None) or {}
    if role == "regular":
        labelled = labels.get(config.k8s_role_label)
        role = labelled if labelled in ROLES else "regular"
    bootstrap = annotations.get(config.k8s_bootstrap_port_annotation)
    port = _grpc_port(pod, config.k8s_port)
    return Target(
        worker_url(config.discovery_scheme, pod.status.pod_ip, port),
        role=role,
        bootstrap_port=int(bootstrap) if role == "prefill" and bootstrap and bootstrap.isdigit() else None,
    )


ApiFactory = Callable[[], Any]  # -> an entered kubernetes_asyncio ApiClient


async def default_api_client() -> Any:
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()


class KubernetesDiscovery:
    name = "k8s-discovery"

    def __init__(self, config: DiscoveryConfig, reconciler: Reconciler, *,
                 api_client: Callable[[], Any] | None = None, retry_s: float = 5.0) -> None:
        self.config = config
        self.reconciler = reconciler
        self.selectors = {role: selector_string(sel) for role, sel in (
            ("regular", config.k8s_selector), ("prefill", config.k8s_prefill_selector),
            ("decode", config.k8s_decode_selector)) if sel}
        if not self.selectors:
            raise ValueError("--k8s-discovery needs --k8s-selector, --k8s-prefill-selector or --k8s-decode-selector")
        self._make_client = api_client or default_api_client
        self._api: Any = None
        self._pods: dict[str, dict[str, Target]] = {role: {} for role in self.selectors}  # role -> pod uid -> target
        self._versions: dict[str, str | None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._retry_s = retry_s
        self._lock = asyncio.Lock()

    def desired(self) -> dict[str, Target]:
        return {t.url: t for pods in self._pods.values() for t in pods.values()}

    async def _core(self) -> Any:
        from kubernetes_asyncio import client

        if self._api is None:
            made = self._make_client()
            self._api = await made if asyncio.iscoroutine(made) else made
        return client.CoreV1Api(self._api)

    def _list_call(self, core: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
        if self.config.k8s_namespace:
            return core.list_namespaced_pod, {"namespace": self.config.k8s_namespace}
        return core.list_pod_for_all_namespaces, {}

    def _apply_pod(self, role: str, event: str, pod: Any) -> None:
        uid = pod.metadata.uid or f"{pod.metadata.namespace}/{pod.metadata.name}"
        target = None if event == "DELETED" else pod_target(pod, role, self.config)
        if target is None:
            self._pods[role].pop(uid, None)
        else:
            self._pods[role][uid] = target

    async def _relist(self, role: str) -> None:
        core = await self._core()
        call, kwargs = self._list_call(core)
        listing = await call(label_selector=self.selectors[role], **kwargs)
        self._pods[role] = {}
        for pod in listing.items or []:
            self._apply_pod(role, "ADDED", pod)
        self._versions[role] = listing.metadata.resource_version if listing.metadata else None

    async def _sync(self) -> None:
        async with self._lock:
            await self.reconciler.apply(self.desired())

    async def first_round(self) -> None:
        for role in self.selectors:
            try:
                await self._relist(role)
            except Exception as exc:
                log.warning("k8s-discovery: listing %s pods failed: %s", role, exc)
        await self._sync()

    async def _watch(self, role: str) -> None:
        from kubernetes_asyncio import watch

        while True:
            try:
                if self._versions.get(role) is None:
                    await self._relist(role)
                    await self._sync()
                core = await self._core()
                call, kwargs = self._list_call(core)
                w = watch.Watch()
                try:
                    async for event in w.stream(
                        call, label_selector=self.selectors[role], resource_version=self._versions[role],
                        timeout_seconds=300, **kwargs,
                    ):
                        if event["type"] == "BOOKMARK":
                            continue
                        self._apply_pod(role, event["type"], event["object"])
                        if w.resource_version:
                            self._versions[role] = w.resource_version
                        await self._sync()
                finally:
                    w.stop()
                    with contextlib.suppress(Exception):
                        await w.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("k8s-discovery: watch of %s pods ended (%s); listing again in %.0f s", role, exc, self._retry_s)
                self._versions[role] = None
                await asyncio.sleep(self._retry_s)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(role), name=f"k8s-watch-{role}") for role in self.selectors]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.reconciler.close()
        if self._api is not None:
            await self._api.close()
            self._api = None
