"""Admin endpoints: the worker registry over HTTP, loads and cache flush fanned out to
workers. (``/admin/inspect``, what the router sees in a prompt, costs a tokenization
and takes an admission slot: it runs on the inference path, ``inference_routes``.)

Mutations (``POST /workers``, ``DELETE /workers/{id}``, ``POST /flush_cache``) need
the admin key; so do the read-only views (``GET /workers``, ``GET /get_loads``), which
name the fleet's hosts and ports (the gRPC door's rule too). Secrets (worker API keys) never appear in any answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from fastapi import APIRouter
from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from gateway.protocol.errors import GatewayError, InvalidRequestError, NotFoundError, WorkerError
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import (
    JSONResponse,
    buffer_body,
    error_response,
    parse_model,
    read_json,
)
from gateway.tokenization.errors import TokenizationError
from gateway.workers.client import BadWorkerUrl
from gateway.workers.registry import MAX_DP_SIZE, WorkerRegistrationError
from gateway.workers.transport import WorkerCallError
from gateway.workers.worker import ROLES, Worker, one_per_engine

log = logging.getLogger(__name__)

_ADMIN_BODY_BYTES = 64 * 1024


class AddWorkerRequest(BaseModel):
    """``POST /workers`` body."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=512)
    role: str | None = Field(default=None, description="regular, prefill or decode (default: what the worker reports)")
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    model: str | None = Field(default=None, max_length=512, description="expected served model name")
    api_key: str | None = Field(default=None, max_length=4096, description="bearer token for this worker")
    engine: Literal["auto", "sglang", "vllm", "trtllm", "openai"] = Field(
        default="auto",
        description="the engine behind the URL, gRPC or HTTP (auto: detected from what answers; openai: an external"
        " OpenAI-compatible endpoint, requests forwarded unchanged, api_key sent to it)",
    )
    dp_size: int | None = Field(
        default=None, ge=1, le=MAX_DP_SIZE,
        description="data-parallel ranks behind the URL, one routing target each (default: what the worker reports)",
    )


class FlushCacheRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=0.0, ge=0.0, le=600.0)


def _rpc_failure(exc: BaseException) -> str:
    if isinstance(exc, WorkerCallError):
        return f"{exc.code.name}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def admin_router(door: HttpDoor) -> APIRouter:
    app = APIRouter()
    state = door.state
    auth = state.auth

    def _described(worker: Worker) -> dict[str, object]:
        """The worker's view, with its KV-event feed's counters when it has one."""
        body = worker.describe()
        feed = state.kv_events.feeds.get(worker.id) if state.kv_events is not None else None
        if feed is not None:
            body["kv_events"] = feed.describe()
        return body

    async def guarded(request: Request, check: Any, work: Any) -> Response:
        try:
            check(request.headers)
            return await work()
        except GatewayError as exc:
            return error_response(exc)

    @app.get("/workers")
    async def list_workers(request: Request) -> Response:
        async def work() -> Response:
            # Each model's facts name their source (pipeline.model_facts): what a worker
            # reports in GetModelInfo is shown under its own "reported", never used.
            return JSONResponse({
                "workers": [_described(w) for w in state.registry.all()],
                "models": [e.describe() for e in state.catalog.entries()],
            })

        return await guarded(request, auth.reader, work)

    @app.get("/workers/{worker_id:path}")
    async def get_worker(request: Request, worker_id: str) -> Response:
        async def work() -> Response:
            worker = state.registry.get(worker_id)
            if worker is None:
                raise NotFoundError(f"no worker {worker_id!r}")
            return JSONResponse(_described(worker))

        return await guarded(request, auth.reader, work)

    @app.post("/workers")
    async def add_worker(request: Request) -> Response:
        async def work() -> Response:
            req = parse_model(AddWorkerRequest, await read_json(request, _ADMIN_BODY_BYTES))
            if req.role is not None and req.role not in ROLES:
                raise InvalidRequestError(f"role must be one of {', '.join(ROLES)}", param="role")
            known = state.registry.get(req.url)
            existed = known is not None and not known.draining
            try:
                worker = await state.add_worker(
                    req.url, role=req.role, bootstrap_port=req.bootstrap_port,
                    api_key=req.api_key, model=req.model, engine=req.engine, dp_size=req.dp_size,
                )
            except BadWorkerUrl as exc:
                raise InvalidRequestError(str(exc), param="url") from None
            except WorkerRegistrationError as exc:
                raise WorkerError(f"registration failed: {exc}", code="worker_registration_failed") from None
            except (OSError, ValueError, TokenizationError) as exc:
                raise WorkerError(
                    f"registration failed: could not load the tokenizer: {exc}",
                    code="worker_registration_failed",
                ) from None
            body = worker.describe()
            body["ranks"] = [w.id for w in state.registry.ranks(worker)]
            body["created"] = not existed
            body["registration"] = (
                ["already registered"]
                if existed
                else ["probed GetModelInfo, GetServerInfo and HealthCheck", f"tokenizer for {worker.model!r} ready", "in rotation"]
            )
            log.info("worker %s %s via admin API", worker.id, "kept" if existed else "registered")
            return JSONResponse(body, status_code=200 if existed else 201)

        return await guarded(request, auth.admin, work)

    @app.delete("/workers/{worker_id:path}")
    async def remove_worker(request: Request, worker_id: str) -> Response:
        async def work() -> Response:
            if state.registry.get(worker_id) is None:
                raise NotFoundError(f"no worker {worker_id!r}")
            worker = await state.remove_worker(worker_id)
            body = worker.describe()
            body["removed"] = True
            return JSONResponse(body)

        return await guarded(request, auth.admin, work)

    async def fan_out(call: Any, workers: list[Worker]) -> list[tuple[Worker, Any]]:
        results = await asyncio.gather(*(call(w) for w in workers), return_exceptions=True)
        return list(zip(workers, results, strict=True))

    @app.get("/get_loads")
    async def get_loads(request: Request) -> Response:
        async def work() -> Response:
            workers = one_per_engine([w for w in state.registry.all() if not w.draining])
            out: list[dict[str, Any]] = []
            for worker, result in await fan_out(lambda w: w.client.loads(timeout=5.0), workers):
                row: dict[str, Any] = {"id": worker.engine_id, "url": worker.url, "role": worker.role}
                if isinstance(result, BaseException):
                    row["error"] = _rpc_failure(result)
                else:
                    row["loads"] = MessageToDict(result, preserving_proto_field_name=True)
                out.append(row)
            return JSONResponse({"workers": out})

        return await guarded(request, auth.reader, work)

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        async def work() -> Response:
            raw = await buffer_body(request, _ADMIN_BODY_BYTES)
            req = parse_model(FlushCacheRequest, await read_json(request, _ADMIN_BODY_BYTES)) if raw.strip() else FlushCacheRequest()
            workers = one_per_engine([w for w in state.registry.all() if not w.draining])
            out: list[dict[str, Any]] = []
            timeout = req.timeout_s + 10.0
            for worker, result in await fan_out(lambda w: w.client.flush_cache(req.timeout_s, timeout=timeout), workers):
                row: dict[str, Any] = {"id": worker.engine_id, "url": worker.url}
                if isinstance(result, BaseException):
                    row.update(success=False, message=_rpc_failure(result))
                else:
                    row.update(success=bool(result.success), message=result.message)
                out.append(row)
            ok = all(r["success"] for r in out)
            if ok:
                # The workers' caches are empty now; the policies' guesses must forget too.
                state.router.reset_policies()
            return JSONResponse({"success": ok, "workers": out})

        return await guarded(request, auth.admin, work)

    return app
