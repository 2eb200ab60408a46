"""Worker URLs: one spelling per address, and every malformed URL refused with its reason."""

from __future__ import annotations

import pytest

from gateway.workers.address import BadWorkerUrl, WorkerAddress, parse_worker_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("grpc://127.0.0.1:30000", WorkerAddress("grpc", "127.0.0.1", 30000)),
        ("  grpc://localhost:1/ ", WorkerAddress("grpc", "127.0.0.1", 1)),
        ("grpcs://localhost:443", WorkerAddress("grpcs", "localhost", 443)),  # TLS checks the name
        ("grpc://Worker-A.Example.:9000", WorkerAddress("grpc", "worker-a.example", 9000)),
        ("grpc://[0:0:0:0:0:0:0:1]:65535", WorkerAddress("grpc", "::1", 65535)),
        ("http://localhost:30000", WorkerAddress("http", "127.0.0.1", 30000)),
        ("https://LocalHost:8443", WorkerAddress("https", "localhost", 8443)),  # TLS checks the name
    ],
)
def test_urls_are_spelled_one_way(url: str, expected: WorkerAddress) -> None:
    assert parse_worker_url(url) == expected


def test_target_and_url_bracket_ipv6_hosts() -> None:
    address = parse_worker_url("grpc://[::1]:8000")
    assert address.target == "[::1]:8000"
    assert address.url == "grpc://[::1]:8000"
    assert parse_worker_url(address.url) == address


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1:30000", "must start with grpc://"),
        ("127.0.0.1:30000", "must start with grpc://"),
        ("http://127.0.0.1:30000/generate", "scheme://host:port only"),
        ("grpc://127.0.0.1", "needs a host and a port"),
        ("grpc://:30000", "needs a host and a port"),
        ("grpc://127.0.0.1:70000", "outside 1-65535"),
        ("grpc://127.0.0.1:0", "outside 1-65535"),
        ("grpc://127.0.0.1:30000/generate", "scheme://host:port only"),
        ("grpc://127.0.0.1:30000?x=1", "scheme://host:port only"),
        ("grpc://user@127.0.0.1:30000", "scheme://host:port only"),
    ],
)
def test_malformed_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(BadWorkerUrl, match=reason):
        parse_worker_url(url)


def test_the_scheme_says_which_transport() -> None:
    assert parse_worker_url("http://127.0.0.1:1").is_http
    assert parse_worker_url("https://example.com:1").is_http
    assert not parse_worker_url("grpc://127.0.0.1:1").is_http
    assert not parse_worker_url("grpcs://example.com:1").is_http
