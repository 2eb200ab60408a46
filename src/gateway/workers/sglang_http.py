"""A ``WorkerTransport`` for SGLang's own HTTP server (``http://`` / ``https://`` workers).

Most SGLang fleets serve HTTP, not ``--grpc-mode``. This client sends the same token
ids the policy routed on to ``POST /generate`` (``input_ids``), so the worker's radix
cache sees exactly the prefix the policy predicted, and reads the answer back into
the seam's messages (``sglang_http_wire``): the pipeline above cannot tell it from a
gRPC worker. One httpx connection pool per worker; HTTP failures become
``WorkerCallError`` in ``http_errors`` only.

What SGLang's HTTP server does not offer is reported, not faked: no tokenizer download
(the gateway needs ``--tokenizer`` or a local copy), no KV-event stream, no Embed here.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson
from google.protobuf import struct_pb2

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.headers import REQUEST_ID
from gateway.workers.address import WorkerAddress, parse_worker_url
from gateway.workers.client import TlsOptions
from gateway.workers.http_errors import http_status_error, transport_error
from gateway.workers.sglang_http_wire import (
    AnswerError,
    StreamReader,
    error_message,
    generate_body,
    whole_answer,
)
from gateway.workers.trace_context import TRACEPARENT
from gateway.workers.transport import END_OF_STREAM, CallCode, EndOfStream, WorkerCallError

# Streams stay open as long as generation takes: stalls are the watchdog's job, so
# no read timeout; connecting and writing are bounded.
_STREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
# HTTP/1.1 holds one connection per open stream: the pool must not cap concurrency
# below what the worker's own admission allows.
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=60.0)

# After the last sample finished, how long the end of the stream may take to arrive.
_DRAIN_S = 5.0

_Item = pb.GenerateResponse | EndOfStream | WorkerCallError


def _call_error(exc: Exception, timeout: float | None) -> WorkerCallError:
    """What ended a Generate call, in the seam's terms."""
    if isinstance(exc, WorkerCallError):
        return exc
    if isinstance(exc, httpx.TransportError):
        return transport_error(exc)
    if isinstance(exc, TimeoutError):
        return WorkerCallError(CallCode.DEADLINE_EXCEEDED, f"no answer within {timeout} s")
    return WorkerCallError(CallCode.INTERNAL, f"the worker's answer is malformed: {exc}")


def http_ssl_context(tls: TlsOptions | None) -> ssl.SSLContext:
    """The worker TLS settings for HTTP/1.1 (no ALPN h2, unlike the gRPC streams)."""
    tls = tls or TlsOptions()
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


