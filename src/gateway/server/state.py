"""Everything one gateway process owns, built from its config, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from gateway.endpoints.background import BackgroundRuns
from gateway.endpoints.responses import ResponsesApi
from gateway.observability.collector import (
    QueueCollector,
    RoutingQualityCollector,
    TokenizerCacheCollector,
    WorkerCollector,
)
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.tracing import make_tracing
from gateway.pipeline.catalog import ModelCatalog
from gateway.pipeline.engine import Engine
from gateway.pipeline.pd import pool_policy_config
from gateway.pipeline.router import PolicyMaker, Router
from gateway.pipeline.store.factory import History
from gateway.pipeline.text_relay import TextRelay, takes_text
from gateway.pipeline.worker_gate import WorkerGate
from gateway.policies.factory import close_policy, make_policy
from gateway.policies.fair_queue import parse_weights
from gateway.protocol.errors import InvalidRequestError
from gateway.server.admission import Admission
from gateway.server.config import GatewayConfig
from gateway.server.conversations_entry import ConversationsEntry
from gateway.server.late_workers import LateWorkers
from gateway.server.process_set import ENV_COUNT, ENV_INDEX, ENV_RUN_DIR, SetMember
from gateway.server.responses_entry import ResponsesEntry
from gateway.server.security import Authenticator, key_id
from gateway.sync.bus import SyncBus
from gateway.sync.config import SyncConfig
from gateway.sync.host_prefill import HostPrefill, host_set_id
from gateway.sync.host_ring import HostRing
from gateway.sync.policy_tap import FanOut
from gateway.workers.client import BadWorkerUrl
from gateway.workers.discovery.reconcile import Target
from gateway.workers.discovery.sources import make_discovery
from gateway.workers.health import HealthMonitor
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.load_monitor import LoadMonitor
from gateway.workers.registry import WorkerRegistry, grpc_connect_with
from gateway.workers.watchdog import ProgressTracker, Watchdog
from gateway.workers.worker import Worker
from gateway.workers.zmq_kv_events import parse_sources, wants_discovery

log = logging.getLogger(__name__)


def _memory_set(config: SyncConfig) -> tuple[Path, int, int] | None:
    """(run folder, index, count) of this process in a ``serve --processes N`` set whose
    members share memory (``--sync-same-host memory``), or None outside one."""
    if config.sync_same_host != "memory" or ENV_INDEX not in os.environ:
        return None
    count = int(os.environ[ENV_COUNT])
    if count < 2:
        return None
    return Path(os.environ[ENV_RUN_DIR]), int(os.environ[ENV_INDEX]), count


def same_host_ring(config: SyncConfig, bus: SyncBus) -> HostRing | None:
    """The ring of decisions this process shares with its siblings of one ``serve
    --processes N`` set (``--sync-same-host memory``), or None outside a set."""
    member = _memory_set(config)
    return None if member is None else HostRing(*member, bus.applier.target)


def same_host_set(config: SyncConfig) -> str:
    """The set's id on the bus (``host_prefill.host_set_id``), or "" outside a set sharing memory."""
    member = _memory_set(config)
    return "" if member is None else host_set_id(member[0])


def key_weights(items: list[str], api_keys: list[str]) -> dict[str, float]:
    """``--key-weights`` by key id (what admission sees): an entry may name a configured
    key itself or its id (as logs and metrics show it)."""
    keys = set(api_keys)
    return {(key_id(name) or name) if name in keys else name: weight for name, weight in parse_weights(items).items()}


