"""The /metrics exposition carries no ``*_created`` series."""

from __future__ import annotations

from gateway.observability.metrics import GatewayMetrics


def test_no_created_series() -> None:
    metrics = GatewayMetrics()
    metrics.model_resolved("m")
    text = metrics.render().decode()
    assert "token_gateway" in text
    assert "_created" not in text


def test_recorders_update_series_exactly_as_prometheus_client_does() -> None:
    """A recorder and the plain child, fed the same values (on a bucket bound, between,
    past the last, zero, negative, NaN), expose the same samples; a negative counter
    increment is refused the same way."""
    import math

    import pytest
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from gateway.observability.metrics import STAGE_BUCKETS, FastChild, fast_child

    def exposition(registry: CollectorRegistry) -> list[tuple[str, list[tuple[str, str]], float]]:
        return sorted((s.name, sorted(s.labels.items()), s.value) for m in registry.collect() for s in m.samples if not math.isnan(s.value))

    regs = [CollectorRegistry(), CollectorRegistry()]
    hists = [Histogram("h", "h", ["stage"], buckets=STAGE_BUCKETS, registry=r).labels("x") for r in regs]
    counts = [Counter("c", "c", ["model"], registry=r).labels("m") for r in regs]
    fast_h, fast_c = fast_child(hists[1]), fast_child(counts[1])
    assert isinstance(fast_h, FastChild) and isinstance(fast_c, FastChild)
    values = [0.0, 0.0001, 0.00011, 0.0025, 0.7, 600, 601, 1e9, -1.0, float("nan")]
    for v in values:
        hists[0].observe(v)
        fast_h.observe(v)
    for n in (1, 3, 0.5, 0):
        counts[0].inc(n)
        fast_c.inc(n)
    assert exposition(regs[0]) == exposition(regs[1])
    with pytest.raises(ValueError):
        fast_c.inc(-1)


def test_a_recorder_is_the_plain_child_where_values_are_not_plain() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from gateway.observability.metrics import fast_child

    child = Counter("c", "c", ["model"], registry=CollectorRegistry()).labels("m")
    child._value = object()  # as another value class (multiprocess mode) would be
    assert fast_child(child) is child


def test_the_gateway_memoizes_one_recorder_per_series() -> None:
    metrics = GatewayMetrics()
    first = metrics.recorder(metrics.latency, "/v1/chat/completions")
    assert metrics.recorder(metrics.latency, "/v1/chat/completions") is first
    first.observe(0.2)
    assert 'token_gateway_request_duration_seconds_count{endpoint="/v1/chat/completions"} 1.0' in metrics.render().decode()


def test_a_gauge_adder_moves_the_gauge_as_inc_and_dec_do() -> None:
    from prometheus_client import CollectorRegistry, Gauge

    from gateway.observability.metrics import gauge_adder

    plain, fast = (Gauge("g", "g", registry=CollectorRegistry()) for _ in range(2))
    add = gauge_adder(fast)
    assert add != fast.inc  # the direct path
    for amount in (1, 1, -1, 2.5, -3.5):
        plain.inc(amount)
        add(amount)
    assert fast._value.get() == plain._value.get() == 0.0
    add(1)
    assert fast._value.get() == 1.0
    odd = Gauge("h", "h", registry=CollectorRegistry())
    odd._value = object()  # as another value class (multiprocess mode) would be
    assert gauge_adder(odd) == odd.inc
    assert GatewayMetrics().in_flight_add != GatewayMetrics().in_flight.inc


def test_per_request_updates_make_their_series_on_first_use_and_add_up() -> None:
    metrics = GatewayMetrics()

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    for _ in range(2):
        metrics.worker_done("m", "w0", predicted_cached=16, reported_cached=32, success=True)
    assert value("token_gateway_cached_tokens_predicted_total", model="m") == 32
    assert value("token_gateway_cached_tokens_reported_total", model="m") == 64
    assert value("token_gateway_prompt_tokens_total", model="m") is None  # not before its first update
    for _ in range(3):
        metrics.generation_done("m", "w0", prompt_tokens=40, completion_tokens=8, cached_tokens=32)
    assert value("token_gateway_prompt_tokens_total", model="m") == 120
    assert value("token_gateway_completion_tokens_total", model="m") == 24