class HttpGenerateCall:
    """One ``/generate`` call read through the seam's terms. A background task reads the
    HTTP answer into a queue, so ``cancel()`` can end both a pending ``read()``
    (``CancelledError``) and the HTTP request (closing it makes SGLang abort it)."""

    __slots__ = ("_cancelled", "_draining", "_items", "_task", "_waiter")

    def __init__(
        self, http: httpx.AsyncClient, request: pb.GenerateRequest, headers: dict[str, str],
        timeout: float | None,
    ) -> None:
        self._items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._cancelled = False
        self._draining = False  # every sample finished: only the stream's end is left to read
        self._task = asyncio.get_running_loop().create_task(
            self._pump(http, request, headers, timeout)
        )

    def _push(self, item: _Item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _pump(
        self, http: httpx.AsyncClient, request: pb.GenerateRequest, headers: dict[str, str],
        timeout: float | None,
    ) -> None:
        try:
            async with asyncio.timeout(timeout) as deadline:
                await self._exchange(http, request, headers, deadline)
        except (WorkerCallError, httpx.TransportError, TimeoutError, AnswerError, orjson.JSONDecodeError) as exc:
            # Once every sample was answered, a bad ending of the stream loses nothing.
            self._push(END_OF_STREAM if self._draining else _call_error(exc, timeout))
        else:
            self._push(END_OF_STREAM)

    async def _exchange(
        self, http: httpx.AsyncClient, request: pb.GenerateRequest, headers: dict[str, str],
        deadline: asyncio.Timeout,
    ) -> None:
        rid = request.request_id
        body = orjson.dumps(generate_body(request))
        async with http.stream("POST", "/generate", content=body, headers=headers) as response:
            if response.status_code != 200:
                raise http_status_error(response.status_code, await response.aread())
            if not request.stream:
                for message in whole_answer(rid, orjson.loads(await response.aread())):
                    self._push(message)
                return
            reader = StreamReader(rid)
            samples = max(1, request.sampling_params.n)
            finished = 0
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    continue  # read on to the body's end, so the connection goes back to the pool
                answer = orjson.loads(payload)
                refused = error_message(answer)
                if refused is not None:
                    code = CallCode.ABORTED if reader.started else CallCode.INVALID_ARGUMENT
                    raise WorkerCallError(code, refused)
                for out in reader.feed(answer):
                    self._push(out)
                    if out.HasField("complete"):
                        finished += 1
                if finished >= samples and not self._draining:
                    # The reader may stop (and cancel) now; reading the last bytes instead
                    # of dropping the connection keeps it in the pool. Bounded.
                    self._draining = True
                    when = asyncio.get_running_loop().time() + _DRAIN_S
                    current = deadline.when()
                    deadline.reschedule(when if current is None else min(current, when))
            if finished < samples:
                raise WorkerCallError(
                    CallCode.UNAVAILABLE, "the worker ended the stream before the generation finished"
                )

    async def read(self) -> pb.GenerateResponse | EndOfStream:
        while not self._items or self._cancelled:
            if self._cancelled:
                raise asyncio.CancelledError
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                if not self._cancelled:  # a cancelled reader cancels the call (once: a
                    self._task.cancel()  # second cancel would cut the connection's close short)
                raise
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, WorkerCallError):
            raise item
        return item

    def cancel(self) -> bool:
        if self._cancelled:
            return False
        self._cancelled = True
        cancelled = True if self._draining else self._task.cancel()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.cancel()
        return cancelled


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    # Struct holds JSON values only; SGLang's server args also carry None and nested lists.
    out.update({k: v for k, v in values.items() if isinstance(v, (str, int, float, bool, list, dict))})
    return out


