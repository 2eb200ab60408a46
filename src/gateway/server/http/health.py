"""Liveness and readiness probes: ``/health`` (the process answers) and ``/readiness`` (it can serve)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.protocol.errors import ServiceUnavailableError
from gateway.server.http.util import JSONResponse, error_response
from gateway.server.state import GatewayState


def health_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        if state.process_set is not None:  # one of serve --processes N: speak for the set
            return JSONResponse({"status": "ok", "processes": state.process_set.describe()})
        return JSONResponse({"status": "ok"})

    @router.get("/readiness")
    async def readiness() -> Response:
        available = [w for w in state.registry.all() if w.available]
        pending = state.late.describe()  # listed workers not up yet, retried in the background
        models = state.model_names()
        if not available or not models:
            waiting = f"; waiting for {', '.join(p['url'] for p in pending)}" if pending else ""
            return error_response(ServiceUnavailableError(f"no available worker{waiting}"))
        body: dict[str, object] = {"status": "ready", "workers": len(available), "models": models}
        if pending:
            body["pending_workers"] = pending
        return JSONResponse(body)

    return router
