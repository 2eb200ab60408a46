"""What discovery flags name (workers/discovery/targets.py): DNS targets with optional
roles, label selectors, and worker URLs for v4, v6 and names."""

from __future__ import annotations

import pytest

from gateway.workers.discovery.targets import DnsName, parse_dns_target, selector_string, worker_url


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("sglang.default.svc:30000", DnsName("sglang.default.svc", 30000)),
        ("sglang.:30000", DnsName("sglang", 30000)),  # a trailing dot (absolute name) is dropped
        ("prefill=p.svc:8000", DnsName("p.svc", 8000, "prefill")),
        ("_grpc._tcp.sglang.svc.", DnsName("_grpc._tcp.sglang.svc", None)),
        ("decode=_grpc._tcp.d", DnsName("_grpc._tcp.d", None, "decode")),
    ],
)
def test_dns_targets(text: str, parsed: DnsName) -> None:
    assert parse_dns_target(text) == parsed
    assert parsed.srv is (parsed.port is None)


@pytest.mark.parametrize("text", ["sglang", "sglang:", ":30000", "w:0", "w:65536", "w:http", "boss=w:1"])
def test_bad_dns_targets(text: str) -> None:
    with pytest.raises(ValueError):
        parse_dns_target(text)


def test_selectors_and_urls() -> None:
    assert selector_string(["app=sglang", "tier=gpu"]) == "app=sglang,tier=gpu"
    assert selector_string([]) == ""
    with pytest.raises(ValueError, match="KEY=VALUE"):
        selector_string(["app"])
    assert worker_url("grpc", "10.0.0.5", 30000) == "grpc://10.0.0.5:30000"
    assert worker_url("grpcs", "fd00::5", 30000) == "grpcs://[fd00::5]:30000"
    assert worker_url("grpc", "pod.ns.svc.", 1) == "grpc://pod.ns.svc:1"
