"""A simulated worker that speaks SGLang's native HTTP API or vLLM's OpenAI server.

The same worker as the gRPC mode (``SimWorker``: radix cache, step loop, faults),
served with Starlette on uvicorn. SGLang's routes: ``POST /generate`` (whole or
SSE-streamed), ``GET /health``, ``/health_generate``, ``/get_model_info``,
``/get_server_info``, ``/get_load`` and ``/v1/loads`` (SGLang 0.5.23 serves loads only there), ``POST /abort_request``, ``/flush_cache``, and its
OpenAI ``POST /v1/completions`` (text or token ids in, text out), ``POST
/v1/chat/completions`` (messages in, rendered with the model's chat template) and
``GET /v1/models``.
vLLM's (``api="vllm"``): ``POST /v1/completions`` with a token-id prompt and
``return_token_ids`` (``logprobs``, with ``echo`` the prompt's too, in vLLM's shape),
``GET /v1/models``, ``/health``, ``/metrics``, and ``POST /v1/embeddings`` with a token-id input.
Requests run through the gRPC mode's own servicer with an in-process call context,
so both modes validate, cache and fail alike. Like SGLang's server, a streamed
request reports errors as a ``data: {"error": ...}`` event, a whole one as HTTP 400,
and a client that disconnects has its request aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import grpc
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway_lab.sim.chat_wire import ChatShape, chat_renderer, completion_body
from gateway_lab.sim.completion_logprobs import LogprobRows
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.http_wire import (
    AnswerBuilder,
    BadBody,
    CompletionBuilder,
    completion_request,
    generate_request,
)
from gateway_lab.sim.servicer import SIM_VERSION, SimServicer
from gateway_lab.sim.worker import SimWorker

# vLLM's OpenAI server reads a request's data-parallel rank from this header.
DP_RANK_HEADER = "x-data-parallel-rank"

# Histogram families on a vLLM /metrics page, with bucket bounds of the same count.
_LATENCY = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
            "5.0", "7.5", "10.0", "20.0", "40.0", "80.0")  # fmt: skip
_SIZES = ("1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0", "5000.0", "10000.0")
_VLLM_HISTOGRAMS = (
    *((f"vllm:{n}", _LATENCY) for n in (
        "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_inference_time_seconds", "request_prefill_time_seconds",
        "request_decode_time_seconds")),
    *((f"vllm:{n}", _SIZES) for n in (
        "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total", "request_params_max_tokens")),
)  # fmt: skip


class ClientGone(Exception):
    """The client closed its connection before the first message of its answer."""


async def _first_unless_gone(
    request: Request, messages: AsyncGenerator[pb.GenerateResponse, None]
) -> pb.GenerateResponse:
    """The answer's first message, or ``ClientGone`` when the client leaves first: vLLM's
    server cancels a request whose client disconnects even while it is still prefilling
    (the request's body is read, so the next ASGI message is the disconnect)."""
    first = asyncio.ensure_future(anext(messages))
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if first.done():
        return first.result()
    first.cancel()  # runs the generation's cleanup, which aborts it on the worker
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, CallAborted):
        await first
    raise ClientGone


class CallAborted(Exception):
    """The servicer ended the call with a status (what ``context.abort`` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class InProcessContext:
    """The part of ``grpc.aio.ServicerContext`` the servicer's Generate uses."""

    # SGLang's HTTP server ends an aborted request with finish_reason "abort" (its gRPC
    # servicer leaves the stream open): the servicer asks its context which it plays.
    ends_aborted_streams = True

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        raise CallAborted(code, details)

    def cancelled(self) -> bool:
        return False


_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _logprob_rows(body: dict[str, Any], decode: Callable[[list[int]], str]) -> LogprobRows | None:
    """The rows a completion request asked for (``logprobs``), tokens named as it asked."""
    if body.get("logprobs") is None:
        return None
    if body.get("return_tokens_as_token_ids"):
        return LogprobRows(body["logprobs"], lambda token: f"token_id:{token}")
    return LogprobRows(body["logprobs"], lambda token: decode([token]))


