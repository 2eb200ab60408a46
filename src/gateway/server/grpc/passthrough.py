"""``sglang.grpc.scheduler.SglangScheduler`` served by the gateway itself.

A client written for one SGLang ``--grpc-mode`` worker points at the gateway
unchanged and gets a fleet: each Generate is routed on its token ids by the same
policies through the engine's one open path (``Engine.prepare_scheduler`` then
``Engine.open``: the prompt checks, the retry loop, a lease per worker, PD pairs
when the model is served disaggregated) and the chosen worker's stream is relayed
message for message (n>1 indices, logprobs,
chunks and completes as the worker sent them). Abort reaches the worker serving
that request id; HealthCheck, GetModelInfo, GetServerInfo and GetLoads describe
the fleet; Embed is routed like a generation; GetTokenizer and FlushCache go to
the workers. SubscribeKvEvents is per worker by nature and stays unimplemented.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from grpc import StatusCode, aio

from gateway.observability.request_log import RequestRecord
from gateway.pipeline.aborts import fire_abort
from gateway.pipeline.deadline import worker_timeout
from gateway.pipeline.dispatch import TokenStream, WorkerStream
from gateway.pipeline.errors import map_rpc_error
from gateway.pipeline.output_guard import OUTPUT_CEILING
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.running_loop import cancelling
from gateway.pipeline.scheduler_rules import check_scheduler_generate
from gateway.policies.base import RouteRequest
from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    NoWorkerError,
)
from gateway.protocol.ids import random_hex
from gateway.server.grpc.relay_guard import RelayGuard
from gateway.server.grpc.util import (
    CallContextReader,
    Role,
    abort_with,
    call_scope,
    client_deadline,
    reply_metadata,
)
from gateway.server.state import GatewayState
from gateway.workers.transport import WorkerCallError
from gateway.workers.worker import GATEWAY_INSTANCE_ARG, Worker, one_per_engine

log = logging.getLogger(__name__)

T = TypeVar("T")


class SchedulerPassthrough(pb_grpc.SglangSchedulerServicer):
    def __init__(self, state: GatewayState, auth: CallContextReader) -> None:
        self.state = state
        self.engine = state.engine
        self.auth = auth
        # (key id, request id) -> its worker stream (None: not on a worker yet)
        self._live: dict[tuple[str, str], TokenStream | None] = {}
        self._aborted: set[tuple[str, str]] = set()  # requests the client aborted (before or after they reached a worker)

    def admitted(self, ctx: RequestContext, method: str) -> contextlib.AbstractAsyncContextManager[RequestRecord]:
        """Admission, metrics and the access log around every call, shared with the HTTP front door."""
        state = self.state
        return call_scope(state.metrics, state.admission, ctx, method, access_log=state.config.server.access_log)

    async def _unary(
        self, context: aio.ServicerContext, method: str, run: Callable[[RequestContext], Awaitable[T]],
        role: Role = "inference",
    ) -> T:
        try:
            ctx = self.auth.context(context, role)
            with client_deadline(context):
                async with self.admitted(ctx, method):
                    return await run(ctx)
        except GatewayError as exc:
            await abort_with(context, exc)
            raise

    def _workers(self) -> list[Worker]:
        return [w for w in self.state.registry.all() if w.role == "regular" and w.available]

    def _any_worker(self) -> Worker:
        workers = self._workers() or self.state.registry.all()
        if not workers:
            raise NoWorkerError("no worker registered")
        return workers[0]

    # ---------------------------------------------------------------- Generate
    async def Generate(self, request: pb.GenerateRequest, context: aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        stream: TokenStream | None = None
        rid = request.request_id
        key: tuple[str, str] | None = None
        try:
            ctx = self.auth.context(context)
            if not rid:  # the worker needs an id for Abort; the client's x-request-id or a fresh one
                rid = ctx.request_id or random_hex()
            if len(rid) > MAX_REQUEST_ID:
                raise InvalidRequestError(f"request_id is longer than {MAX_REQUEST_ID} characters", param="request_id")
            scope = ctx.api_key_id or ""
            if (scope, rid) in self._live:
                raise InvalidRequestError(f"request {rid!r} is already running", param="request_id", code="duplicate_request_id")
            key = (scope, rid)
            self._live[key] = None  # known (so its own key can abort it) before it reaches a worker
            wid = worker_request_id(rid, scope)
            with client_deadline(context):
                async with self.admitted(ctx, "SglangScheduler/Generate"):
                    # The HTTP door's rules (scheduler_rules), then the engine's one open path.
                    checked, _ = check_scheduler_generate(
                        self.engine, self.engine.catalog.get(None), request, cache_salt=ctx.cache_salt
                    )
                    checked.request_id = wid
                    route = self.engine.prepare_scheduler(
                        checked, routing_key=ctx.routing_key, target_worker=ctx.target_worker
                    )
                    stream = await self.engine.open(
                        route, checked, samples=checked.sampling_params.n,
                        wants_output_logprobs=checked.return_logprob,
                    )
                    self._live[key] = stream
                    if key in self._aborted:
                        self._aborted.discard(key)
                        await stream.abort("aborted by client")
                        return
                    ctx.worker_ids = [stream.worker.id]
                    await context.send_initial_metadata(reply_metadata(ctx))
                    guard = self._guard(checked, route, stream.worker.id)
                    # SGLang's unary n>1 answers say index 0 for every sample: number them in
                    # arrival order so each completion has its own.
                    number = not checked.stream and checked.sampling_params.n > 1
                    done = 0
                    try:
                        while (message := await stream.read()) is not None:
                            if number and message.WhichOneof("response") == "complete":
                                message.complete.index = done  # before the guard counts samples
                                done += 1
                            for out in guard.check(message):
                                if wid != rid:
                                    out.request_id = rid  # the client sees its own id, never the scoped one
                                yield out
                            if guard.stop_worker:
                                await stream.abort("past max_new_tokens")
                                return
                    except asyncio.CancelledError:
                        if key not in self._aborted or cancelling():
                            raise
                        await context.abort(StatusCode.CANCELLED, "request aborted (Abort)")
        except GatewayError as exc:
            await abort_with(context, exc)
        finally:
            if key is not None and self._live.get(key, False) in (stream, None):
                del self._live[key]
                self._aborted.discard(key)
            if stream is not None and not stream.closed:
                await stream.abort("client gone")

    def _guard(self, request: pb.GenerateRequest, route: RouteRequest, worker_id: str) -> RelayGuard:
        """The output guard of one relayed Generate: its cap is the request's max_new_tokens,
        else what the context leaves after the prompt, else ``OUTPUT_CEILING``."""
        entry = self.engine.catalog.get(None)
        params = request.sampling_params
        cap = params.max_new_tokens if params.HasField("max_new_tokens") and params.max_new_tokens > 0 else 0
        if not cap:
            room = entry.max_context_length - len(route.token_ids) if entry.max_context_length else 0
            cap = room if room > 0 else OUTPUT_CEILING
        return RelayGuard(
            cap, entry.tokenizer.vocab_size, max(1, params.n), request_id=request.request_id, worker_id=worker_id
        )

    async def Abort(self, request: pb.AbortRequest, context: aio.ServicerContext) -> pb.AbortResponse:
        """Abort one of the caller's own requests: ids are scoped to the API key that made
        them, so another key's request with the same id is "not found"."""
        async def run(ctx: RequestContext) -> pb.AbortResponse:
            key = (ctx.api_key_id or "", request.request_id)
            if key not in self._live:
                return pb.AbortResponse(success=False, message="no running request with this id for this API key")
            wid = worker_request_id(request.request_id, key[0])
            stream = self._live[key]
            if stream is not None and not isinstance(stream, WorkerStream):
                # A PD pair: its decode requests may carry per-sample ids; stop them here.
                await stream.abort(request.reason or "aborted by client")
                return pb.AbortResponse(success=True, message=f"PD request stopped on {stream.worker.id}")
            if stream is not None:
                # SGLang's server never ends a Generate stream it aborted (no message, no
                # status): the gateway ends both sides itself. The worker's call is
                # cancelled, the slot freed, and the client's stream ends CANCELLED.
                worker = stream.worker
                self._aborted.add(key)
                try:
                    ok = await worker.client.abort(wid, request.reason, timeout=worker_timeout(5.0))
                except WorkerCallError as exc:
                    await stream.abort(request.reason or "aborted by client")
                    return pb.AbortResponse(success=True, message=f"worker {worker.id} did not answer Abort ({exc.code.name}); stream cancelled")
                await stream.abort(request.reason or "aborted by client")
                return pb.AbortResponse(success=ok, message=f"abort sent to {worker.id}; stream ended")
            # Not yet on a worker: remember it, and let every worker drop it if queued.
            self._aborted.add(key)
            for worker in self._workers():
                fire_abort(worker, wid, request.reason or "aborted by client")
            return pb.AbortResponse(success=True, message="not on a worker yet; it will not start")

        return await self._unary(context, "SglangScheduler/Abort", run)

    # ---------------------------------------------------------------- Embed
    async def Embed(self, request: pb.EmbedRequest, context: aio.ServicerContext) -> pb.EmbedResponse:
        async def run(ctx: RequestContext) -> pb.EmbedResponse:
            engine = self.engine
            entry = engine.catalog.get(None)
            engine.observer.model_resolved(entry.name)
            route = engine.prepare_embed(
                entry, list(request.tokenized.input_ids), request.request_id,
                routing_key=ctx.routing_key, target_worker=ctx.target_worker, param="tokenized.input_ids",
            )
            done = await engine.embed(route, request)
            ctx.worker_ids = [done.worker_id]
            await context.send_initial_metadata(reply_metadata(ctx))
            return done.reply

        return await self._unary(context, "SglangScheduler/Embed", run)

    # ---------------------------------------------------------------- fleet facts
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: aio.ServicerContext) -> pb.HealthCheckResponse:
        """The fleet's health from the gateway's own checks (a worker's HealthCheck runs a
        generation on the GPU; relaying it would cost every worker one per probe)."""
        async def run(ctx: RequestContext) -> pb.HealthCheckResponse:
            total = len(self.state.registry.all())
            up = len(self._workers())
            return pb.HealthCheckResponse(healthy=up > 0, message=f"{up} of {total} workers available")

        return await self._unary(context, "SglangScheduler/HealthCheck", run)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: aio.ServicerContext) -> pb.GetModelInfoResponse:
        async def run(ctx: RequestContext) -> pb.GetModelInfoResponse:
            worker = self._any_worker()
            reply = await self._call(worker, worker.client.model_info())
            reply.served_model_name = self.state.catalog.public_name(worker.model)
            return reply

        return await self._unary(context, "SglangScheduler/GetModelInfo", run)

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: aio.ServicerContext) -> pb.GetServerInfoResponse:
        async def run(ctx: RequestContext) -> pb.GetServerInfoResponse:
            worker = self._any_worker()
            reply = await self._call(worker, worker.client.server_info())
            reply.active_requests = sum(w.load.in_flight for w in self.state.registry.all())
            # One target to whoever routes to it: the door clears data_parallel_rank and
            # balances its fleet itself (its GetLoads rows are the fleet's, summed by such a client).
            reply.server_args.update({GATEWAY_INSTANCE_ARG: self.state.instance_id, "dp_size": 1})
            if not self._is_admin(context):
                # Server arguments name hosts, ports and paths of the fleet: the admin's business.
                safe = pb.GetServerInfoResponse(
                    active_requests=reply.active_requests, is_paused=reply.is_paused,
                    sglang_version=reply.sglang_version, server_type=reply.server_type,
                    max_total_num_tokens=reply.max_total_num_tokens,
                )
                args = {k: reply.server_args[k] for k in SAFE_SERVER_ARGS if k in reply.server_args}
                if args:
                    safe.server_args.update(args)
                return safe
            return reply

        return await self._unary(context, "SglangScheduler/GetServerInfo", run)

    def _is_admin(self, context: aio.ServicerContext) -> bool:
        try:
            self.auth.context(context, "admin")
        except GatewayError:
            return False
        return True

    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest, context: aio.ServicerContext) -> AsyncIterator[common_pb2.KvEventBatch]:
        """KV events are per worker by nature: subscribe to the workers themselves."""
        try:
            self.auth.context(context)
            raise GatewayError("SubscribeKvEvents is per worker: subscribe to each worker directly",
                               status=501, type="not_implemented_error")
        except GatewayError as exc:
            await abort_with(context, exc)
        return
        yield  # an async generator, as the servicer expects

    async def GetLoads(self, request: pb.GetLoadsRequest, context: aio.ServicerContext) -> pb.GetLoadsResponse:
        """Every worker's scheduler loads, ranks renumbered across the fleet, one aggregate."""
        async def run(ctx: RequestContext) -> pb.GetLoadsResponse:
            workers = one_per_engine(self._workers())  # an engine answers for all its DP ranks
            include = list(request.include) or ["core"]
            replies = await asyncio.gather(
                *(w.client.loads(include=include, timeout=worker_timeout(2.0)) for w in workers),
                return_exceptions=True,
            )
            return aggregate_loads([r for r in replies if isinstance(r, pb.GetLoadsResponse)],
                                   request.dp_rank if request.HasField("dp_rank") else None)

        return await self._unary(context, "SglangScheduler/GetLoads", run)

    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: aio.ServicerContext) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        try:
            self.auth.context(context)
            worker = self._any_worker()
            async for chunk in worker.client.tokenizer_chunks(request):
                yield chunk
        except GatewayError as exc:
            await abort_with(context, exc)
        except WorkerCallError as exc:
            await abort_with(context, map_rpc_error(exc, "tokenizer source"))

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context: aio.ServicerContext) -> common_pb2.FlushCacheResponse:
        async def run(ctx: RequestContext) -> common_pb2.FlushCacheResponse:
            workers = one_per_engine(self._workers())
            replies = await asyncio.gather(
                *(w.client.flush_cache(request.timeout_s) for w in workers), return_exceptions=True
            )
            failed = [w.engine_id for w, r in zip(workers, replies, strict=True) if not (isinstance(r, common_pb2.FlushCacheResponse) and r.success)]
            ok = bool(workers) and not failed
            if ok:  # the workers' caches are empty now; the policies' guesses must forget too (as POST /flush_cache)
                self.state.router.reset_policies()
            message = f"flushed {len(workers) - len(failed)} of {len(workers)} workers"
            if failed:
                message += f"; failed: {', '.join(failed)}"
            return common_pb2.FlushCacheResponse(success=ok, message=message)

        return await self._unary(context, "SglangScheduler/FlushCache", run, role="admin")

    async def _call(self, worker: Worker, call: Awaitable[T]) -> T:
        try:
            return await call
        except WorkerCallError as exc:
            raise map_rpc_error(exc, worker.id) from exc


