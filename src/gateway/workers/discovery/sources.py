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


def check_discovery(config: DiscoveryConfig) -> None:
    """Raise ValueError on a malformed name or selector (before anything starts)."""
    from gateway.workers.discovery.dns import parse_dns_target
    from gateway.workers.discovery.kubernetes import selector_string

    for text in config.dns_workers:
        parse_dns_target(text)
    for sel in (config.k8s_selector, config.k8s_prefill_selector, config.k8s_decode_selector):
        selector_string(sel)
    if config.k8s_discovery and not (config.k8s_selector or config.k8s_prefill_selector or config.k8s_decode_selector):
        raise ValueError("--k8s-discovery needs --k8s-selector, --k8s-prefill-selector or --k8s-decode-selector")