class SglangHttpClient:
    """The worker seam over one SGLang HTTP server (``--engine sglang`` on ``http(s)://``)."""

    kind = "sglang/http"

    def __init__(self, url: str, *, tls: TlsOptions | None = None, api_key: str | None = None) -> None:
        self.address: WorkerAddress = parse_worker_url(url)
        self.url = self.address.url
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=_STREAM_TIMEOUT,
            limits=_LIMITS,
            # Plain http:// has no TLS: False skips loading a CA bundle per worker.
            verify=http_ssl_context(tls) if self.address.scheme == "https" else False,
            trust_env=False,  # workers sit next to the gateway: no proxy from the environment
        )

    def _headers(self, request_id: str | None = None) -> dict[str, str]:
        out: dict[str, str] = {"content-type": "application/json"}
        if request_id and request_id.isascii() and request_id.isprintable():
            out[REQUEST_ID] = request_id
        traceparent = TRACEPARENT.get()
        if traceparent is not None:
            out["traceparent"] = traceparent
        return out

    async def _get_json(self, path: str, timeout: float) -> Any:
        try:
            response = await self._http.get(path, timeout=timeout)
        except httpx.TransportError as exc:
            raise transport_error(exc) from None
        if response.status_code != 200:
            raise http_status_error(response.status_code, response.content)
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise WorkerCallError(CallCode.INTERNAL, f"{path} did not answer JSON") from None

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> HttpGenerateCall:
        return HttpGenerateCall(self._http, request, self._headers(request.request_id), timeout)

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        try:
            response = await self._http.post(
                "/abort_request", content=orjson.dumps({"rid": request_id}),
                headers=self._headers(request_id), timeout=timeout,
            )
        except httpx.TransportError as exc:
            raise transport_error(exc) from None
        if response.status_code >= 300:
            raise http_status_error(response.status_code, response.content)
        return True

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "embeddings are not supported on SGLang HTTP workers yet")

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        try:
            response = await self._http.get("/health", timeout=timeout)
        except httpx.TransportError as exc:
            raise transport_error(exc) from None
        if response.status_code == 200:
            return pb.HealthCheckResponse(healthy=True, message="ok")
        return pb.HealthCheckResponse(healthy=False, message=f"/health answered HTTP {response.status_code}")

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        try:
            info = await self._get_json("/get_model_info", timeout)
        except WorkerCallError as exc:
            if exc.code is CallCode.UNIMPLEMENTED:
                raise WorkerCallError(exc.code, (
                    f"{self.url} has no /get_model_info: not an SGLang HTTP server"
                    " (vLLM HTTP workers are not supported yet)"
                )) from None
            raise
        if not isinstance(info, dict):
            raise WorkerCallError(CallCode.INTERNAL, "/get_model_info did not answer an object")
        preferred = info.get("preferred_sampling_params")
        return pb.GetModelInfoResponse(
            model_path=str(info.get("model_path") or ""),
            tokenizer_path=str(info.get("tokenizer_path") or ""),
            is_generation=bool(info.get("is_generation", True)),
            preferred_sampling_params=preferred if isinstance(preferred, str) else "",
            weight_version=str(info.get("weight_version") or ""),
            served_model_name=str(info.get("served_model_name") or ""),
        )

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        info = await self._get_json("/get_server_info", timeout)
        if not isinstance(info, dict):
            raise WorkerCallError(CallCode.INTERNAL, "/get_server_info did not answer an object")
        states = info.get("internal_states")
        args = {k: v for k, v in info.items() if k not in ("internal_states", "version")}
        capacity = info.get("max_total_num_tokens")
        return pb.GetServerInfoResponse(
            server_args=_struct(args),
            scheduler_info=_struct(states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}),
            sglang_version=str(info.get("version") or ""),
            server_type="http",
            max_total_num_tokens=capacity if isinstance(capacity, int) else 0,
        )

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        """``/get_load``: a list of per-rank loads (``num_reqs``, ``num_waiting_reqs``,
        ``num_tokens``) on current SGLang, ``{"load": n}`` on older versions."""
        got = await self._get_json("/get_load", timeout)
        rows = got if isinstance(got, list) else [got]
        loads: list[pb.SchedulerLoad] = []
        for rank, row in enumerate(rows):
            if not isinstance(row, dict):
                raise WorkerCallError(CallCode.INTERNAL, "/get_load answered an unknown shape")
            total = int(row.get("num_reqs", row.get("load", 0)) or 0)
            waiting = int(row.get("num_waiting_reqs", 0) or 0)
            loads.append(pb.SchedulerLoad(
                dp_rank=int(row.get("dp_rank", rank) or 0),
                num_running_reqs=max(0, total - waiting),
                num_waiting_reqs=waiting,
                num_total_reqs=total,
                num_used_tokens=int(row.get("num_tokens", 0) or 0),
            ))
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            dp_rank_count=len(loads),
            loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=sum(x.num_running_reqs for x in loads),
                total_waiting_reqs=sum(x.num_waiting_reqs for x in loads),
                total_reqs=sum(x.num_total_reqs for x in loads),
            ),
        )

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        try:
            response = await self._http.post("/flush_cache", timeout=timeout)
        except httpx.TransportError as exc:
            raise transport_error(exc) from None
        message = response.text.strip()
        return common_pb2.FlushCacheResponse(success=response.status_code == 200, message=message)

    async def tokenizer_zip(self, *, timeout: float = 60.0) -> tuple[bytes, str]:
        raise WorkerCallError(
            CallCode.UNIMPLEMENTED, "SGLang's HTTP server does not serve its tokenizer: give --tokenizer"
        )

    async def _no_tokenizer(self) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "SGLang's HTTP server does not serve its tokenizer")
        yield common_pb2.GetTokenizerChunk()  # pragma: no cover - makes this an async generator

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        return self._no_tokenizer()

    async def _no_kv_events(self) -> AsyncIterator[common_pb2.KvEventBatch]:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, "SGLang's HTTP server has no KV-event stream")
        yield common_pb2.KvEventBatch()  # pragma: no cover - makes this an async generator

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        return self._no_kv_events()

    async def close(self, grace: float | None = None) -> None:
        await self._http.aclose()


__all__ = ["HttpGenerateCall", "SglangHttpClient", "http_ssl_context"]
