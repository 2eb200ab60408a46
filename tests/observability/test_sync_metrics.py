"""``token_gateway_sync_*`` (observability/sync_metrics.py): read from the bus and the
applier at scrape time, plus the decision-to-tree lag histogram."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from gateway.observability.metrics import observe_many
from gateway.observability.sync_metrics import SyncCollector, lag_histogram
from gateway.proto import sync_pb2
from gateway.sync.apply import Applier
from gateway.sync.bus import BusStats
from tests.sync.fakes import FakeRouter, FakeWorkers


def test_the_series_follow_the_bus_and_the_applier_at_scrape_time() -> None:
    applier = Applier("me", FakeRouter(), FakeWorkers())  # type: ignore[arg-type]
    bus = SimpleNamespace(stats=BusStats(connected=True, published_batches=4, dropped_batches=1), applier=applier)
    registry = CollectorRegistry()
    registry.register(SyncCollector(bus))  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("token_gateway_sync_connected") == 1 and value("token_gateway_sync_peers") == 0
    assert value("token_gateway_sync_published_batches_total") == 4 and value("token_gateway_sync_dropped_batches_total") == 1
    batch = sync_pb2.Batch(origin="peer", seq=1)
    batch.loads.add(worker_id="w0:1", in_flight=2)
    applier.apply(batch)
    applier.apply_bytes(b"\xff garbage")
    bus.stats.connected = False
    assert value("token_gateway_sync_connected") == 0 and value("token_gateway_sync_peers") == 1
    assert value("token_gateway_sync_remote_in_flight") == 2
    assert value("token_gateway_sync_received_batches_total") == 1 and value("token_gateway_sync_bad_messages_total") == 1


def test_the_lag_histogram_spans_microseconds_to_seconds() -> None:
    registry = CollectorRegistry()
    lag = lag_histogram(registry)
    observe_many(lag, [0.00004, 0.003, 4.0])
    value = registry.get_sample_value
    assert value("token_gateway_sync_lag_seconds_count") == 3
    assert value("token_gateway_sync_lag_seconds_bucket", {"le": "5e-05"}) == 1
    assert value("token_gateway_sync_lag_seconds_bucket", {"le": "0.005"}) == 2
    assert value("token_gateway_sync_lag_seconds_bucket", {"le": "2.5"}) == 2


def test_the_same_host_ring_series_appear_only_with_a_ring() -> None:
    from gateway.sync.host_ring import RingStats

    applier = Applier("me", FakeRouter(), FakeWorkers())  # type: ignore[arg-type]
    bus = SimpleNamespace(stats=BusStats(), applier=applier)
    ring = SimpleNamespace(stats=RingStats(written=3, applied=5, skipped=1, overrun=2))
    with_ring, without = CollectorRegistry(), CollectorRegistry()
    with_ring.register(SyncCollector(bus, ring))  # type: ignore[arg-type]
    without.register(SyncCollector(bus))  # type: ignore[arg-type]
    assert without.get_sample_value("token_gateway_sync_same_host_applied_total") is None
    value = with_ring.get_sample_value
    assert value("token_gateway_sync_same_host_written_total") == 3 and value("token_gateway_sync_same_host_applied_total") == 5
    assert value("token_gateway_sync_same_host_skipped_total") == 1 and value("token_gateway_sync_same_host_overrun_total") == 2
    ring.stats.applied += 1
    assert value("token_gateway_sync_same_host_applied_total") == 6