class GatewayState:
    def __init__(self, config: GatewayConfig, *, policy_maker: PolicyMaker | None = None) -> None:
        """``policy_maker`` (role -> policy) replaces ``make_policy(config.policy)``; the
        benchmark uses it for its evaluation-only oracle."""
        self.config = config
        server = config.server
        self.registry = WorkerRegistry(
            tls=config.security.tls(),
            worker_api_key=server.worker_api_key,
            probe_timeout_s=server.probe_timeout_s,
            breaker=config.health.breaker,
            progress=lambda: ProgressTracker(config.watchdog),
            connect=grpc_connect_with(
                server.worker_stream_transport, kv_event_discovery=server.kv_events and wants_discovery(server.kv_events_zmq),
            ),
        )
        self.router = Router(
            self.registry,
            policy_maker or (lambda role: make_policy(pool_policy_config(config.policy, config.pd, role))),
        )
        self.catalog = ModelCatalog(
            Path(server.tokenizer_cache_dir),
            tokenizer_path=server.tokenizer_path,
            served_name=server.model,
            parsers=config.parsers,
            reply_token_reuse=server.reply_token_reuse,
            reply_cache_entries=server.reply_cache_entries,
            reply_cache_bytes=server.reply_cache_bytes,
            tokenizer_hub=server.tokenizer_hub,
            max_tokenizer_bytes=server.max_tokenizer_bytes,
            max_vocabulary_entries=server.max_vocabulary_entries,
            warm_encoders=config.engine.encoder_at_load,
        )
        self.text_relay = TextRelay(self.registry)  # workers that take text only (--backend openai)
        self.metrics = GatewayMetrics()
        self.tracing = make_tracing(config.tracing)  # None (no-op) without --otlp-traces-endpoint
        self.metrics.tracing = self.tracing
        self.metrics.registry.register(WorkerCollector.for_registry(self.registry))
        self.metrics.registry.register(TokenizerCacheCollector(self.catalog))
        self.metrics.registry.register(RoutingQualityCollector(self.router))
        self.engine = Engine(
            self.router,
            self.catalog,
            config=config.engine,
            retry=config.retry,
            dispatch=config.dispatch,
            limits=config.limits,
            observer=self.metrics,
            resume=config.resume,
        )
        rejections = self.metrics.admission_rejections
        admission = config.admission
        weights = key_weights(admission.key_weights, server.api_keys)
        self.admission = Admission(
            admission, on_reject=lambda reason: rejections.labels(reason=reason).inc(),
            fleet_slots=self._fleet_slots, weights=weights,
        )
        if admission.fleet_headroom >= 0 and admission.fleet_slot_bound:
            self.router.slot_headroom = admission.fleet_headroom
            if admission.fleet_slot_wait:
                self.router.gate = WorkerGate(
                    weights, headroom=admission.fleet_headroom, reserve=admission.fair_reserve,
                    prefill_budget=admission.prefill_budget_tokens, share_first=admission.gate_share_first,
                    fair_spill=admission.fair_spill, prefill_reserve=admission.fair_prefill_reserve, warm_reroute=admission.fair_warm_reroute,
                    yields_prefill=self.admission.yields_prefill,
                    contended=self.admission.contended,
                    below_share=self.admission.below_share, aging_s=admission.priority_aging_s,
                    low_values_first=admission.low_priority_values_first,
                    across_tenants=admission.priority_across_keys,
                )
        self.metrics.queue_depth.set_function(lambda: self.admission.queued)
        self.metrics.registry.register(QueueCollector(self.admission.waiting))
        self.auth = Authenticator(server.api_keys, config.security)
        self.health = HealthMonitor(self.registry, config.health)
        self.watchdog = Watchdog(self.registry.all, config.watchdog)
        self.loads = LoadMonitor(
            self.registry,
            self._pool_needs_loads,
            config.load_monitor,
        )
        self.kv_events = (
            KvEventFeeder(self.registry, self.router, zmq_sources=parse_sources(server.kv_events_zmq),
                          discover=wants_discovery(server.kv_events_zmq))
            if server.kv_events else None
        )
        self.sync: SyncBus | None = None  # the routing view shared with other processes (gateway.sync)
        self.host_ring: HostRing | None = None  # and its same-host fast path (serve --processes N)
        self.host_prefill: HostPrefill | None = None  # the set's requests in prefill (the prefill gate's)
        if config.sync.sync_url:
            from functools import partial

            from gateway.observability.metrics import observe_many
            from gateway.observability.sync_metrics import SyncCollector, lag_histogram

            lag = lag_histogram(self.metrics.registry)
            self.sync = SyncBus(
                config.sync, self.router, self.registry, on_lag=partial(observe_many, lag), host_set=same_host_set(config.sync)
            )
            self.host_ring = same_host_ring(config.sync, self.sync)
            if self.host_ring is None:
                self.router.tap(self.sync.outbox)
            else:
                # and its requests in prefill, so that each process's prefill gate holds for its siblings' too,
                # and each choice counts what the siblings have queued on a worker as the set's own traffic
                holds = self.router.holds
                self.host_prefill = HostPrefill(
                    self.host_ring.run_dir, self.host_ring.index, self.host_ring.count,
                    on_sent=holds.remote_sent, on_done=holds.prefilled, max_age_s=2 * config.dispatch.prefill_gate_max_s,
                    on_queued=self._sibling_queued, on_in_flight=self._sibling_in_flight,
                    max_flight_s=config.dispatch.request_timeout_s,
                )
                holds.share = self.host_prefill
                self.router.tap(FanOut(self.sync.outbox, self.host_ring), before_select=self._hear_siblings)
            self.metrics.registry.register(SyncCollector(self.sync, self.host_ring, self.host_prefill))
            if self.kv_events is not None:
                # an endpoint the gateway binds takes one process of the set: it hands its batches to the others
                self.kv_events.share(self.sync.outbox.kv_events, self.sync.outbox.kv_share_wanted)
                self.sync.applier.on_kv_share_wanted = self.kv_events.share_wanted
                self.sync.applier.on_kv_events = self.kv_events.relayed
        self.process_set: SetMember | None = None  # set by serve when one of --processes N
        self.discovery = make_discovery(config.discovery, self._discovered_add, self.remove_worker)
        self.history = History(config.history)  # stored responses and conversations
        self.responses = ResponsesApi(self.engine, self.history.store, config.mcp)
        self.background = BackgroundRuns(
            self.responses, config.history.history_stale_s,
            salt_of=self.auth.key_salt, store_in_use=self.history.in_use,
        )
        self.responses_entry = ResponsesEntry(self.responses, self.background, self.admission)  # both doors' one path
        self.conversations_entry = ConversationsEntry(self.history.store)
        self.ready = False
        self.late = LateWorkers(self.add_worker)  # listed workers not up at start, retried
        self.instance_id = uuid.uuid4().hex  # tells this process apart when it is asked to register itself

    def _fleet_slots(self) -> tuple[int, int]:
        """(running slots, workers) of the available workers that run requests to the end
        (regular and decode); (0, 0) when one of them reports no max_running_requests."""
        slots = workers = 0
        for w in self.registry.all():
            if w.role == "prefill" or not w.available:
                continue
            if w.info.max_running_requests <= 0:
                return 0, 0
            slots += w.info.max_running_requests
            workers += 1
        return slots, workers

    def _hear_siblings(self) -> None:
        """Before each choice (``serve --processes N``): the siblings' decisions into the
        policies' trees, and their requests in prefill into the workers' views."""
        assert self.host_ring is not None and self.host_prefill is not None
        self.host_ring.poll()
        self.host_prefill.poll()

    def _sibling_queued(self, worker_id: str, tokens: int) -> None:
        worker = self.registry.get(worker_id)
        if worker is not None:
            worker.sibling_queued_prompt_tokens = tokens

    def _sibling_in_flight(self, worker_id: str, requests: int) -> None:
        worker = self.registry.get(worker_id)
        if worker is not None:
            worker.sibling_in_flight = requests

    def _pool_needs_loads(self, worker: Worker) -> bool:
        policy = self.router.policies().get((worker.model, worker.role))
        return policy is not None and policy.needs_loads

    def model_names(self) -> list[str]:
        """Every model clients may ask for: those the gateway tokenizes for, then those only
        text workers (OpenAI backends) list."""
        names = self.catalog.names()
        return names + [m for m in self.text_relay.models() if m not in names]

    async def add_worker(
        self,
        url: str,
        *,
        role: str | None = None,
        bootstrap_port: int | None = None,
        api_key: str | None = None,
        model: str | None = None,
        engine: str | None = None,
        dp_size: int | None = None,
    ) -> Worker:
        """Probe, register and load the model's tokenizer before the worker takes traffic.
        ``dp_size`` overrides the worker's data-parallel ranks (default: --worker-dp-size,
        else what it reports)."""
        known = self.registry.get(url)
        worker = await self.registry.add(
            url, role=role, bootstrap_port=bootstrap_port, api_key=api_key, engine=engine,
            dp_size=dp_size or self.config.server.worker_dp_size or None,
        )
        try:
            if worker.info.gateway_instance == self.instance_id:
                # Its pass-through would route to itself, its load polls call themselves.
                raise InvalidRequestError(
                    f"{worker.url} is this gateway's own gRPC port; a gateway cannot be its own worker", param="url"
                )
            if model is not None and worker.model != model:
                raise InvalidRequestError(
                    f"worker {worker.url} serves model {worker.model!r}, not {model!r}", param="model"
                )
            if not takes_text(worker):  # a text-only worker needs no tokenizer: its requests go unchanged
                await self.catalog.ensure(worker)
        except BaseException:
            if known is not worker:
                await self.registry.remove(worker.id, drain_timeout_s=0)
            raise
        return worker

    async def _discovered_add(self, target: Target) -> Worker:
        return await self.add_worker(target.url, role=target.role, bootstrap_port=target.bootstrap_port)

    async def remove_worker(self, worker_id: str) -> Worker:
        """Drain (in-flight requests finish, new ones go elsewhere) and forget a worker."""
        return await self.registry.remove(
            worker_id, drain_timeout_s=self.config.server.worker_drain_timeout_s
        )

    async def start(self) -> None:
        self.background.start_sweeper()  # continues background runs whose process died
        pd = self.config.pd
        named = self.config.server.backend
        backend = {"engine": named} if named != "auto" else {}
        listed: list[tuple[str, dict[str, Any]]] = [(u, dict(backend)) for u in self.config.server.worker_urls]
        listed += [(s.url, {"role": "prefill", "bootstrap_port": s.bootstrap_port}) for s in pd.prefill]
        listed += [(s.url, {"role": "decode"}) for s in pd.decode]
        results = await asyncio.gather(*(self.add_worker(u, **o) for u, o in listed), return_exceptions=True)
        for (url, options), result in zip(listed, results, strict=True):
            if isinstance(result, BadWorkerUrl):
                raise RuntimeError(str(result))  # a typo, not a worker still starting
            if isinstance(result, BaseException):
                # Started before its workers (compose, Kubernetes): keep trying, never exit.
                log.warning("worker %s not added yet (%s); retrying in the background", url, result)
                self.late.retry(url, result, **options)
        wait = self.config.server.worker_startup_timeout_s
        if wait > 0 and self.late.describe() and not await self.late.wait(wait):
            log.warning("%d listed worker(s) not up after %gs; still retrying", len(self.late.describe()), wait)
        for source in self.discovery:
            await source.first_round()  # discovered workers are there before the ready line
        self.ready = bool(self.registry.all())
        for source in self.discovery:
            source.start()
        self.health.start()
        self.watchdog.start()
        self.loads.start()
        if self.kv_events is not None:
            self.kv_events.start()
        if self.sync is not None:
            self.sync.start()  # connects in the background: never holds up serving

    async def stop(self) -> None:
        await self.late.stop()
        if self.sync is not None:
            await self.sync.stop()
        if self.host_ring is not None:
            self.host_ring.close()
        if self.host_prefill is not None:
            self.router.holds.share = None
            self.host_prefill.close()
        for source in self.discovery:
            await source.stop()
        if self.kv_events is not None:
            await self.kv_events.close()
        await self.health.stop()
        await self.watchdog.stop()
        await self.loads.stop()
        for policy in self.router.policies().values():
            close_policy(policy)
        self.engine.close()
        self.catalog.close()
        await self.registry.close()
        await self.background.close()
        await self.history.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
