"""``token_gateway_sync_*``: the routing sync's health and budgets (bytes, lag, peers).

Counters are read from the bus and applier at scrape time (one source of truth);
the decision-to-remote-tree lag is a histogram fed by the applier's ``on_lag`` hook
(one call per batch: ``metrics.observe_many``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.sync.bus import SyncBus
from gateway.sync.host_prefill import HostPrefill
from gateway.sync.host_ring import HostRing

# From tens of microseconds (same host) to seconds (a bus that was away).
LAG_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


def lag_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "token_gateway_sync_lag_seconds",
        "time from another process's routing decision to its application in this process's policy",
        buckets=LAG_BUCKETS, registry=registry,
    )


class SyncCollector(Collector):
    def __init__(self, bus: SyncBus, ring: HostRing | None = None, prefill: HostPrefill | None = None) -> None:
        self._bus = bus
        self._ring = ring
        self._prefill = prefill

    def describe(self) -> Iterable[object]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        b, a = self._bus.stats, self._bus.applier.stats
        yield GaugeMetricFamily("token_gateway_sync_connected", "1 while this process is connected to the NATS sync bus", value=int(b.connected))
        yield GaugeMetricFamily("token_gateway_sync_peers", "other gateway processes heard from recently", value=len(self._bus.applier.peers))
        yield GaugeMetricFamily("token_gateway_sync_remote_in_flight", "requests other gateway processes have on this pool's workers", value=self._bus.applier.remote_in_flight())
        for name, doc, value in (
            ("disconnects", "times the NATS connection was lost (routing fell back to local knowledge)", b.disconnects),
            ("published_batches", "sync batches published (one per event-loop tick with news, plus heartbeats)", b.published_batches),
            ("published_bytes", "bytes of sync batches published", b.published_bytes),
            ("published_decisions", "routing decisions published", b.published_decisions),
            ("dropped_batches", "sync batches not published (bus not reached yet, or its buffer full)", b.dropped_batches),
            ("replayed_decisions", "decisions re-announced after a reconnect", b.replayed_decisions),
            ("kv_event_messages", "messages of their own for relayed KV events too large for their tick's batch", b.kv_event_messages),
            ("received_batches", "sync batches received from other processes", a.batches),
            ("applied_decisions", "other processes' decisions applied to this process's policies", a.decisions),
            ("skipped_decisions", "other processes' decisions for workers this process does not know", a.skipped),
            ("unresolved_decisions", "other processes' decisions whose prefix reference (or extended decision) this process could not resolve", a.unresolved),
            ("applied_extensions", "other processes' learned outputs applied as extensions of their decisions (also in applied_decisions)", a.extensions),
            ("unresolved_finishes", "other processes' finishes of decisions this process did not know (dropped)", a.unresolved_finishes),
            ("lost_batches", "other processes' batches missed (sequence gaps)", a.lost_batches),
            ("bad_messages", "undecodable messages on the sync subject", a.bad),
            ("received_kv_batches", "KV-event batches other processes read from endpoints only they can bind", a.kv_batches),
        ):
            yield CounterMetricFamily(f"token_gateway_sync_{name}", doc, value=value)
        r = self._ring
        if r is not None:
            for name, doc, value in (
                ("written", "decisions written to this process's same-host ring", r.stats.written),
                ("applied", "sibling processes' decisions applied from their same-host rings before a choice", r.stats.applied),
                ("skipped", "sibling decisions from the rings for workers this process does not know", r.stats.skipped),
                ("overrun", "sibling decisions overwritten in their ring before this process read them", r.stats.overrun),
            ):
                yield CounterMetricFamily(f"token_gateway_sync_same_host_{name}", doc, value=value)
        p = self._prefill
        if p is not None:
            for name, doc, value in (
                ("sent", "requests in prefill this process told its siblings of (their prefill gates hold for them)", p.stats.sent),
                ("heard", "sibling processes' requests in prefill taken into this process's prefill gate", p.stats.heard),
                ("released", "sibling processes' requests in prefill released by the end of their prefill", p.stats.released),
                ("dropped", "sibling processes' requests in prefill dropped unreleased (a ring overrun, a restarted sibling, or older than twice the longest hold)", p.stats.dropped),
            ):
                yield CounterMetricFamily(f"token_gateway_sync_same_host_prefill_{name}", doc, value=value)
