"""Scrape-time metrics read from live gateway state (workers, tokenizer caches).

Worker state changes on every request; reading it when Prometheus scrapes
(instead of mirroring it into gauges) keeps one source of truth and drops the
series of a removed worker by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.pipeline.catalog import ModelCatalog
from gateway.pipeline.router import Router
from gateway.workers.breaker import BreakerState
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Worker

WORKER_LABELS = ["worker", "role", "model"]


class WorkerCollector(Collector):
    """Per-worker load, health and breaker state, from the registry at scrape time."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self._workers = workers

    @classmethod
    def for_registry(cls, registry: WorkerRegistry) -> WorkerCollector:
        return cls(registry.all)

    def describe(self) -> Iterable[object]:
        return []  # series depend on who is registered; describe nothing up front

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        g = GaugeMetricFamily
        in_flight = g("token_gateway_worker_in_flight", "requests the gateway has on this worker now", labels=WORKER_LABELS)
        prefill = g("token_gateway_worker_queued_prefill_tokens", "prompt tokens sent that have no first token yet", labels=WORKER_LABELS)
        decode = g("token_gateway_worker_running_decode_tokens", "max_new_tokens still owed by running requests", labels=WORKER_LABELS)
        healthy = g("token_gateway_worker_healthy", "1 if the worker passes health checks", labels=WORKER_LABELS)
        available = g("token_gateway_worker_available", "1 if the worker takes new requests (healthy, not draining, breaker allows)", labels=WORKER_LABELS)
        draining = g("token_gateway_worker_draining", "1 while the worker is being removed", labels=WORKER_LABELS)
        breaker = g("token_gateway_worker_breaker_state", "circuit breaker state, one series per state (1 = current)", labels=[*WORKER_LABELS, "state"])
        failures = g("token_gateway_worker_breaker_consecutive_failures", "consecutive failed requests counted by the breaker", labels=WORKER_LABELS)
        window = g("token_gateway_worker_breaker_window_requests", "request outcomes in the breaker's sliding window", labels=WORKER_LABELS)
        window_failed = g("token_gateway_worker_breaker_window_failures", "failed requests in the breaker's sliding window", labels=WORKER_LABELS)
        opens = CounterMetricFamily("token_gateway_worker_breaker_opens", "times the worker's breaker opened (failures in a row, failure ratio, failed trial, or the watchdog)", labels=WORKER_LABELS)
        stalls = CounterMetricFamily("token_gateway_worker_watchdog_stalls", "times the progress watchdog found the worker silent with work in flight and took it out of rotation", labels=WORKER_LABELS)
        sent = CounterMetricFamily("token_gateway_worker_dispatched", "requests sent to this worker since it joined", labels=WORKER_LABELS)
        for w in self._workers():
            labels = [w.id, w.role, w.model]
            in_flight.add_metric(labels, w.load.in_flight)
            prefill.add_metric(labels, w.load.queued_prefill_tokens)
            decode.add_metric(labels, w.load.running_decode_tokens)
            healthy.add_metric(labels, float(w.healthy))
            available.add_metric(labels, float(w.available))
            draining.add_metric(labels, float(w.draining))
            for state in BreakerState:
                breaker.add_metric([*labels, state.value], float(w.breaker.state is state))
            failures.add_metric(labels, w.breaker.consecutive_failures)
            total, failed = w.breaker.window_counts()
            window.add_metric(labels, total)
            window_failed.add_metric(labels, failed)
            opens.add_metric(labels, w.breaker.opens)
            stalls.add_metric(labels, w.progress.stalls)
            sent.add_metric(labels, w.load.total_requests)
        yield from (in_flight, prefill, decode, healthy, available, draining, breaker, failures, sent)
        yield from (window, window_failed, opens, stalls)


