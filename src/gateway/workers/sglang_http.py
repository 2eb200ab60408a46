"""A ``WorkerTransport`` for SGLang's own HTTP server (``http://`` / ``https://`` workers).

Most SGLang fleets serve HTTP, not ``--grpc-mode``. This client sends the same token
ids the policy routed on to ``POST /generate`` (``input_ids``), so the worker's radix
cache sees exactly the prefix the policy predicted, and reads the answer back into
the seam's messages (``sglang_http_wire``): the pipeline above cannot tell it from a
gRPC worker. One aiohttp session (one connection pool) per worker: its C HTTP parser
keeps the gateway's CPU per request close to the gRPC path's, where a pure-Python
client stack (h11) cost about twice as much; HTTP failures become ``WorkerCallError``
in ``http_errors`` only.

What SGLang's HTTP server does not offer is reported, not faked: no tokenizer download
(the gateway needs ``--tokenizer`` or a local copy), no KV-event stream, no Embed here.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson
from google.protobuf import struct_pb2

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.headers import REQUEST_ID
from gateway.workers.address import WorkerAddress, parse_worker_url
from gateway.workers.client import TlsOptions
from gateway.workers.http_errors import http_status_error, transport_error
from gateway.workers.reply_bound import CONTROL_REPLY_BYTES, ReplyTooLarge, json_reply_bytes
from gateway.workers.sglang_http_wire import (
    AnswerError,
    StreamReader,
    body_json,
    error_message,
    generate_body,
    whole_answer,
)
from gateway.workers.trace_context import TRACEPARENT
from gateway.workers.transport import END_OF_STREAM, CallCode, EndOfStream, WorkerCallError

# Streams stay open as long as generation takes: stalls are the watchdog's job, so
# no read timeout; connecting is bounded.
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30.0, sock_connect=10.0)

# After the last sample finished, how long the end of the stream may take to arrive.
_DRAIN_S = 5.0

_Item = pb.GenerateResponse | EndOfStream | WorkerCallError
_C = TypeVar("_C", bound="HttpWorkerClient")


class AnswerReader(Protocol):
    """Reads one streamed answer's JSON objects into the seam's messages."""

    @property
    def started(self) -> bool: ...

    def parse(self, payload: bytes) -> object:
        """One event's JSON (``orjson.JSONDecodeError`` when it is not)."""
        ...

    def feed(self, answer: object) -> Iterable[pb.GenerateResponse]: ...

    def close(self) -> Iterable[pb.GenerateResponse]:
        """What the reader still holds when the stream ends (an engine may send a sample's
        end before the counts that belong in it)."""
        ...


class Dialect(Protocol):
    """One engine's generate route: where, what body, how its answers read."""

    path: str

    def body(self, request: pb.GenerateRequest) -> bytes: ...

    def reader(self, request: pb.GenerateRequest) -> AnswerReader: ...

    def whole(self, request: pb.GenerateRequest, answer: object) -> list[pb.GenerateResponse]: ...


class SglangDialect:
    """SGLang's ``/generate`` with ``input_ids``."""

    path = "/generate"

    def body(self, request: pb.GenerateRequest) -> bytes:
        return body_json(generate_body(request))

    def reader(self, request: pb.GenerateRequest) -> AnswerReader:
        return StreamReader(request.request_id, request.return_logprob)

    def whole(self, request: pb.GenerateRequest, answer: object) -> list[pb.GenerateResponse]:
        return whole_answer(request.request_id, answer)


