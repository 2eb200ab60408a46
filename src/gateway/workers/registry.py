"""The set of workers the gateway routes to, grouped by model and role.

Registration probes the worker (GetModelInfo, GetServerInfo, then one HealthCheck)
before it can take traffic, so a dead or wrong URL fails loudly instead of black-holing requests.
An engine that reports several data-parallel ranks (``dp_size``, or the operator's
override) is registered as one routing target per rank, all sharing its client.
Removal drains: the worker stops getting new requests at once and leaves the
registry when its in-flight requests are done (or a timeout passes); removing any
rank of an engine removes the engine, all its ranks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from gateway.workers.breaker import CircuitBreaker
from gateway.workers.client import TlsOptions, WorkerClient, parse_worker_url
from gateway.workers.openai_backend import OpenAiBackendClient
from gateway.workers.sglang_http import HttpWorkerClient, SglangHttpClient
from gateway.workers.transport import CallCode, WorkerCallError, WorkerTransport
from gateway.workers.trtllm_grpc import TrtllmGrpcClient
from gateway.workers.vllm_grpc import VllmGrpcClient
from gateway.workers.vllm_http import VllmHttpClient
from gateway.workers.watchdog import ProgressTracker
from gateway.workers.worker import Roster, Worker, WorkerInfo, engine_of

MAX_DP_SIZE = 1024  # ranks one engine may claim (a bogus report must not make a million targets)

log = logging.getLogger(__name__)

ChangeListener = Callable[[str, Worker], None]  # ("added" | "removed" | "restarted", worker)
Connect = Callable[[str, TlsOptions | None, str | None], WorkerTransport]  # (url, tls, api key)


def grpc_connect(url: str, tls: TlsOptions | None, api_key: str | None) -> WorkerTransport:
    """The real transport, picked by the URL's scheme: a gRPC channel to a ``--grpc-mode``
    worker (Generate over the gateway's own HTTP/2), or SGLang's HTTP server for
    ``http(s)://`` (which engine answers there is checked by the probe)."""
    return grpc_connect_with("h2")(url, tls, api_key)


def grpc_connect_with(stream_transport: str, *, kv_event_discovery: bool = False) -> Connect:
    """``grpc_connect`` with gRPC Generate streams over ``stream_transport`` ("h2" or "grpcio");
    ``kv_event_discovery``: HTTP workers are asked for their KV-event publisher where that
    costs a request of its own (``--kv-events-zmq auto``)."""

    def connect(url: str, tls: TlsOptions | None, api_key: str | None) -> WorkerTransport:
        if parse_worker_url(url).is_http:
            return SglangHttpClient(url, tls=tls, api_key=api_key, kv_event_discovery=kv_event_discovery)
        return WorkerClient(url, tls=tls, api_key=api_key, stream_transport=stream_transport)

    return connect


class WorkerRegistrationError(Exception):
    """The worker could not be probed or does not fit the fleet."""


# An OpenAI backend is never detected (any OpenAI server lists its models): it is named.
HTTP_ENGINES: dict[str, type[HttpWorkerClient]] = {
    "sglang": SglangHttpClient, "vllm": VllmHttpClient, "openai": OpenAiBackendClient,
}
# Asked in this order when the engine is not named: each answers its own service, and a
# worker that answers a service's GetModelInfo with UNIMPLEMENTED is asked the next one's.
GRPC_ENGINES: dict[str, type[WorkerClient]] = {
    "sglang": WorkerClient, "vllm": VllmGrpcClient, "trtllm": TrtllmGrpcClient,
}
ENGINES = ("auto", *dict.fromkeys([*HTTP_ENGINES, *GRPC_ENGINES]))


async def _engine_client(client: Any, engine: str | None, engines: dict[str, Any], timeout: float) -> WorkerTransport:
    """The client of ``engines`` for the worker behind ``client`` (one transport's kinds):
    ``engine`` when given, else asked of the worker, each engine's API in the table's
    order until one is not UNIMPLEMENTED. Any other failure stays with the probe, which
    reports it."""
    if engine not in (None, "auto"):
        if engine not in engines:
            await client.close()
            raise WorkerRegistrationError(
                f"worker {client.url}: engine {engine!r} is not served over this transport (one of {tuple(engines)})"
            )
        chosen = engines[engine]
        if type(client) is chosen:
            return cast(WorkerTransport, client)
        await client.close()
        return cast(WorkerTransport, client.same_worker_as(chosen))
    kinds = [k for k in engines.values() if k is not OpenAiBackendClient]
    for following in kinds[kinds.index(type(client)) + 1:] if type(client) in kinds else []:
        try:
            await client.model_info(timeout=timeout)
            return cast(WorkerTransport, client)
        except WorkerCallError as exc:
            if exc.code is not CallCode.UNIMPLEMENTED:
                return cast(WorkerTransport, client)
        await client.close()
        client = client.same_worker_as(following)
    return cast(WorkerTransport, client)


async def with_engine(
    client: WorkerTransport, engine: str | None, timeout: float
) -> WorkerTransport:
    """The client for the engine behind a worker: ``engine`` when given, else detected
    from what answers (over HTTP SGLang's ``/get_model_info``, then vLLM's
    ``/v1/models``; over gRPC the service the worker knows). The tests' fakes pass through."""
    if isinstance(client, WorkerClient):
        return await _engine_client(client, engine, GRPC_ENGINES, timeout)
    if isinstance(client, HttpWorkerClient):
        return await _engine_client(client, engine, HTTP_ENGINES, timeout)
    return client


class WorkerRegistry:
    def __init__(
        self,
        *,
        tls: TlsOptions | None = None,
        worker_api_key: str | None = None,
        probe_timeout_s: float = 10.0,
        breaker: Callable[[], CircuitBreaker] = CircuitBreaker,
        progress: Callable[[], ProgressTracker] = ProgressTracker,
        connect: Connect = grpc_connect,
    ) -> None:
        self._workers: dict[str, Worker] = {}
        self._tls = tls
        self._api_key = worker_api_key
        self._probe_timeout = probe_timeout_s
        self._breaker = breaker
        self._progress = progress
        self._connect = connect
        self._listeners: list[ChangeListener] = []
        self._adding: dict[str, asyncio.Task[list[Worker]]] = {}

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _notify(self, event: str, worker: Worker) -> None:
        for listener in self._listeners:
            listener(event, worker)

    def restarted(self, worker: Worker) -> None:
        """The worker's process was restarted behind the same address: its cache is empty
        (every rank's, for an engine with several)."""
        for rank in self.ranks(worker):
            if self._workers.get(rank.id) is rank and not rank.draining:
                log.info("worker %s restarted: what the gateway learned of its cache is dropped", rank.id)
                self._notify("restarted", rank)

    def ranks(self, worker: Worker) -> list[Worker]:
        """Every registered target of ``worker``'s engine (just ``worker`` without DP ranks)."""
        return [w for w in self._workers.values() if w.client is worker.client] or [worker]

    def _engine(self, engine_id: str) -> list[Worker]:
        return [w for w in self._workers.values() if w.engine_id == engine_id]

    async def add(
        self,
        url: str,
        *,
        role: str | None = None,
        bootstrap_port: int | None = None,
        api_key: str | None = None,
        engine: str | None = None,
        dp_size: int | None = None,
    ) -> Worker:
        """Probe and register ``url``; adding a known URL returns the existing worker.
        ``engine`` names the engine behind the URL (default: detected); ``dp_size`` its
        data-parallel ranks (default: what it reports; 1 routes to it as one target and
        leaves the balancing between its ranks to the engine). An engine with several
        ranks returns its rank 0 (``ranks()`` gives them all)."""
        if dp_size is not None and not 1 <= dp_size <= MAX_DP_SIZE:
            raise WorkerRegistrationError(f"worker {url}: dp_size must be in [1, {MAX_DP_SIZE}], got {dp_size}")
        address = parse_worker_url(url)
        existing = [w for w in self._engine(address.target) if not w.draining]
        if existing:
            return existing[0]
        pending = self._adding.get(address.target)
        if pending is None:
            pending = asyncio.ensure_future(self._probe(address.url, role, bootstrap_port, api_key, engine, dp_size))
            self._adding[address.target] = pending
        try:
            workers = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._adding.pop(address.target, None)
        live = [w for w in self._engine(address.target) if not w.draining]
        if live:
            return live[0]
        for worker in workers:
            self._workers[worker.id] = worker
        Roster.writes += 1
        head = workers[0]
        log.info("worker added: %s role=%s model=%s dp_size=%d", head.url, head.role, head.model, len(workers))
        for worker in workers:
            self._notify("added", worker)
        return head

    async def _probe(
        self, url: str, role: str | None, bootstrap_port: int | None, api_key: str | None,
        engine: str | None = None, dp_size: int | None = None,
    ) -> list[Worker]:
        client = await with_engine(self._connect(url, self._tls, api_key or self._api_key), engine, self._probe_timeout)
        try:
            model_info, server_info = await asyncio.gather(
                client.model_info(timeout=self._probe_timeout),
                client.server_info(timeout=self._probe_timeout),
            )
            health = await client.health_check(timeout=self._probe_timeout)
        except WorkerCallError as exc:
            await client.close()
            raise WorkerRegistrationError(
                f"worker {url} did not answer its probe: {exc.code.name}: {exc.message}"
            ) from exc
        except BaseException:
            await client.close()
            raise
        if not health.healthy:
            await client.close()
            raise WorkerRegistrationError(f"worker {url} says it is not healthy: {health.message}")
        info = WorkerInfo.from_replies(model_info, server_info)
        if role is None:
            role = info.disaggregation_mode if info.disaggregation_mode in ("prefill", "decode") else "regular"
        if role in ("prefill", "decode") and "pd_bootstrap" in client.lacks:
            await client.close()
            raise WorkerRegistrationError(
                f"{client.kind} worker {url} cannot take the {role} role: the gateway pairs prefill and"
                " decode workers through SGLang's bootstrap, which this engine lacks"
            )
        if role == "prefill" and bootstrap_port is None and info.bootstrap_port is None:
            await client.close()
            raise WorkerRegistrationError(
                f"prefill worker {url} has no bootstrap port (give one or set it on the worker)"
            )
        if dp_size is not None:
            info.dp_size = dp_size
        elif info.dp_size > MAX_DP_SIZE:
            await client.close()
            raise WorkerRegistrationError(f"worker {url} reports dp_size {info.dp_size} (at most {MAX_DP_SIZE})")
        if info.dp_size > 1 and "dp_rank" in client.lacks:
            await client.close()
            raise WorkerRegistrationError(
                f"{client.kind} worker {url} cannot be routed to by data-parallel rank: a request to it cannot"
                " name one (register it with dp_size 1: the engine balances its ranks itself)"
            )
        ranks: list[int | None] = [None] if info.dp_size == 1 else list(range(info.dp_size))
        return [
            Worker(url, client, info, role=role, bootstrap_port=bootstrap_port, breaker=self._breaker(),
                   progress=self._progress(), dp_rank=rank)
            for rank in ranks
        ]

    async def remove(self, worker_id: str, *, drain_timeout_s: float = 30.0) -> Worker:
        """Stop routing to the worker (every rank of its engine), wait for their in-flight
        requests, then forget them and close the engine's client."""
        worker = self.get(worker_id)
        if worker is None:
            raise KeyError(worker_id)
        ranks = self.ranks(worker)
        for rank in ranks:
            rank.draining = True
            self._notify("removed", rank)
        deadline = asyncio.get_running_loop().time() + drain_timeout_s
        # Polling keeps WorkerLoad free of asyncio; a drain is rare and 50 ms is plenty.
        while any(r.load.in_flight > 0 for r in ranks) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for rank in ranks:
            if self._workers.get(rank.id) is rank:
                del self._workers[rank.id]
        Roster.writes += 1
        await worker.client.close(grace=1.0)
        log.info("worker removed: %s", worker.url)
        return worker

    def get(self, key: str) -> Worker | None:
        """Find a worker by id (host:port, or host:port@rank for one rank) or URL; an
        engine's id or URL finds its first rank."""
        if key in self._workers:
            return self._workers[key]
        for worker in self._workers.values():
            if worker.url == key:
                return worker
        if engine_of(key) != key:
            return None  # a rank this registry does not have
        ranks = self._engine(key)
        if ranks:
            return ranks[0]
        try:
            target = parse_worker_url(key).target
        except ValueError:
            return None
        return self._workers.get(target) or next(iter(self._engine(target)), None)

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def pool(self, model: str | None, role: str) -> list[Worker]:
        """Workers of one role serving ``model`` (any model when None), draining ones included;
        only those that take token ids (text-only ones are ``pipeline.text_relay``'s). What a
        transport lacks is fixed when it is made; every other input counts in ``Roster``."""
        return [
            w
            for w in self._workers.values()
            if w.role == role and (model is None or w.info.model == model) and "token_ids" not in w.client.lacks
        ]

    def models(self) -> list[str]:
        return sorted({w.model for w in self._workers.values() if not w.draining})

    async def close(self) -> None:
        closed: set[int] = set()
        for worker in list(self._workers.values()):
            if id(worker.client) not in closed:
                closed.add(id(worker.client))
                await worker.client.close()
        self._workers.clear()
        Roster.writes += 1
