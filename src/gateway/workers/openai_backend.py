"""External OpenAI-compatible endpoints as workers (``--backend openai``, SMG's name).

Such an endpoint (a hosted API, or any server that speaks OpenAI's HTTP API) takes text,
not token ids, and caches nothing the gateway can see: requests go to it unchanged
(``forward``: the client's own body, its answer streamed back as it comes), with the
worker's own API key as the ``Authorization`` header. ``token_ids`` in ``lacks`` says so
in GET /workers; the gateway routes its requests on load only (``pipeline/text_relay``)
and never sends it a token-id Generate (that fails as UNIMPLEMENTED, naming why).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.http_errors import transport_error
from gateway.workers.reply_bound import FORWARDED_ANSWER_BYTES, ReplyTooLarge
from gateway.workers.sglang_http import HttpWorkerClient
from gateway.workers.transport import CallCode, RefusedCall, WorkerCallError

# Paths a client's request may be forwarded to, unchanged.
FORWARDED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class Upstream:
    """One forwarded request's answer: its status and content type as the endpoint sent
    them, and its body as it arrives (a failure below HTTP is a ``WorkerCallError``, and
    ``failed`` remembers it for the worker's breaker)."""

    __slots__ = ("_response", "content_type", "failed", "limit", "on_data", "status")

    def __init__(self, response: aiohttp.ClientResponse, limit: int = FORWARDED_ANSWER_BYTES) -> None:
        self._response = response
        self.limit = limit  # bytes of a whole answer (``read``)
        self.status = response.status
        self.content_type = response.headers.get("content-type", "application/json")
        self.failed = False
        self.on_data: Callable[[], None] | None = None  # told of each piece (the worker's progress)

    @property
    def streaming(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
                if self.on_data is not None:
                    self.on_data()
                yield data
        except aiohttp.ClientError as exc:
            self.failed = True
            raise transport_error(exc) from None

    async def read(self) -> bytes:
        """The whole answer; past ``limit`` bytes it is the endpoint's fault (``ReplyTooLarge``),
        found from its Content-Length or as the bytes arrive, before more of it is held."""
        limit = self.limit
        length = self._response.content_length
        if length is not None and length > limit:
            self.failed = True
            raise ReplyTooLarge(length, limit)
        parts: list[bytes] = []
        size = 0
        try:
            async for data in self._response.content.iter_any():
                size += len(data)
                if size > limit:
                    self.failed = True
                    raise ReplyTooLarge(None, limit)
                parts.append(data)
        except aiohttp.ClientError as exc:
            self.failed = True
            raise transport_error(exc) from None
        return b"".join(parts)

    def close(self) -> None:
        """Let go of the connection (closing it when the body was not read to its end)."""
        self._response.close()


class OpenAiBackendClient(HttpWorkerClient):
    """The worker seam over one external OpenAI-compatible endpoint (text in, text out)."""

    kind = "openai/http"
    engine = "an OpenAI-compatible endpoint"
    lacks = HttpWorkerClient.lacks | {"token_ids", "abort", "loads", "flush_cache", "cache_aware"}

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.models: tuple[str, ...] = ()  # what the endpoint lists on /v1/models

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> RefusedCall:  # type: ignore[override]
        return RefusedCall(WorkerCallError(
            CallCode.UNIMPLEMENTED, f"the OpenAI backend at {self.url} takes text requests only, not token ids",
        ))

    async def forward(self, path: str, body: bytes, request_id: str | None = None) -> Upstream:
        """Send the client's ``body`` to ``path`` as it is; the answer's head is back when
        this returns (the caller reads the body and closes it)."""
        if path not in FORWARDED_PATHS:
            raise WorkerCallError(CallCode.UNIMPLEMENTED, f"{path} is not forwarded to OpenAI backends")
        try:
            response = await self._http.post(path, data=body, headers=self._headers(request_id))
        except aiohttp.ClientError as exc:
            raise transport_error(exc) from None
        except TimeoutError:
            raise WorkerCallError(CallCode.DEADLINE_EXCEEDED, f"{path}: the endpoint did not answer") from None
        return Upstream(response)

    async def _model_ids(self, timeout: float) -> tuple[str, ...]:
        listing = await self._get_json("/v1/models", timeout)
        data = listing.get("data") if isinstance(listing, dict) else None
        ids = tuple(str(m["id"]) for m in data or () if isinstance(m, dict) and m.get("id"))
        if not ids:
            raise WorkerCallError(CallCode.INTERNAL, "/v1/models lists no model")
        self.models = ids
        return ids

    async def model_info(self, *, timeout: float = 5.0) -> pb.GetModelInfoResponse:
        first = (await self._model_ids(timeout))[0]
        return pb.GetModelInfoResponse(model_path=first, served_model_name=first, is_generation=True)

    async def server_info(self, *, timeout: float = 5.0) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(server_type="openai")

    async def health_check(self, *, timeout: float = 5.0) -> pb.HealthCheckResponse:
        """An endpoint that lists its models answers; a hosted API has no /health."""
        try:
            await self._model_ids(timeout)
        except WorkerCallError as exc:
            return pb.HealthCheckResponse(healthy=False, message=f"/v1/models: {exc.code.name}: {exc.message}")
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        return False  # closing the forwarded request is its only abort

    async def loads(self, *, timeout: float = 2.0, include: Sequence[str] = ("core",)) -> pb.GetLoadsResponse:
        raise WorkerCallError(CallCode.UNIMPLEMENTED, f"{self.engine} reports no loads")

    async def flush_cache(self, timeout_s: float = 0.0, *, timeout: float = 30.0) -> common_pb2.FlushCacheResponse:
        return common_pb2.FlushCacheResponse(success=False, message=f"{self.engine} has no cache to flush")


__all__ = ["FORWARDED_PATHS", "OpenAiBackendClient", "Upstream"]