def _sse(answer: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(answer) + b"\n\n"


HTTP_APIS = ("sglang", "vllm")


class SimHttpWorker:
    """One simulated SGLang HTTP server; ``await start()``, use ``url``, ``await stop()``."""

    def __init__(
        self, config: SimConfig | None = None, *, on_die: Callable[[], None] | None = None, api: str = "sglang",
    ) -> None:
        if api not in HTTP_APIS:
            raise ValueError(f"api must be one of {HTTP_APIS}, got {api!r}")
        self.worker = SimWorker(config, on_die=on_die)
        self.api = api
        self.servicer = SimServicer(self.worker)
        self.host = "127.0.0.1"
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
        ] if api == "vllm" else [
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/get_load", self.load, methods=["GET"]),
            Route("/v1/loads", self.v1_loads, methods=["GET"]),
            Route("/abort_request", self.abort, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def config(self) -> SimConfig:
        return self.worker.config

    @property
    def bootstrap_port(self) -> int | None:
        return self.worker.bootstrap_port

    def stats(self) -> dict[str, Any]:
        return {**self.worker.stats(), "url": self.url}

    async def start(self, host: str = "127.0.0.1", port: int = 0, bootstrap_port: int | None = None) -> None:
        """Start the worker (its gRPC port stays unused) and listen for HTTP on ``host:port``."""
        await self.worker.start(host, bootstrap_port=bootstrap_port)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        for _ in range(500):
            if self._server.started:
                return
            await asyncio.sleep(0.01)
        raise OSError(f"the simulated HTTP worker did not start on {host}:{port}")

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None
        if self.worker.port:
            await self.worker.stop(grace=grace)

    async def kill(self) -> None:
        """Vanish as a crashed server would: every open connection is dropped."""
        if self._server is not None:
            for conn in list(self._server.server_state.connections):
                transport = getattr(conn, "transport", None)
                if transport is not None:
                    transport.abort()
            self._server.should_exit = True
            self._server.force_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        await self.worker.kill()

    # ------------------------------------------------------------------ routes
    def _run(self, req: pb.GenerateRequest) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The gRPC mode's Generate, in process (closing it aborts the request)."""
        return self.servicer.Generate(req, InProcessContext())  # type: ignore[arg-type,return-value]

    async def generate(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            req = generate_request(body, uuid.uuid4().hex)
        except (orjson.JSONDecodeError, BadBody) as exc:
            return _error(str(exc), 400)
        if req.stream:
            return StreamingResponse(self._stream(req), media_type="text/event-stream")
        builder = AnswerBuilder(req.request_id)
        answers: dict[int, dict[str, Any]] = {}
        try:
            async with contextlib.aclosing(self._run(req)) as messages:
                async for message in messages:
                    if message.HasField("chunk"):
                        builder.chunk(message.chunk, req.return_logprob)
                        continue
                    # SGLang's unary n>1 completes all say index 0: their order is the sample's
                    answers[len(answers)] = builder.complete(message.complete, req.return_logprob)
        except CallAborted as exc:
            return _error(exc.details, _HTTP_STATUS.get(exc.code, 500))
        ordered = [answers[i] for i in sorted(answers)]
        for answer in ordered:
            del answer["index"]  # a single answer carries no index in SGLang
        return JSONResponse(ordered[0] if len(ordered) == 1 else ordered)

    async def _stream(self, req: pb.GenerateRequest) -> AsyncIterator[bytes]:
        """SSE events; the last chunk of a sample and its complete make one event, as in
        SGLang, where the finishing output carries both tokens and finish_reason."""
        builder = AnswerBuilder(req.request_id)
        lp = req.return_logprob
        pending: pb.GenerateStreamChunk | None = None
        try:
            async with contextlib.aclosing(self._run(req)) as messages:
                async for message in messages:
                    if message.HasField("chunk"):
                        if pending is not None:
                            yield _sse(builder.chunk(pending, lp))
                        pending = message.chunk
                        continue
                    complete = message.complete
                    if pending is not None:
                        if pending.index == complete.index:
                            builder.chunk(pending, lp)
                        else:
                            yield _sse(builder.chunk(pending, lp))
                        pending = None
                    yield _sse(builder.complete(complete, lp))
            if pending is not None:
                yield _sse(builder.chunk(pending, lp))
        except CallAborted as exc:
            if pending is not None:  # tokens made before the failure were sent
                yield _sse(builder.chunk(pending, lp))
            yield _sse({"error": {"message": exc.details}})
        yield b"data: [DONE]\n\n"

    # ----------------------------------------------------- vLLM's OpenAI server
    async def completions(self, request: Request) -> Response:
        """``/v1/completions`` with a token-id prompt, as vLLM answers it with
        ``return_token_ids``: refusals are HTTP 400 before any stream starts. SGLang's
        server (``api="sglang"``) also takes a text prompt, tokenized here, and answers
        with text: what a gateway that forwards OpenAI requests unchanged sends it."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(str(exc), 400)
        return await self._complete(request, body, lambda answer: answer)

    async def chat(self, request: Request) -> Response:
        """SGLang's ``/v1/chat/completions``: the messages rendered with the model's chat
        template (transformers, as the server does it) and answered as the completions route
        answers the rendered text, in chat objects."""
        try:
            body = orjson.loads(await request.body())
            render = await asyncio.to_thread(chat_renderer, self.worker.vocab.path)
            prompt = completion_body(body, render)
        except (orjson.JSONDecodeError, BadBody) as exc:
            return _error(str(exc), 400)
        return await self._complete(request, prompt, ChatShape(bool(prompt.get("stream"))))

    async def _complete(self, request: Request, body: Any, shape: Callable[[dict[str, Any]], dict[str, Any]]) -> Response:
        text = self.api == "sglang"
        vocab = self.worker.vocab
        try:
            req = completion_request(body, uuid.uuid4().hex, vocab.encode if text else None)
        except BadBody as exc:
            return _error(str(exc), 400)
        rank = request.headers.get(DP_RANK_HEADER, "")
        if rank.isdigit():  # vLLM pins the request to that engine; a header it cannot read it ignores
            req.data_parallel_rank = int(rank)
        prompt_ids = req.tokenized.input_ids if body.get("return_token_ids") else ()  # vLLM sends them back only when asked
        builder = CompletionBuilder(
            req.request_id, self.worker.config.served_name, vocab.decode if text else None, prompt_ids,
            _logprob_rows(body, vocab.decode),
        )  # fmt: skip
        messages = self._run(req)
        try:
            first = await _first_unless_gone(request, messages)
        except CallAborted as exc:
            await messages.aclose()
            return _error(exc.details, _HTTP_STATUS.get(exc.code, 500))
        except StopAsyncIteration:
            return _error("the worker produced nothing", 500)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the connection is closed
        if req.stream:
            options = body.get("stream_options") or {}
            return StreamingResponse(
                self._completion_stream(messages, first, builder, bool(options.get("continuous_usage_stats")),
                                        bool(options.get("include_usage")), shape),
                media_type="text/event-stream",
            )
        ids: dict[int, list[int]] = {}
        choices: dict[int, dict[str, Any]] = {}
        try:
            async with contextlib.aclosing(messages):
                message: pb.GenerateResponse | None = first
                while message is not None:
                    if message.HasField("chunk"):
                        c = message.chunk
                        ids.setdefault(c.index, []).extend(builder.carry(c))
                    else:
                        done = message.complete
                        if done.index in choices:
                            # vLLM numbers its choices; the unary n>1 completes under it all
                            # say index 0 (SGLang's form): their order is the choice's.
                            done = pb.GenerateComplete()
                            done.CopyFrom(message.complete)
                            done.index = len(choices)
                        choice = builder.finish(done, True, ids.get(done.index, []))["choices"][0]
                        choices[done.index] = choice
                    message = await anext(messages, None)
        except CallAborted as exc:
            return _error(exc.details, _HTTP_STATUS.get(exc.code, 500))
        answer = builder.usage_only()
        answer["choices"] = [choices[i] for i in sorted(choices)]
        return JSONResponse(shape(answer))

    async def _completion_stream(
        self, messages: AsyncGenerator[pb.GenerateResponse, None], first: pb.GenerateResponse,
        builder: CompletionBuilder, continuous: bool, final_usage: bool,
        shape: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> AsyncIterator[bytes]:
        pending: pb.GenerateStreamChunk | None = None
        try:
            async with contextlib.aclosing(messages):
                message: pb.GenerateResponse | None = first
                while message is not None:
                    if message.HasField("chunk"):
                        if pending is not None:
                            yield _sse(shape(builder.chunk(pending, continuous)))
                        pending = message.chunk
                    else:
                        done = message.complete
                        carried: list[int] = []
                        if pending is not None and pending.index == done.index:
                            carried = builder.carry(pending)
                        elif pending is not None:
                            yield _sse(shape(builder.chunk(pending, continuous)))
                        pending = None
                        yield _sse(shape(builder.finish(done, continuous, carried)))
                    message = await anext(messages, None)
            if pending is not None:
                yield _sse(shape(builder.chunk(pending, continuous)))
            if final_usage:
                yield _sse(shape(builder.usage_only()))
        except CallAborted as exc:
            if pending is not None:
                yield _sse(shape(builder.chunk(pending, continuous)))
            yield _sse({"error": {"message": exc.details, "type": "InternalServerError", "code": 500}})
        yield b"data: [DONE]\n\n"

    async def embeddings(self, request: Request) -> Response:
        """vLLM's ``/v1/embeddings`` (a pooling model's route) for a token-id input: the
        servicer's Embed, in OpenAI's shape with vLLM's usage."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(str(exc), 400)
        ids = body.get("input") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
            return _error("input must be a non-empty list of token ids", 400)
        req = pb.EmbedRequest(request_id=uuid.uuid4().hex, tokenized=pb.TokenizedInput(input_ids=ids))
        try:
            reply = await self.servicer.Embed(req, InProcessContext())  # type: ignore[arg-type]
        except CallAborted as exc:
            return _error(exc.details, _HTTP_STATUS.get(exc.code, 500))
        return JSONResponse({
            "id": f"embd-{req.request_id}", "object": "list", "model": self.worker.config.served_name,
            "data": [{"index": 0, "object": "embedding", "embedding": list(reply.embedding)}],
            "usage": {"prompt_tokens": reply.prompt_tokens, "total_tokens": reply.prompt_tokens, "completion_tokens": 0},
        })

    async def models(self, request: Request) -> Response:
        cfg = self.worker.config
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.served_name, "object": "model", "root": cfg.model, "max_model_len": cfg.context_length,
            "owned_by": self.api,  # each server names itself on its model cards
        }]})

    async def metrics(self, request: Request) -> Response:
        cfg = self.worker.config
        blocks = self.worker.cache.capacity // cfg.page_size
        ranks = self.worker.ranks  # one engine per data-parallel rank, each its own series
        name = cfg.served_name
        lines = [
            "# TYPE vllm:cache_config_info gauge",
            *(f'vllm:cache_config_info{{block_size="{cfg.page_size}",engine="{r.index}",num_gpu_blocks="{blocks}"}} 1.0'
              for r in ranks),
            "# TYPE vllm:num_requests_running gauge",
            *(f'vllm:num_requests_running{{engine="{r.index}",model_name="{name}"}} {r.scheduler.num_running}' for r in ranks),
            "# TYPE vllm:num_requests_waiting gauge",
            *(f'vllm:num_requests_waiting{{engine="{r.index}",model_name="{name}"}} {r.scheduler.num_waiting}' for r in ranks),
        ]  # fmt: skip
        # The rest of a vLLM page, so a client that polls it reads a page of the real size:
        # the worker's token counters, and per engine the latency and size histograms
        # (kept empty here: the simulator times nothing a client reads from them).
        c = self.worker.counters
        for counter, value in (("prompt_tokens", c.prompt_tokens), ("generation_tokens", c.generated_tokens),
                               ("prefix_cache_queries", c.prompt_tokens), ("prefix_cache_hits", c.cached_tokens)):
            lines += [f"# TYPE vllm:{counter}_total counter", f'vllm:{counter}_total{{model_name="{name}"}} {float(value)}']
        for histogram, bounds in _VLLM_HISTOGRAMS:
            lines.append(f"# TYPE {histogram} histogram")
            for r in ranks:
                labels = f'engine="{r.index}",model_name="{name}"'
                lines += [f'{histogram}_bucket{{{labels},le="{le}"}} 0.0' for le in (*bounds, "+Inf")]
                lines += [f"{histogram}_sum{{{labels}}} 0.0", f"{histogram}_count{{{labels}}} 0.0"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def health(self, request: Request) -> Response:
        self.worker.counters.health_checks += 1
        return Response(status_code=503 if self.worker.stopping else 200)

    async def model_info(self, request: Request) -> Response:
        cfg = self.worker.config
        return JSONResponse({
            "model_path": cfg.model,
            "tokenizer_path": str(self.worker.vocab.path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        })

    async def server_info(self, request: Request) -> Response:
        w = self.worker
        cfg = w.config
        args = dict(w.server_args())
        # The simulator matches no stop strings (it has no tokenizer of its own), so it says
        # so: a gateway sends it stop ids only, as to any worker without a tokenizer.
        args.update(grpc_mode=False, skip_tokenizer_init=True, port=self.port)
        scheduler = {
            "max_total_num_tokens": w.cache.capacity,
            "max_req_input_len": cfg.context_length - 1,
        }
        states = [  # one per data-parallel rank, as SGLang lists its schedulers'
            {"last_gen_throughput": r.scheduler.gen_throughput(), "load": r.scheduler.num_running + r.scheduler.num_waiting}
            for r in w.ranks
        ]
        return JSONResponse({**args, **scheduler, "internal_states": states, "version": SIM_VERSION})

    async def load(self, request: Request) -> Response:
        return JSONResponse([
            {
                "dp_rank": load.dp_rank,
                "num_reqs": load.num_running_reqs + load.num_waiting_reqs,
                "num_waiting_reqs": load.num_waiting_reqs,
                "num_tokens": load.num_used_tokens,
            }
            for load in self.worker.scheduler_loads()
        ])

    async def v1_loads(self, request: Request) -> Response:
        """Per-rank loads as SGLang 0.5.23's ``/v1/loads`` reports them (its ``core`` fields this
        worker keeps; a field at 0 is left out, as there)."""
        rows = []
        for load in self.worker.scheduler_loads():
            row = {"dp_rank": load.dp_rank, "num_running_reqs": load.num_running_reqs,
                   "num_waiting_reqs": load.num_waiting_reqs, "num_used_tokens": load.num_used_tokens}
            rows.append({k: v for k, v in row.items() if v})
        return JSONResponse({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "sim",
                             "accelerator": None, "num_accelerators": 1, "loads": rows})

    async def abort(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error("the body must be JSON", 400)
        rid = body.get("rid") if isinstance(body, dict) else None
        if isinstance(rid, str):
            self.worker.abort(rid)
        return Response(status_code=200)

    async def flush_cache(self, request: Request) -> Response:
        ok, message = await self.worker.flush_cache(0.0)
        return Response(message + "\n", status_code=200 if ok else 400)


@contextlib.asynccontextmanager
async def http_fleet(
    n: int, config: SimConfig | None = None, *, api: str = "sglang"
) -> AsyncIterator[list[SimHttpWorker]]:
    """``n`` simulated HTTP workers (SGLang's API or vLLM's) in this process, stopped on exit."""
    workers = [SimHttpWorker(config, api=api) for _ in range(n)]
    try:
        for w in workers:
            await w.start()
        yield workers
    finally:
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


__all__ = ["CallAborted", "InProcessContext", "SimHttpWorker", "http_fleet"]
