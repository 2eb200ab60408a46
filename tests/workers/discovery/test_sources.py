"""The configured discovery sources (workers/discovery/sources.py): none unless asked, and
malformed names or selectors refused before anything starts."""

from __future__ import annotations

import pytest

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.dns import DnsDiscovery
from gateway.workers.discovery.sources import check_discovery, make_discovery


async def _add(target: object) -> object:
    return target


async def _remove(worker_id: str) -> object:
    return worker_id


def test_no_source_unless_configured_and_dns_when_named() -> None:
    assert make_discovery(DiscoveryConfig(), _add, _remove) == []
    sources = make_discovery(DiscoveryConfig(dns_workers=["sglang:30000"]), _add, _remove)  # type: ignore[arg-type]
    assert len(sources) == 1 and isinstance(sources[0], DnsDiscovery)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (DiscoveryConfig(dns_workers=["no-port"]), "NAME:PORT"),
        (DiscoveryConfig(dns_workers=["leader=w:1"]), "role must be one of"),
        (DiscoveryConfig(k8s_selector=["app"]), "KEY=VALUE"),
        (DiscoveryConfig(k8s_decode_selector=["tier"]), "KEY=VALUE"),
        (DiscoveryConfig(k8s_discovery=True), "needs --k8s-selector"),
    ],
)
def test_malformed_settings_are_refused(config: DiscoveryConfig, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_discovery(config)


def test_well_formed_settings_pass() -> None:
    check_discovery(DiscoveryConfig(dns_workers=["prefill=w:1", "_grpc._tcp.sglang"], k8s_discovery=True,
                                    k8s_prefill_selector=["app=sglang", "role=prefill"]))
