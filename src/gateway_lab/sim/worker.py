"""One simulated SGLang ``--grpc-mode`` worker: a real grpc.aio server on loopback.

Owns the pieces (cache, scheduler, KV-event hub, PD bootstrap server, counters,
faults) and their lifecycle. Several workers can share one process and one
event loop; each has its own server, port, cache and scheduler task.

With ``dp_size`` N (SGLang's ``--dp-size``) one endpoint runs N ranks, each its own
scheduler and KV cache (:class:`SimRank`): a request naming ``data_parallel_rank``
runs there, a prefill or decode request with a bootstrap room on rank ``room % N``,
others take turns, and GetLoads lists every rank. The KV-event stream
covers rank 0 only, as SGLang's does under DP attention.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.proto import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2_grpc,
)
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.counters import SimCounters
from gateway_lab.sim.faults import SimFaults
from gateway_lab.sim.model_dir import model_folder
from gateway_lab.sim.pd import BootstrapServer
from gateway_lab.sim.scheduler import Sequence
from gateway_lab.sim.servicer import SimRank, SimServicer
from gateway_lab.sim.trtllm_servicer import SERVICE as TRTLLM_SERVICE
from gateway_lab.sim.trtllm_servicer import TrtllmSimServicer
from gateway_lab.sim.vllm_servicer import SERVICE as VLLM_SERVICE
from gateway_lab.sim.vllm_servicer import VllmSimServicer
from gateway_lab.sim.vocab import Vocab, load_vocab

# The options SGLang's own gRPC server sets (smg-grpc-servicer): 256 MiB messages, and
# client keepalive pings every 10 s or more accepted, with or without calls in flight
# (gRPC core's default answers a ping more often than every 5 minutes with GOAWAY).
_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),  # a taken port must fail loudly, not be shared
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.http2.min_ping_interval_without_data_ms", 10000),
    ("grpc.keepalive_permit_without_calls", True),
]
INPUT_RESERVE_TOKENS = 5  # what SGLang's scheduler keeps back from its longest request
RECEIVED_KEPT = 64  # Generate requests kept in ``SimWorker.received``
ENGINES = ("sglang", "vllm", "trtllm")  # the gRPC services a simulated worker can serve


@dataclasses.dataclass(frozen=True)
class SimTls:
    """Serve grpcs:// with this PEM certificate chain and key; with ``client_ca``,
    also require a client certificate signed by it (mutual TLS)."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def exit_process() -> None:
    """The subprocess flavour of the exit fault: vanish without cleanup."""
    os._exit(17)