class SseLines:
    """Splits a streamed body into its ``data:`` lines, a read at a time, each line at most
    ``bound`` bytes (a cumulative ``output_ids`` list outgrows aiohttp's own line limit on
    long generations; a line past what the request can bring back is ``ReplyTooLarge``,
    raised before more of it is held). Synchronous, so a read's events are handled in one
    go and wake the reader once; SSE's blank separators and other fields are dropped."""

    __slots__ = ("_bound", "_pending")

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The complete ``data:`` lines that ``data`` ends."""
        if self._pending:
            data = self._pending + data
        lines = data.split(b"\n")
        self._pending = pending = lines.pop()
        bound = self._bound
        if len(pending) > bound:
            raise ReplyTooLarge(None, bound)
        out = []
        for line in lines:
            if len(line) > bound:
                raise ReplyTooLarge(len(line), bound)
            if line[:5] == b"data:":
                out.append(line)
        return out

    def close(self) -> list[bytes]:
        """The last line, when the body did not end with a line break."""
        pending, self._pending = self._pending, b""
        return [pending] if pending[:5] == b"data:" else []


async def read_bounded(response: aiohttp.ClientResponse, bound: int) -> bytes:
    """A whole answer body, refused (``ReplyTooLarge``) as soon as it passes ``bound``
    bytes: by its Content-Length before reading, else as it arrives."""
    length = response.content_length
    if length is not None and length > bound:
        raise ReplyTooLarge(length, bound)
    parts: list[bytes] = []
    size = 0
    async for data in response.content.iter_any():
        size += len(data)
        if size > bound:
            raise ReplyTooLarge(None, bound)
        parts.append(data)
    return b"".join(parts)


ERROR_BODY_BYTES = 64 << 10
"""What of a refusal's body is read (its message for the client's error)."""


async def read_head(response: aiohttp.ClientResponse, limit: int = ERROR_BODY_BYTES) -> bytes:
    """At most the first ``limit`` bytes of a body (the rest is dropped with the connection)."""
    parts: list[bytes] = []
    size = 0
    async for data in response.content.iter_any():
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _call_error(exc: Exception, timeout: float | None) -> WorkerCallError:
    """What ended a Generate call, in the seam's terms."""
    if isinstance(exc, WorkerCallError):
        return exc
    if isinstance(exc, aiohttp.ClientError):
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
    (``CancelledError``) and the HTTP request (closing it makes SGLang abort it).

    A reader may also take messages as they arrive, without waking (``pusher``, as on the
    gateway's own HTTP/2 calls): while it waits in ``read()``, each read of the answer
    first calls ``pusher`` with the queue, which takes what it can from its front there and
    then; the reader wakes only for what it left, the end or a failure (queued after the
    pusher is dropped, so a pusher only ever sees messages)."""

    __slots__ = ("_cancelled", "_draining", "_finished", "_items", "_task", "_waiter", "pusher")

    def __init__(
        self, http: aiohttp.ClientSession, dialect: Dialect, request: pb.GenerateRequest,
        headers: dict[str, str], timeout: float | None,
    ) -> None:
        self._items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._cancelled = False
        self._draining = False  # every sample finished: only the stream's end is left to read
        self._finished = 0  # completes read so far
        # Called with the queue on each read of the answer while the reader waits; it
        # takes messages from the front. It must not raise.
        self.pusher: Callable[[deque[pb.GenerateResponse]], None] | None = None
        self._task = asyncio.get_running_loop().create_task(
            self._pump(http, dialect, request, headers, timeout)
        )

    def _end(self, item: EndOfStream | WorkerCallError) -> None:
        """Queue the call's last item and wake the reader for it (no pusher from now on:
        it held the reader's side, and the end is the reader's to take)."""
        self.pusher = None
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        """Wake a pending ``read()`` once for everything queued since it began to wait,
        unless the ``pusher`` takes all of it."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            pusher = self.pusher
            if pusher is not None:
                items = self._items
                pusher(items)  # type: ignore[arg-type]  # only messages are queued while it is set
                if not items:
                    return  # it took them all: nothing for the reader yet
            if not waiter.done():  # (a pusher may cancel the call, which wakes the reader itself)
                waiter.set_result(None)

    def ready(self) -> bool:
        """``read()`` would return (or raise) without waiting: the pipeline takes the
        tokens that came in one read of the worker's answer as one batch."""
        return bool(self._items) or self._cancelled

    async def _pump(
        self, http: aiohttp.ClientSession, dialect: Dialect, request: pb.GenerateRequest,
        headers: dict[str, str], timeout: float | None,
    ) -> None:
        try:
            async with asyncio.timeout(timeout) as deadline:
                await self._exchange(http, dialect, request, headers, deadline)
        except (WorkerCallError, aiohttp.ClientError, TimeoutError, AnswerError, orjson.JSONDecodeError) as exc:
            # Once every sample was answered, a bad ending of the stream loses nothing.
            self._end(END_OF_STREAM if self._draining else _call_error(exc, timeout))
        else:
            self._end(END_OF_STREAM)

    async def _exchange(
        self, http: aiohttp.ClientSession, dialect: Dialect, request: pb.GenerateRequest,
        headers: dict[str, str], deadline: asyncio.Timeout,
    ) -> None:
        async with http.post(dialect.path, data=dialect.body(request), headers=headers) as response:
            if response.status != 200:
                raise http_status_error(response.status, await read_head(response))
            bound = json_reply_bytes(request)
            if not request.stream:
                self._take(dialect.whole(request, orjson.loads(await read_bounded(response, bound))))
                return
            reader = dialect.reader(request)
            samples = max(1, request.sampling_params.n)
            lines = SseLines(bound)
            content = response.content
            while data := await content.readany():
                self._events(lines.feed(data), reader, samples, deadline)
            self._events(lines.close(), reader, samples, deadline)
            self._finished += self._take(reader.close())
            if self._finished < samples:
                raise WorkerCallError(
                    CallCode.UNAVAILABLE, "the worker ended the stream before the generation finished"
                )

    def _events(self, lines: list[bytes], reader: AnswerReader, samples: int, deadline: asyncio.Timeout) -> None:
        """One read's ``data:`` lines into the queue (the reader is woken once for them)."""
        if not lines:
            return
        queued = len(self._items)
        try:
            for line in lines:
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue  # read on to the body's end, so the connection goes back to the pool
                answer = reader.parse(payload)
                refused = error_message(answer)
                if refused is not None:
                    code = CallCode.ABORTED if reader.started else CallCode.INVALID_ARGUMENT
                    raise WorkerCallError(code, refused)
                for out in reader.feed(answer):
                    self._items.append(out)
                    if out.HasField("complete"):
                        self._finished += 1
                if self._finished >= samples and not self._draining:
                    # The reader may stop (and cancel) now; reading the last bytes instead
                    # of dropping the connection keeps it in the pool. Bounded.
                    self._draining = True
                    when = asyncio.get_running_loop().time() + _DRAIN_S
                    current = deadline.when()
                    deadline.reschedule(when if current is None else min(current, when))
        finally:
            if len(self._items) > queued:
                self._wake()

    def _take(self, messages: Iterable[pb.GenerateResponse]) -> int:
        """Queue ``messages`` (one wake for all of them); how many were completes."""
        finished = 0
        queued = len(self._items)
        for out in messages:
            self._items.append(out)
            if out.HasField("complete"):
                finished += 1
        if len(self._items) > queued:
            self._wake()
        return finished

    def take_all(self) -> list[pb.GenerateResponse]:
        """Every message that has arrived, in order, as ``read()`` would return them one by
        one, without its coroutine; empty otherwise (nothing yet, or the end, a failure or a
        cancel, which ``read()`` reports: the end or failure stays queued for it)."""
        items = self._items
        if not items or self._cancelled:
            return []
        if type(items[-1]) is pb.GenerateResponse:  # no end queued: every item is a message
            taken = list(items)
            items.clear()
            return taken  # type: ignore[return-value]
        out: list[pb.GenerateResponse] = []
        while items and type(items[0]) is pb.GenerateResponse:
            out.append(items.popleft())  # type: ignore[arg-type]
        return out

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
            try:
                raise item
            finally:
                del item  # the error's traceback holds this frame: no cycle through it
        return item

    def cancel(self) -> bool:
        if self._cancelled:
            return False
        self._cancelled = True
        self.pusher = None
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


