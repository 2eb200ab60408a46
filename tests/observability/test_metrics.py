"""The /metrics exposition carries no ``*_created`` series."""

from __future__ import annotations

from gateway.observability.metrics import GatewayMetrics


def test_no_created_series() -> None:
    metrics = GatewayMetrics()
    metrics.model_resolved("m")
    text = metrics.render().decode()
    assert "token_gateway" in text
    assert "_created" not in text
