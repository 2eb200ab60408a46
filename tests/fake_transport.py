"""An in-memory ``WorkerTransport`` for unit tests of dispatch, the lease, retries and stalls.

A :class:`FakeTransport` plays one worker: each Generate call follows the next
*script* (a list of messages, ``rpc_error(...)`` exceptions, ``HANG`` to wait until
cancelled, ``END_OF_STREAM``); a script that runs out ends the stream (EOF). It records
the requests, aborts and cancels it saw. ``fleet()`` registers such workers in a
real ``WorkerRegistry`` (through its ``connect`` hook) behind a real ``Router``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2

from gateway.pipeline.observer import PipelineObserver
from gateway.pipeline.router import Router
from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.baselines import RoundRobinPolicy
from gateway.policies.factory import PolicyConfig, make_policy
from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.address import WorkerAddress, parse_worker_url
from gateway.workers.client import TlsOptions
from gateway.workers.registry import WorkerRegistry
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway.workers.worker import Worker

MODEL = "fake-model"


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG = _Hang()  # a read that waits until the call is cancelled


@dataclass(frozen=True)
class Later:
    """A script item that arrives after ``seconds`` (keep it to a few ms)."""

    seconds: float
    item: Any


def rpc_error(code: CallCode, details: str = "fake failure") -> WorkerCallError:
    return WorkerCallError(code, details)


def chunk(ids: Sequence[int], *, prompt: int = 4, completion: int = 0, cached: int = 0, index: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
        token_ids=list(ids), prompt_tokens=prompt, completion_tokens=completion or len(ids), cached_tokens=cached, index=index,
    ))


def complete(ids: Sequence[int] = (), *, finish: str = "stop", prompt: int = 4, cached: int = 0, index: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(complete=pb.GenerateComplete(
        output_ids=list(ids), finish_reason=finish, prompt_tokens=prompt, completion_tokens=len(ids),
        cached_tokens=cached, index=index,
    ))


class FakeCall:
    """One Generate stream following a script; ``cancel()`` fails a pending read like gRPC."""

    def __init__(self, script: Iterable[Any]) -> None:
        self._items = deque(script)
        self.cancelled = False
        self.reads = 0
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> Any:
        if self.cancelled:
            raise asyncio.CancelledError
        self.reads += 1
        if not self._items:
            return END_OF_STREAM
        item = self._items.popleft()
        if isinstance(item, Later):
            self._waiter = asyncio.get_running_loop().create_future()
            handle = asyncio.get_running_loop().call_later(item.seconds, self._waiter.set_result, None)
            try:
                await self._waiter
            finally:
                handle.cancel()
                self._waiter = None
            item = item.item
        if item is HANG:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        if self.cancelled:
            return False
        self.cancelled = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
        return True

    def ready(self) -> bool:
        return False  # like grpc.aio: it cannot tell


class ArrivedCall:
    """An inner Generate call holding the replies that have arrived (``ready`` when any has):
    what an engine's translating call wraps."""

    def __init__(self, *replies: object) -> None:
        self.replies = list(replies)

    async def read(self) -> object:
        return self.replies.pop(0) if self.replies else END_OF_STREAM

    def cancel(self) -> bool:
        return True

    def ready(self) -> bool:
        return bool(self.replies)


@dataclass
class FakeTransport:
    """One worker's calls, scripted and recorded."""

    url: str
    scripts: deque[list[Any]] = field(default_factory=deque)
    default_script: list[Any] = field(default_factory=lambda: [chunk([1]), complete([1])])
    embeds: deque[pb.EmbedResponse | BaseException] = field(default_factory=deque)
    healthy: bool | BaseException | _Hang = True  # HANG: a probe that is never answered
    health_checks: int = 0
    role: str = "regular"
    bootstrap_port: int | None = None
    start_time: int = 0  # GetServerInfo start_time, seconds (0: not reported); a restart changes it
    server_args: dict[str, Any] = field(default_factory=dict)  # more GetServerInfo server arguments
    requests: list[pb.GenerateRequest] = field(default_factory=list)
    embed_requests: list[pb.EmbedRequest] = field(default_factory=list)
    calls: list[FakeCall] = field(default_factory=list)
    aborts: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False
    kind: str = "fake/memory"
    lacks: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.address: WorkerAddress = parse_worker_url(self.url)
        self.url = self.address.url

    def script(self, *items: Any) -> FakeTransport:
        """Queue the script of the next Generate call."""
        self.scripts.append(list(items))
        return self

    # ---------------------------------------------------------------- the Protocol
    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> FakeCall:
        self.requests.append(request)
        call = FakeCall(self.scripts.popleft() if self.scripts else list(self.default_script))
        self.calls.append(call)
        return call

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        self.aborts.append((request_id, reason))
        return True

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        self.embed_requests.append(request)
        item = self.embeds.popleft() if self.embeds else pb.EmbedResponse(
            embedding=[0.5, 0.25], embedding_dim=2, prompt_tokens=len(request.tokenized.input_ids)
        )
        if isinstance(item, BaseException):
            raise item
        return item

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        self.health_checks += 1
        if self.healthy is HANG:  # a hung worker: the probe's own deadline ends it
            await asyncio.sleep(timeout)
            raise WorkerCallError(CallCode.DEADLINE_EXCEEDED, "health probe timed out")
        if isinstance(self.healthy, BaseException):
            raise self.healthy
        return pb.HealthCheckResponse(healthy=bool(self.healthy), message="ok" if self.healthy else "sick")

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(served_model_name=MODEL, model_path=MODEL, max_context_length=4096, vocab_size=1000, is_generation=True)

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        args = struct_pb2.Struct()
        args.update({"page_size": 1, "disaggregation_mode": self.role if self.role != "regular" else "null"})
        args.update(self.server_args)
        if self.bootstrap_port is not None:
            args.update({"disaggregation_bootstrap_port": self.bootstrap_port})
        reply = pb.GetServerInfoResponse(server_args=args, max_total_num_tokens=100_000)
        if self.start_time:
            reply.start_time.FromSeconds(self.start_time)
        return reply

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        return pb.GetLoadsResponse()

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        return common_pb2.FlushCacheResponse(success=True)

    async def tokenizer_zip(self, *, timeout: float = 60.0) -> tuple[bytes, str]:
        raise ValueError("the fake worker has no tokenizer")

    async def _no_chunks(self) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        if False:  # pragma: no cover - an empty async generator
            yield common_pb2.GetTokenizerChunk()

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        return self._no_chunks()

    async def _no_events(self) -> AsyncIterator[common_pb2.KvEventBatch]:
        if False:  # pragma: no cover
            yield common_pb2.KvEventBatch()

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        return self._no_events()

    async def close(self, grace: float | None = None) -> None:
        self.closed = True