class HttpWorkerClient:
    """What every HTTP worker client shares: one aiohttp session per worker, small calls
    with their failures as call errors, Generate through the engine's :class:`Dialect`,
    and the calls an engine's HTTP server does not offer (tokenizer download, KV events,
    embeddings here) failing as UNIMPLEMENTED with the engine's name."""

    kind = "http"
    engine = "an HTTP worker"
    # The calls below that fail as UNIMPLEMENTED (GET /workers shows them).
    lacks: frozenset[str] = frozenset({"embed", "tokenizer_download", "kv_events"})
    models: tuple[str, ...] = ()  # an engine's HTTP server serves the one model it reports
    _dialect: Dialect

    def __init__(
        self, url: str, *, tls: TlsOptions | None = None, api_key: str | None = None, kv_event_discovery: bool = False,
    ) -> None:
        self.address: WorkerAddress = parse_worker_url(url)
        self.url = self.address.url
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._ssl: ssl.SSLContext | bool = http_ssl_context(tls) if self.address.scheme == "https" else False
        self._session: aiohttp.ClientSession | None = None
        # Whether the gateway reads the worker's KV-event publisher from its report
        # (``--kv-events-zmq auto``): an engine whose report of it costs a request of its
        # own asks only then.
        self.kv_event_discovery = kv_event_discovery
        self._options = (tls, api_key)

    def same_worker_as(self, kind: type[_C]) -> _C:
        """A client of another engine's kind for this worker (engine detection)."""
        tls, api_key = self._options
        return kind(self.url, tls=tls, api_key=api_key, kv_event_discovery=self.kv_event_discovery)

    @property
    def _http(self) -> aiohttp.ClientSession:
        """The worker's session, made on first use (aiohttp wants a running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                base_url=self.url,
                headers=self._auth,
                timeout=_STREAM_TIMEOUT,
                # HTTP/1.1 holds one connection per open stream: no cap below the
                # worker's own admission.
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl, keepalive_timeout=60.0),
                trust_env=False,  # workers sit next to the gateway: no proxy from the environment
            )
        return self._session

    def _headers(self, request_id: str | None = None) -> dict[str, str]:
        out: dict[str, str] = {"content-type": "application/json"}
        if request_id and request_id.isascii() and request_id.isprintable():
            out[REQUEST_ID] = request_id
        traceparent = TRACEPARENT.get()
        if traceparent is not None:
            out["traceparent"] = traceparent
        return out

    async def _call(
        self, method: str, path: str, timeout: float, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One small request: (status, body), failures below HTTP as call errors."""
        try:
            async with self._http.request(
                method, path, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                return response.status, await read_bounded(response, CONTROL_REPLY_BYTES)
        except aiohttp.ClientError as exc:
            raise transport_error(exc) from None
        except TimeoutError:
            raise WorkerCallError(CallCode.DEADLINE_EXCEEDED, f"{path}: no answer within {timeout} s") from None

    async def _get_json(self, path: str, timeout: float) -> Any:
        status, content = await self._call("GET", path, timeout)
        if status != 200:
            raise http_status_error(status, content)
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            raise WorkerCallError(CallCode.INTERNAL, f"{path} did not answer JSON") from None

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> HttpGenerateCall:
        return HttpGenerateCall(self._http, self._dialect, request, self._headers(request.request_id), timeout)

    async def embed(self, request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, f"embeddings are not supported on {self.engine} yet")

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        status, _ = await self._call("GET", "/health", timeout)
        if status == 200:
            return pb.HealthCheckResponse(healthy=True, message="ok")
        return pb.HealthCheckResponse(healthy=False, message=f"/health answered HTTP {status}")

    async def tokenizer_zip(self, *, timeout: float = 60.0) -> tuple[bytes, str]:
        raise WorkerCallError(
            CallCode.UNIMPLEMENTED, f"{self.engine} does not serve its tokenizer: give --tokenizer"
        )

    async def _no_tokenizer(self) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, f"{self.engine} does not serve its tokenizer")
        yield common_pb2.GetTokenizerChunk()  # pragma: no cover - makes this an async generator

    def tokenizer_chunks(
        self, request: common_pb2.GetTokenizerRequest | None = None, *, timeout: float = 60.0
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        return self._no_tokenizer()

    async def _no_kv_events(self) -> AsyncIterator[common_pb2.KvEventBatch]:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, f"{self.engine} has no KV-event stream")
        yield common_pb2.KvEventBatch()  # pragma: no cover - makes this an async generator

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        return self._no_kv_events()

    async def close(self, grace: float | None = None) -> None:
        if self._session is not None:
            await self._session.close()



