"""The composed configuration (server/config.py): every concern has its own section, and
the server's own flags are checked where they are set."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.server.config import GatewayConfig, ServerConfig


def test_every_section_is_a_fresh_default() -> None:
    a, b = GatewayConfig(), GatewayConfig()
    for f in dataclasses.fields(GatewayConfig):
        assert getattr(a, f.name) is not getattr(b, f.name), f.name  # no section shared between configs
        assert getattr(a, f.name) == getattr(b, f.name)
    a.server.worker_urls.append("grpc://w:1")
    assert b.server.worker_urls == []


def test_defaults_serve_on_loopback_without_grpc() -> None:
    server = ServerConfig()
    assert (server.host, server.port, server.grpc_port) == ("127.0.0.1", 30000, None)
    assert server.worker_stream_transport == "h2" and not server.tokenizer_hub


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"port": 70000}, "--port must be a port"),
        ({"grpc_port": -1}, "--grpc-port must be a port"),
        ({"max_body_bytes": 0}, "max"),
        ({"grpc_max_connections": 0}, "grpc"),
        ({"shutdown_grace_s": -1.0}, "shutdown"),
    ],
)
def test_out_of_range_flags_are_refused(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ServerConfig(**fields)  # type: ignore[arg-type]


def test_port_zero_asks_for_a_free_port() -> None:
    assert ServerConfig(port=0, grpc_port=0).grpc_port == 0
