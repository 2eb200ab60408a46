"""Discovery settings (workers/discovery/config.py): both sources off by default, DNS on
as soon as a name is given."""

from __future__ import annotations

from gateway.workers.discovery.config import DiscoveryConfig


def test_off_by_default_and_dns_on_with_a_name() -> None:
    config = DiscoveryConfig()
    assert not config.dns_enabled and not config.k8s_discovery and config.discovery_scheme == "grpc"
    assert DiscoveryConfig(dns_workers=["sglang:30000"]).dns_enabled
    a, b = DiscoveryConfig(), DiscoveryConfig()
    a.dns_workers.append("x:1")
    assert b.dns_workers == []  # list defaults are per config