class TokenizerCacheCollector(Collector):
    """Hits of each model's chat-prompt token cache (resent history tokenized once)."""

    def __init__(self, catalog: ModelCatalog) -> None:
        self._catalog = catalog

    def describe(self) -> Iterable[object]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = CounterMetricFamily
        lookups = c("token_gateway_tokenizer_cache_lookups", "prompts tokenized through the prefix token cache", labels=["model"])
        hits = c("token_gateway_tokenizer_cache_hits", "lookups that reused at least one cached chunk", labels=["model"])
        reused = c("token_gateway_tokenizer_cache_reused_tokens", "prompt tokens taken from the cache", labels=["model"])
        encoded = c("token_gateway_tokenizer_cache_encoded_tokens", "prompt tokens the tokenizer had to produce", labels=["model"])
        evictions = c("token_gateway_tokenizer_cache_evictions", "cache entries evicted", labels=["model"])
        entries = GaugeMetricFamily("token_gateway_tokenizer_cache_entries", "chunks held by the cache", labels=["model"])
        for entry in self._catalog.entries():
            st = entry.prompt_cache.stats()
            lookups.add_metric([entry.name], st.lookups)
            hits.add_metric([entry.name], st.hits)
            reused.add_metric([entry.name], st.reused_tokens)
            encoded.add_metric([entry.name], st.encoded_tokens)
            evictions.add_metric([entry.name], st.evictions)
            entries.add_metric([entry.name], st.entries)
        yield from (lookups, hits, reused, encoded, evictions, entries)
        yield from self._replies()

    def _replies(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """``--reply-token-reuse``: replies recorded and spliced back as their generated ids."""
        c = CounterMetricFamily
        recorded = c("token_gateway_reply_cache_recorded", "chat replies remembered with the ids that generated them", labels=["model"])
        rejected = c("token_gateway_reply_cache_rejected", "replies not remembered: their ids do not decode to the text sent (stop string, reasoning, tool calls) or too large", labels=["model"])
        spans = c("token_gateway_reply_cache_spliced_spans", "assistant messages tokenized as their generated ids", labels=["model"])
        tokens = c("token_gateway_reply_cache_spliced_tokens", "prompt tokens taken from generated replies", labels=["model"])
        evictions = c("token_gateway_reply_cache_evictions", "replies evicted (entries or bytes bound)", labels=["model"])
        entries = GaugeMetricFamily("token_gateway_reply_cache_entries", "replies held", labels=["model"])
        size = GaugeMetricFamily("token_gateway_reply_cache_bytes", "memory the held replies account for (text + 4 bytes per token)", labels=["model"])
        for entry in self._catalog.entries():
            if entry.reply_cache is None:
                continue
            st = entry.reply_cache.stats()
            for family, value in ((recorded, st.recorded), (rejected, st.rejected), (spans, st.spliced_spans),
                                  (tokens, st.spliced_tokens), (evictions, st.evictions), (entries, st.entries), (size, st.bytes)):
                family.add_metric([entry.name], value)
        yield from (recorded, rejected, spans, tokens, evictions, entries, size)


class RoutingQualityCollector(Collector):
    """Per (model, pool): the ideal hit rate of the traffic offered, the achieved and the
    predicted one, closed-loop corrections, hot prefixes and the tokenizer-fidelity guard,
    read from the router's ``PoolQuality`` and the live policies at scrape time."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def describe(self) -> Iterable[object]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c, g = CounterMetricFamily, GaugeMetricFamily
        labels = ["model", "pool"]
        offered = c("token_gateway_routing_offered_prompt_tokens", "prompt tokens offered to the pool (first attempts)", labels=labels)
        ideal = c("token_gateway_routing_ideal_cached_tokens", "offered prompt tokens an infinite shared cache would have hit (bounded prefix sketch)", labels=labels)
        sent = c("token_gateway_routing_prompt_tokens", "prompt tokens of the pool's successful worker streams", labels=labels)
        reported = c("token_gateway_routing_reported_cached_tokens", "of those, the tokens the workers reported cached", labels=labels)
        predicted = c("token_gateway_routing_predicted_cached_tokens", "of those, the tokens the policy predicted cached", labels=labels)
        ideal_ratio = g("token_gateway_routing_ideal_hit_ratio", "ideal hit rate of the traffic offered so far", labels=labels)
        achieved_ratio = g("token_gateway_routing_achieved_hit_ratio", "reported cached / prompt tokens so far", labels=labels)
        mismatch = c("token_gateway_tokenizer_mismatch", "finishes whose worker prompt_tokens differed from the gateway's count", labels=labels)
        load_only = g("token_gateway_routing_load_only", "1 while the pool routes this model by load only (tokenizer mismatch)", labels=labels)
        under = c("token_gateway_routing_tree_corrections", "finishes whose reported cached tokens were below the tree's prediction (claims cut)", labels=labels)
        cut = c("token_gateway_routing_tree_corrected_tokens", "tree tokens dropped by those corrections", labels=labels)
        over = c("token_gateway_routing_tree_learned", "finishes whose reported cached tokens exceeded the prediction (recorded)", labels=labels)
        hot = g("token_gateway_routing_hot_prefixes", "shared prefixes held on more than one worker because of their load share", labels=labels)
        qweight = g("token_gateway_routing_queued_prefill_weight", "cache_aware's current weight of queued prefill (0.5 while no offered prefix is hot, 1.0 once one is)", labels=labels)
        dfill = g("token_gateway_routing_decode_fill", "cache_aware's share of running requests' max_tokens counted as decode owed (decoded / max_tokens of recent finishes; 1 with exact lengths)", labels=labels)
        cause_labels = ["model", "pool", "cause"]
        miss_tokens = c("token_gateway_routing_miss_tokens", "prompt tokens the workers had to prefill, by why the cache missed them (first_sight, in_prefill, evicted, new_worker, spilled_for_load, held_elsewhere)", labels=cause_labels)
        misses = c("token_gateway_routing_misses", "requests that missed part of their prompt, by the cause of their first missed block", labels=cause_labels)
        changed = c("token_gateway_worker_cache_params_changes", "times a worker's page size or KV capacity changed", labels=["worker"])
        policies = self._router.policies()
        for (model, pool), q in self._router.qualities().items():
            lv = [model, pool]
            offered.add_metric(lv, q.offered.prompt_tokens)
            ideal.add_metric(lv, q.offered.ideal_cached_tokens)
            sent.add_metric(lv, q.prompt_tokens)
            reported.add_metric(lv, q.reported_cached_tokens)
            predicted.add_metric(lv, q.predicted_cached_tokens)
            ideal_ratio.add_metric(lv, q.offered.ideal_hit_rate)
            achieved_ratio.add_metric(lv, q.reported_cached_tokens / q.prompt_tokens if q.prompt_tokens else 0.0)
            mismatch.add_metric(lv, q.guard.mismatches)
            for cause, count in q.misses.counts.items():
                miss_tokens.add_metric([*lv, cause], count.tokens)
                misses.add_metric([*lv, cause], count.requests)
            load_only.add_metric(lv, float(q.guard.tripped))
            pq = policies[(model, pool)].quality() if (model, pool) in policies else {}
            if "under_predicted" in pq:
                under.add_metric(lv, pq["under_predicted"])
                cut.add_metric(lv, pq["corrected_tokens"])
                over.add_metric(lv, pq["over_predicted"])
            if "hot_prefixes" in pq:
                hot.add_metric(lv, len(pq["hot_prefixes"]))
            if "queued_prefill_weight" in pq:
                qweight.add_metric(lv, pq["queued_prefill_weight"])
            if "decode_fill" in pq:
                dfill.add_metric(lv, pq["decode_fill"])
        for worker, n in self._router.cache_param_changes.items():
            changed.add_metric([worker], n)
        yield from (offered, ideal, sent, reported, predicted, ideal_ratio, achieved_ratio, mismatch, load_only,
                    under, cut, over, hot, qweight, dfill, miss_tokens, misses, changed)
        yield from self._prefill_gate()

    def _prefill_gate(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """What the prefill gate (``pipeline.prefill_gate``) held, per (model, pool)."""
        c, g = CounterMetricFamily, GaugeMetricFamily
        labels = ["model", "pool"]
        held = c("token_gateway_prefill_gate_held", "requests held while a request sharing their prefix was in prefill on their worker", labels=labels)
        timeouts = c("token_gateway_prefill_gate_timeouts", "holds ended by their timeout rather than the blocker's first token", labels=labels)
        cancelled = c("token_gateway_prefill_gate_cancelled", "held requests cancelled while waiting (client gone, shutdown)", labels=labels)
        seconds = c("token_gateway_prefill_gate_hold_seconds", "total time requests were held, seconds", labels=labels)
        gained = c("token_gateway_prefill_gate_gained_tokens", "prompt tokens the holds were to turn from a second prefill into cache hits (predicted)", labels=labels)
        waiting = g("token_gateway_prefill_gate_waiting", "requests held now", labels=labels)
        in_prefill = g("token_gateway_prefill_gate_in_prefill", "requests sent that have no first token yet, tracked by the gate")
        holds = self._router.holds
        for (model, pool), st in list(holds.stats.items()):
            lv = [model, pool]
            held.add_metric(lv, st.held)
            timeouts.add_metric(lv, st.timed_out)
            cancelled.add_metric(lv, st.cancelled)
            seconds.add_metric(lv, st.hold_s)
            gained.add_metric(lv, st.gained_tokens)
            waiting.add_metric(lv, st.waiting)
        in_prefill.add_metric([], len(holds.rule))
        yield from (held, timeouts, cancelled, seconds, gained, waiting, in_prefill)


class QueueCollector(Collector):
    """Requests waiting for admission by priority class and tenant (API key id, ``-``
    without keys), read from the admission queue at scrape time."""

    def __init__(self, waiting: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self._waiting = waiting

    def describe(self) -> Iterable[object]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "token_gateway_queue_waiting",
            "requests waiting for admission, by priority (above, default or below the default 0) and tenant (API key id)",
            labels=["priority", "tenant"],
        )
        for (priority, tenant), count in sorted(self._waiting().items()):
            family.add_metric([priority, tenant], count)
        yield family