class SimWorker:
    """A simulated worker; ``await start()``, use ``url``, ``await stop()``."""

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        on_die: Callable[[], None] | None = None,
        vocab: Vocab | None = None,
        engine: str = "sglang",
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.engine = engine  # whose gRPC service it serves: SGLang's scheduler, vLLM's engine or TensorRT-LLM's
        # A private copy: tests tune a live worker's config without touching others.
        self.config = dataclasses.replace(config) if config is not None else SimConfig()
        self.vocab = vocab or load_vocab(self.config.tokenizer_path, self.config.output_vocab)
        self.model_path = model_folder(self.config, self.vocab)  # what it reports and zips
        self.faults = SimFaults.from_config(self.config)
        self.counters = SimCounters()
        self.ranks = [SimRank(i, self.config, self.counters, self._after_step) for i in range(self.config.dp_size)]
        self._next_rank = 0
        # Rank 0's: what a one-rank worker is, and what reports for the whole worker read.
        self.cache = self.ranks[0].cache
        self.scheduler = self.ranks[0].scheduler
        self.kv_events = self.ranks[0].kv_events
        self.bootstrap: BootstrapServer | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.tls: SimTls | None = None
        self.started_at = time.time()
        self.stopping = False
        self.died = False
        self._on_die = on_die
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: dict[str, list[list[Sequence]]] = {}
        # Requests in a stall fault right now, and an event set while there are none: a
        # HealthCheck waits for it (a real worker's probe is a generation through the same
        # scheduler, so a worker whose generations hang cannot answer it either).
        self.stalling = 0
        self._unstalled = asyncio.Event()
        self._unstalled.set()
        # The last Generate requests as they arrived: what a client really sent (sampling
        # values, limits, stops), for anyone comparing it with what SGLang would receive.
        self.received: collections.deque[sglang_scheduler_pb2.GenerateRequest] = collections.deque(
            maxlen=RECEIVED_KEPT
        )

    # ---------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        scheme = "grpcs" if self.tls is not None else "grpc"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def bootstrap_port(self) -> int | None:
        return self.bootstrap.port if self.bootstrap is not None else None

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        bootstrap_port: int | None = None,
        *,
        tls: SimTls | None = None,
    ) -> None:
        """Listen on ``host:port`` (0: ephemeral), over TLS when ``tls`` is given;
        a prefill worker also opens its bootstrap port."""
        self.host = host
        self.tls = tls
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        if self.engine == "vllm":
            vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(VllmSimServicer(self), server)
            service = VLLM_SERVICE
        elif self.engine == "trtllm":
            trtllm_service_pb2_grpc.add_TrtllmServiceServicer_to_server(TrtllmSimServicer(self), server)
            service = TRTLLM_SERVICE
        else:
            sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(SimServicer(self), server)
            service = sglang_scheduler_pb2.DESCRIPTOR.services_by_name["SglangScheduler"].full_name
        # Like SGLang's server: the standard health service (Kubernetes probes, and
        # clients such as SMG that check it when they connect) and reflection.
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((service, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        address = f"{host}:{port}"
        bound = (
            server.add_secure_port(address, tls.credentials())
            if tls is not None
            else server.add_insecure_port(address)
        )
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.port = bound
        if self.config.role == "prefill":
            self.bootstrap = BootstrapServer()
            await self.bootstrap.start(
                host, self.config.bootstrap_port if bootstrap_port is None else bootstrap_port
            )
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.started_at = time.time()
        self._tasks = [
            asyncio.create_task(r.scheduler.run(), name=f"sim-scheduler-{self.port}-{r.index}") for r in self.ranks
        ]

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: in-flight streams get ``grace`` seconds, then everything ends."""
        if self.stopping:
            return
        self.stopping = True
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
        for r in self.ranks:
            r.scheduler.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.bootstrap is not None:
            await self.bootstrap.stop()

    async def kill(self) -> None:
        """Stop at once, as a crash would (no grace for in-flight streams)."""
        self.died = True
        await self.stop(grace=None)

    def die(self) -> None:
        """The exit fault fired: exit the process, or (in-process) kill this worker."""
        if self._on_die is not None:
            self._on_die()
            return
        if not self.died:
            self.died = True
            asyncio.get_running_loop().create_task(self.kill())

    # ---------------------------------------------------------------- requests
    def rank_for(self, requested: int | None) -> SimRank:
        """The rank a request runs on: the one it names, else the next in turn (SGLang's DP
        controller's round robin). A rank the worker does not have is a ValueError."""
        n = len(self.ranks)
        if requested is not None:
            if not 0 <= requested < n:
                raise ValueError(f"data_parallel_rank {requested} is out of range: this worker has {n} rank(s)")
            return self.ranks[requested]
        rank = self.ranks[self._next_rank % n]
        self._next_rank += 1
        return rank

    @property
    def busy(self) -> int:
        """Requests running or waiting on every rank."""
        return sum(r.scheduler.num_running + r.scheduler.num_waiting for r in self.ranks)

    async def stall(self, seconds: float) -> None:
        """Go silent for ``seconds`` (the stall fault); HealthCheck waits meanwhile."""
        self.stalling += 1
        self._unstalled.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.stalling -= 1
            if not self.stalling:
                self._unstalled.set()

    async def unstalled(self) -> None:
        """Return once no request is in a stall fault."""
        await self._unstalled.wait()

    def track(self, rid: str, seqs: list[Sequence]) -> None:
        self._requests.setdefault(rid, []).append(seqs)

    def untrack(self, rid: str, seqs: list[Sequence]) -> None:
        groups = self._requests.get(rid)
        if groups is not None:
            with contextlib.suppress(ValueError):
                groups.remove(seqs)
            if not groups:
                del self._requests[rid]

    def abort(self, rid: str) -> int:
        """Abort every unfinished sequence of request ``rid``; returns how many."""
        n = 0
        for seqs in list(self._requests.get(rid, [])):
            for seq in seqs:
                if self.ranks[seq.rank].scheduler.abort(seq):
                    n += 1
        return n

    async def flush_cache(self, timeout_s: float) -> tuple[bool, str]:
        """Clear the KV cache once idle; ``timeout_s`` 0 means now or fail."""
        if timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(r.scheduler.idle.wait() for r in self.ranks)), timeout_s
                )
        busy = self.busy
        if busy:
            return False, f"cannot flush: {busy} request(s) in flight"
        for r in self.ranks:
            r.cache.clear()
            r.kv_events.publish()
        return True, "cache flushed"

    def _after_step(self, rank: SimRank) -> None:
        rank.kv_events.publish()
        key = (rank.scheduler.num_running, rank.scheduler.num_waiting)
        if key != rank.last_load_key:
            rank.last_load_key = key
            rank.kv_events.notify_load()

    # ---------------------------------------------------------------- reports
    @property
    def max_req_input_len(self) -> int:
        """The scheduler's prompt limit: prompts this long or longer are refused (SGLang's
        rule: the longest request, context or KV pool less one, less a small reserve)."""
        longest = min(self.config.context_length, self.cache.capacity) - 1
        return max(1, longest - INPUT_RESERVE_TOKENS)

    def server_args(self) -> dict[str, Any]:
        """GetServerInfo's server_args, shaped like a real server's: arguments the operator
        did not set are null (the context length comes from the model's config.json; the
        page size is reported only when ``report_page_size`` plays an explicit --page-size)."""
        cfg = self.config
        return {
            "model_path": cfg.model,
            "served_model_name": cfg.served_name,
            "tokenizer_path": str(self.model_path),
            "page_size": cfg.page_size if cfg.report_page_size else None,
            "max_running_requests": cfg.max_running_requests,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "context_length": None,
            "sampling_defaults": "model",
            "max_total_tokens": cfg.kv_capacity_tokens,
            "disaggregation_mode": "null" if cfg.role == "regular" else cfg.role,
            "disaggregation_bootstrap_port": self.bootstrap_port or cfg.bootstrap_port,
            "skip_tokenizer_init": True,
            "grpc_mode": True,
            "host": self.host,
            "port": self.port,
            "dp_size": cfg.dp_size,
            "tp_size": 1,
            "simulated": True,
        }

    def scheduler_loads(self) -> list[sglang_scheduler_pb2.SchedulerLoad]:
        """One load row per data-parallel rank, as GetLoads lists them."""
        return [self.scheduler_load(r.index) for r in self.ranks]

    def scheduler_load(self, rank: int = 0) -> sglang_scheduler_pb2.SchedulerLoad:
        sched = self.ranks[rank].scheduler
        cache = self.ranks[rank].cache
        cfg = self.config
        running = sched.num_running
        waiting = sched.num_waiting
        pb = sglang_scheduler_pb2
        load = pb.SchedulerLoad(
            dp_rank=rank,
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_total_reqs=running + waiting,
            num_used_tokens=cache.used_tokens,
            max_total_num_tokens=cache.capacity,
            token_usage=cache.used_tokens / cache.capacity,
            gen_throughput=sched.gen_throughput(),
            cache_hit_rate=self.counters.cache_hit_rate,
            utilization=running / cfg.max_running_requests,
            max_running_requests=cfg.max_running_requests,
            memory=pb.MemoryMetrics(token_capacity=cache.capacity),
            queues=pb.QueueMetrics(waiting=waiting),
            num_waiting_uncached_tokens=sched.waiting_uncached_tokens(),
        )
        if cfg.role != "regular":
            load.disaggregation.CopyFrom(pb.DisaggregationMetrics(mode=cfg.role))
        return load

    def engine_load(self, full: bool) -> common_pb2.EngineLoad:
        """The load record attached to KV-event batches (``full``: with telemetry)."""
        sched = self.scheduler
        cache = self.cache
        cfg = self.config
        load = common_pb2.EngineLoad(
            running_requests=sched.num_running,
            waiting_requests=sched.num_waiting,
            waiting_uncached_tokens=sched.waiting_uncached_tokens(),
            token_usage=cache.used_tokens / cache.capacity,
            active_token_usage=(cache.protected_tokens + cache.private_tokens) / cache.capacity,
            gen_throughput=sched.gen_throughput(),
            max_running_requests=cfg.max_running_requests,
            age_ms=0,
            prefill_pending_tokens=sched.prefill_pending_tokens(),
        )
        if sched.num_running or sched.num_waiting:
            silence = time.monotonic() - sched.last_step
            load.engine_silence_ms = min(int(silence * 1000), 2**32 - 1)
        if full:
            load.cache_hit_rate = self.counters.cache_hit_rate
            load.num_used_tokens = cache.used_tokens
            load.max_total_num_tokens = cache.capacity
            load.memory.CopyFrom(common_pb2.EngineMemory(token_capacity=cache.capacity))
            load.queues.CopyFrom(common_pb2.EngineQueues(waiting=sched.num_waiting))
            if cfg.role != "regular":
                load.disaggregation.CopyFrom(common_pb2.EngineDisaggregation(mode=cfg.role))
        return load

    def stats(self) -> dict[str, Any]:
        """Counters plus cache state, as one JSON-friendly dict."""
        out: dict[str, Any] = {"url": self.url, "role": self.config.role, "dp_size": len(self.ranks)}
        out.update(self.counters.as_dict())
        caches = [r.cache for r in self.ranks]
        out.update(
            evicted_tokens=sum(c.evicted_tokens for c in caches),
            cache_tree_tokens=sum(c.tree_tokens for c in caches),
            cache_used_tokens=sum(c.used_tokens for c in caches),
            kv_capacity_tokens=sum(c.capacity for c in caches),
            kv_event_batches=self.kv_events.batches_published,
        )
        return out
