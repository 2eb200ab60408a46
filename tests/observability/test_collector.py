"""Scrape-time series read from live state (observability/collector.py): per-worker load,
health and breaker; each model's prompt and reply caches; the routing quality per pool.
A worker that leaves takes its series with it."""

from __future__ import annotations

from functools import cache

from prometheus_client import CollectorRegistry

from gateway.observability.collector import (
    RoutingQualityCollector,
    TokenizerCacheCollector,
    WorkerCollector,
)
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.offpath import run_pending
from gateway.policies.base import RouteRequest
from gateway.tokenization import ChatPromptCache, Tokenizer
from gateway.tokenization.reply_cache import ReplyTokenCache
from tests.fake_transport import MODEL, FakeTransport, fleet
from tests.tokenization.helpers import qwen_files


@cache
def _qwen() -> Tokenizer:
    return Tokenizer.from_path(qwen_files())


async def test_worker_series_follow_the_registry() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    registry = CollectorRegistry()
    registry.register(WorkerCollector.for_registry(f.registry))
    value = registry.get_sample_value
    labels = {"worker": "a:1", "role": "regular", "model": MODEL}
    guard = f.worker("a:1").load.acquire(100, 16)
    assert value("token_gateway_worker_in_flight", labels) == 1
    assert value("token_gateway_worker_queued_prefill_tokens", labels) == 100
    assert value("token_gateway_worker_dispatched_total", labels) == 1
    assert value("token_gateway_worker_breaker_state", {**labels, "state": "closed"}) == 1
    assert value("token_gateway_worker_breaker_state", {**labels, "state": "open"}) == 0
    guard.release()
    f.worker("b:1").healthy = False
    b = {"worker": "b:1", "role": "regular", "model": MODEL}
    assert value("token_gateway_worker_in_flight", labels) == 0
    assert value("token_gateway_worker_healthy", b) == 0 and value("token_gateway_worker_available", b) == 0
    await f.registry.remove("b:1", drain_timeout_s=0)
    assert value("token_gateway_worker_healthy", b) is None  # gone with the worker


def test_prompt_and_reply_cache_series_per_model() -> None:
    tok = _qwen()
    with_replies = ModelEntry("m1", tok, "path", 0, ChatPromptCache(tok), reply_cache=ReplyTokenCache(tok))
    without = ModelEntry("m2", tok, "path", 0, ChatPromptCache(tok))

    class _Catalog:
        def entries(self) -> list[ModelEntry]:
            return [with_replies, without]

    registry = CollectorRegistry()
    registry.register(TokenizerCacheCollector(_Catalog()))  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("token_gateway_tokenizer_cache_lookups_total", {"model": "m1"}) == 0
    assert value("token_gateway_tokenizer_cache_lookups_total", {"model": "m2"}) == 0
    ids = tok.encode("Hello there, how are you?", add_special_tokens=False)
    assert with_replies.reply_cache is not None and with_replies.reply_cache.record(None, tok.decode(ids), ids)
    assert value("token_gateway_reply_cache_recorded_total", {"model": "m1"}) == 1
    assert value("token_gateway_reply_cache_entries", {"model": "m1"}) == 1
    assert value("token_gateway_reply_cache_recorded_total", {"model": "m2"}) is None  # no reply cache: no series


async def test_routing_quality_series_per_pool() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), policy="cache_aware")
    registry = CollectorRegistry()
    registry.register(RoutingQualityCollector(f.router))
    value = registry.get_sample_value
    lv = {"model": MODEL, "pool": "regular"}
    assert value("token_gateway_routing_offered_prompt_tokens_total", lv) is None  # no pool yet
    f.router.select(RouteRequest(token_ids=list(range(64)), model=MODEL, request_id="r1"))
    run_pending()  # the statistic is applied off the request's path
    assert value("token_gateway_routing_offered_prompt_tokens_total", lv) == 64
    assert value("token_gateway_routing_ideal_cached_tokens_total", lv) == 0  # first sight of the prompt
    assert value("token_gateway_routing_load_only", lv) == 0
    assert value("token_gateway_prefill_gate_in_prefill") == 0