@dataclass
class Fleet:
    registry: WorkerRegistry
    router: Router
    transports: dict[str, FakeTransport]
    spy: SpyPolicy | None

    def worker(self, worker_id: str) -> Worker:
        found = self.registry.get(worker_id)
        assert found is not None
        return found

    def transport(self, worker_id: str) -> FakeTransport:
        return self.transports[parse_worker_url(f"grpc://{worker_id}").url]


class SpyPolicy(RoundRobinPolicy):
    """Round robin that records the hooks the pipeline calls (and predicts ``predict`` cached tokens)."""

    name = "spy"

    def __init__(self, predict: int = 0) -> None:
        super().__init__()
        self.predict = predict
        self.dispatched: list[tuple[str, str]] = []  # (request id, worker id)
        self.finished: list[tuple[str, str, int, bool]] = []  # (request id, worker id, cached, success)
        self.outputs: list[tuple[str, str, list[int]]] = []  # (request id, worker id, output ids)

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        chosen = super()._choose(request, cands)
        return Decision(chosen.worker_id, "spy", predicted_cached_tokens=self.predict)

    def on_dispatch(self, request: RouteRequest, decision: Decision) -> None:
        self.dispatched.append((request.request_id, decision.worker_id))

    def on_finish(self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        self.finished.append((request.request_id, worker_id, cached_tokens, success))

    def on_output(self, request: RouteRequest, worker_id: str, output_ids: Sequence[int]) -> None:
        self.outputs.append((request.request_id, worker_id, list(output_ids)))


class RecordingObserver(PipelineObserver):
    """Keeps every hook call the pipeline makes, for assertions."""

    def __init__(self) -> None:
        self.stages: list[str] = []
        self.selections: list[tuple[str, str, str]] = []
        self.retries: list[tuple[str, str]] = []
        self.done: list[dict[str, Any]] = []

    def stage(self, name: str, seconds: float) -> None:
        assert seconds >= 0
        self.stages.append(name)

    def selected(self, policy: str, reason: str, worker_id: str) -> None:
        self.selections.append((policy, reason, worker_id))

    def retried(self, worker_id: str, code: str) -> None:
        self.retries.append((worker_id, code))

    def worker_done(
        self, model: str, worker_id: str, *, predicted_cached: int, reported_cached: int, success: bool,
        sent_prompt: int = 0, reported_prompt: int = 0, aborted: bool = False,
    ) -> None:
        self.done.append({
            "model": model, "worker": worker_id, "predicted": predicted_cached, "cached": reported_cached,
            "success": success, "sent_prompt": sent_prompt, "reported_prompt": reported_prompt,
            **({"aborted": True} if aborted else {}),
        })


async def fleet(
    *transports: FakeTransport, policy: str | None = None, spy: SpyPolicy | None = None, **registry_options: Any
) -> Fleet:
    """Register ``transports`` in a real registry and put a real router in front
    (every pool shares ``spy``, a :class:`SpyPolicy`, unless a named ``policy`` is asked for)."""
    by_url = {t.url: t for t in transports}

    def connect(url: str, tls: TlsOptions | None, api_key: str | None) -> FakeTransport:
        return by_url[parse_worker_url(url).url]

    registry = WorkerRegistry(connect=connect, **registry_options)
    for t in transports:
        await registry.add(t.url, bootstrap_port=t.bootstrap_port)
    if policy is not None:
        config = PolicyConfig(policy=policy)
        router = Router(registry, lambda role: make_policy(config))
        return Fleet(registry, router, by_url, None)
    shared = spy or SpyPolicy()
    return Fleet(registry, Router(registry, lambda role: shared), by_url, shared)


async def settle() -> None:
    """Let fire-and-forget tasks (Abort) run."""
    for _ in range(3):
        await asyncio.sleep(0)
