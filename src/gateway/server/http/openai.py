"""OpenAI's ``GET /v1/models`` (its POST routes run on the inference path, ``inference_routes``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.pipeline.request_context import RequestContext
from gateway.protocol.responses import ModelCard, ModelList
from gateway.server.http.door import HttpDoor


def openai_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    state = door.state

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            cards = [
                ModelCard(
                    id=e.name, root=e.name, max_model_len=e.max_context_length or None,
                    tool_call_parser=e.tool_call_parser, reasoning_parser=e.reasoning_parser,
                )
                for e in state.catalog.entries()
            ]
            known = {c.id for c in cards}  # models of text-only workers (OpenAI backends), as they list them
            cards += [ModelCard(id=m, root=m) for m in state.text_relay.models() if m not in known]
            return ModelList(data=cards).to_dict()

        return await door.handle(request, run)

    return router
