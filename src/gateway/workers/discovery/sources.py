"""Build the configured discovery sources, each with its own reconciler."""

from __future__ import annotations

from typing import Protocol

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.reconcile import AddWorker, Reconciler, RemoveWorker


class DiscoverySource(Protocol):
    async def first_round(self) -> None: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...


def make_discovery(config: DiscoveryConfig, add: AddWorker, remove: RemoveWorker) -> list[DiscoverySource]:
    sources: list[DiscoverySource] = []
    if config.dns_enabled:
        from gateway.workers.discovery.dns import DnsDiscovery

        sources.append(DnsDiscovery(config, Reconciler("dns-discovery", add, remove)))
    if config.k8s_discovery:
        from gateway.workers.discovery.kubernetes import KubernetesDiscovery

        sources.append(KubernetesDiscovery(config, Reconciler("k8s-discovery", add, remove)))
    return sources
