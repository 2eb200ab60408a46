"""The Conversations API's operations as every front door calls them: one path per API.

The HTTP routes (``/v1/conversations``...) and the gRPC calls (``CreateConversation``...)
hand over a request body as JSON-shaped data and a context; this parses it with the
HTTP API's models, checks the list calls' paging (``responses_entry.paging``) and runs
``endpoints.conversations`` over the store (opened on first use), so both doors answer
the same way and keep the same objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.endpoints import conversations as route
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import Store
from gateway.protocol.responses_api import ConversationCreate, ConversationUpdate, ItemsCreate
from gateway.server.http.util import parse_model
from gateway.server.responses_entry import paging


class ConversationsEntry:
    """Create, retrieve, update, delete conversations; add, list, get, delete their items."""

    def __init__(self, store: Callable[[], Awaitable[Store]]) -> None:
        self._store = store  # an awaitable factory: ``History.store``

    async def create(self, ctx: RequestContext, body: Any) -> dict[str, Any]:
        return await route.create(await self._store(), parse_model(ConversationCreate, body), ctx)

    async def retrieve(self, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
        return await route.retrieve(await self._store(), ctx, conversation_id)

    async def update(self, ctx: RequestContext, conversation_id: str, body: Any) -> dict[str, Any]:
        return await route.update(await self._store(), parse_model(ConversationUpdate, body), ctx, conversation_id)

    async def delete(self, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
        return await route.delete(await self._store(), ctx, conversation_id)

    async def add_items(self, ctx: RequestContext, conversation_id: str, body: Any) -> dict[str, Any]:
        return await route.add_items(await self._store(), parse_model(ItemsCreate, body), ctx, conversation_id)

    async def list_items(
        self, ctx: RequestContext, conversation_id: str, *, after: str | None, limit: str | int | None, order: str | None,
    ) -> dict[str, Any]:
        after, count, order = paging(after, limit, order)
        return await route.list_items(await self._store(), ctx, conversation_id, after=after, limit=count, order=order)

    async def get_item(self, ctx: RequestContext, conversation_id: str, item_id: str) -> dict[str, Any]:
        return await route.get_item(await self._store(), ctx, conversation_id, item_id)

    async def delete_item(self, ctx: RequestContext, conversation_id: str, item_id: str) -> dict[str, Any]:
        return await route.delete_item(await self._store(), ctx, conversation_id, item_id)