MAX_REQUEST_ID = 128

# GetServerInfo's server_args an inference key may see: how to talk to the fleet, not
# where it runs (hosts, ports, model and tokenizer paths stay with the admin key).
SAFE_SERVER_ARGS = (
    "page_size", "context_length", "disaggregation_mode", "served_model_name", "dp_size", "tp_size", GATEWAY_INSTANCE_ARG,
)


def worker_request_id(rid: str, scope: str) -> str:
    """The id a worker sees: unique per API key, so two tenants' equal ids never meet on a
    worker (nor can one tenant's Abort reach the other's request)."""
    return f"{rid}~{scope}" if scope else rid


def aggregate_loads(replies: list[pb.GetLoadsResponse], dp_rank: int | None) -> pb.GetLoadsResponse:
    """One GetLoads answer for the fleet: ranks numbered 0.. across workers in order."""
    out = pb.GetLoadsResponse(
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
        version=replies[0].version if replies else "",
    )
    rank = 0
    for reply in replies:
        for load in reply.loads:
            if dp_rank is None or dp_rank == rank:
                row = out.loads.add()
                row.CopyFrom(load)
                row.dp_rank = rank
            rank += 1
    out.dp_rank_count = rank
    rows = list(out.loads)
    agg = out.aggregate
    agg.total_running_reqs = sum(r.num_running_reqs for r in rows)
    agg.total_waiting_reqs = sum(r.num_waiting_reqs for r in rows)
    agg.total_reqs = sum(r.num_total_reqs for r in rows)
    if rows:
        agg.avg_token_usage = sum(r.token_usage for r in rows) / len(rows)
        agg.avg_throughput = sum(r.gen_throughput for r in rows) / len(rows)
        agg.avg_utilization = sum(r.utilization for r in rows) / len(rows)
    return out
