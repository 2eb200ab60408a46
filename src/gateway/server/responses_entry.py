"""The Responses API's operations as every front door calls them: one path per API.

The HTTP door (``POST /v1/responses`` on the inference path, the ``/v1/responses/{id}``
routes) and the gRPC door (``CreateResponse``, ``StreamResponse``, ``GetResponse``...)
only parse, authenticate and frame; what a call means is decided here once: which
admission a create holds (the request's own slot, or, for a background run that
outlives its request, a slot of the run's own and nothing more), how a stored
response's events are replayed, and the rules of the list calls' paging.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.endpoints.background import BackgroundRuns
from gateway.endpoints.events import Answer, Events
from gateway.endpoints.responses import ResponsesApi
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.responses_api import ResponsesRequest
from gateway.server.admission import Admission

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def paging(after: str | None, limit: str | int | None, order: str | None) -> tuple[str | None, int, str]:
    """A list call's ``after``, ``limit`` (1-100, default 20) and ``order`` (default ``desc``),
    checked the same way whichever door they came through."""
    raw = str(DEFAULT_LIMIT if limit is None else limit)
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequestError(f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    order = order or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
    return after or None, int(raw), order


class ResponsesEntry:
    """Create, retrieve, replay, delete, cancel and list input items of responses."""

    def __init__(self, api: ResponsesApi, background: BackgroundRuns, admission: Admission) -> None:
        self.api = api
        self.background = background
        self.admission = admission

    async def create(self, req: ResponsesRequest, ctx: RequestContext, *, sse: bool) -> Answer | Events:
        """A response: whole, its started stream's events (``sse``: already framed as SSE
        bytes; else the event objects), or a background run's first body.

        The door defers admission to here (``ctx.admit``): a request that runs to its end
        takes one slot for its whole life; a background run takes one that it holds until
        it ends, and the request itself takes none."""
        if not req.background:
            await ctx.reserve(1)
            return await self.api.open(req, ctx, sse=sse)
        if req.stream:
            raise InvalidRequestError("stream a background response by its id (starting_after replays it)", param="stream")
        ctx.admit = None
        ticket = await self.admission.acquire(ctx.api_key_id, 1, ctx.priority or 0)
        try:
            return await self.background.start(req, ctx, on_end=ticket.release)
        except BaseException:
            ticket.release()
            raise

    async def retrieve(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        return await self.api.retrieve(ctx, response_id)

    async def replay(self, ctx: RequestContext, response_id: str, starting_after: int = -1) -> AsyncIterator[dict[str, Any]]:
        """A background response's stream events after ``starting_after``, then its run's
        next ones until its last (errors before the first event raise here)."""
        return await self.background.replay(ctx, response_id, starting_after)

    async def delete(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        return await self.api.delete(ctx, response_id)

    async def cancel(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        return await self.api.cancel(ctx, response_id)

    async def input_items(
        self, ctx: RequestContext, response_id: str, *, after: str | None, limit: str | int | None, order: str | None,
    ) -> dict[str, Any]:
        after, count, order = paging(after, limit, order)
        return await self.api.input_items(ctx, response_id, after=after, limit=count, order=order)