class SglangHttpClient(HttpWorkerClient):
    """The worker seam over one SGLang HTTP server (``http(s)://``)."""

    kind = "sglang/http"
    engine = "SGLang's HTTP server"
    _dialect: Dialect = SglangDialect()

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._v1_loads = True  # until the server answers 404 there (before SGLang's /v1/loads: /get_load)

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        status, content = await self._call(
            "POST", "/abort_request", timeout, orjson.dumps({"rid": request_id}), self._headers(request_id),
        )
        if status >= 300:
            raise http_status_error(status, content)
        return True

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
        """``/v1/loads?include=core`` (SGLang 0.5.23 serves loads there only: ``{"loads": [per
        rank: dp_rank, num_running_reqs, num_waiting_reqs, num_used_tokens, ...]}``, a field at 0
        left out); a server without it (404) is asked ``/get_load`` from then on: a list of
        per-rank ``num_reqs``, ``num_waiting_reqs``, ``num_tokens``, or ``{"load": n}`` on older
        versions."""
        loads: list[pb.SchedulerLoad] = []
        got: Any = None
        if self._v1_loads:
            try:
                got = await self._get_json("/v1/loads?include=core", timeout)
            except WorkerCallError as exc:
                if exc.code is not CallCode.UNIMPLEMENTED:
                    raise
                self._v1_loads = False
        if got is not None:
            rows = got.get("loads") if isinstance(got, dict) else None
            if not isinstance(rows, list):
                raise WorkerCallError(CallCode.INTERNAL, "/v1/loads answered an unknown shape")
            for rank, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise WorkerCallError(CallCode.INTERNAL, "/v1/loads answered an unknown shape")
                running = int(row.get("num_running_reqs", 0) or 0)
                waiting = int(row.get("num_waiting_reqs", 0) or 0)
                loads.append(pb.SchedulerLoad(
                    dp_rank=int(row.get("dp_rank", rank) or 0),
                    num_running_reqs=running,
                    num_waiting_reqs=waiting,
                    num_total_reqs=running + waiting,
                    num_used_tokens=int(row.get("num_used_tokens", 0) or 0),
                ))
        else:
            got = await self._get_json("/get_load", timeout)
            for rank, row in enumerate(got if isinstance(got, list) else [got]):
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
        status, content = await self._call("POST", "/flush_cache", timeout)
        message = content.decode("utf-8", "replace").strip()
        return common_pb2.FlushCacheResponse(success=status == 200, message=message)


__all__ = [
    "Dialect", "HttpGenerateCall", "HttpWorkerClient", "SglangDialect", "SglangHttpClient", "SseLines",
    "http_ssl_context",
]
