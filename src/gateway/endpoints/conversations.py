"""/v1/conversations and their items: the OpenAI Conversations API over the store.

A conversation is an ordered list of items (messages, function calls and outputs,
reasoning) that ``/v1/responses`` with ``conversation`` reads as its context and
appends its turn to. Everything is scoped to the caller's API key.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.endpoints.response_history import owner_of, with_ids
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import Store, StoredConversation, StoredItem
from gateway.protocol.errors import NotFoundError
from gateway.protocol.ids import random_hex
from gateway.protocol.responses_api import ConversationCreate, ConversationUpdate, ItemsCreate


def _body(conv: StoredConversation) -> dict[str, Any]:
    return {"id": conv.id, "object": "conversation", "created_at": int(conv.created_at), "metadata": conv.metadata}


def _list(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list", "data": items, "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None, "has_more": has_more,
    }


async def _conversation(store: Store, ctx: RequestContext, conversation_id: str) -> StoredConversation:
    conv = await store.get_conversation(owner_of(ctx), conversation_id)
    if conv is None:
        raise NotFoundError(f"conversation {conversation_id!r} not found", param="conversation_id")
    return conv


async def _add(store: Store, ctx: RequestContext, conversation_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    now = time.time()
    stored = await store.add_items([
        StoredItem(id=i["id"], conversation_id=conversation_id, owner=owner_of(ctx), created_at=now, item=i)
        for i in with_ids(items)
    ])
    return [s.item for s in stored]


async def create(store: Store, req: ConversationCreate, ctx: RequestContext) -> dict[str, Any]:
    conv = StoredConversation(f"conv_{random_hex()}", owner_of(ctx), time.time(), req.metadata or {})
    await store.put_conversation(conv)
    if req.items:
        await _add(store, ctx, conv.id, req.items)
    return _body(conv)


async def retrieve(store: Store, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
    return _body(await _conversation(store, ctx, conversation_id))


async def update(store: Store, req: ConversationUpdate, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
    conv = await _conversation(store, ctx, conversation_id)
    conv.metadata = req.metadata
    await store.put_conversation(conv)
    return _body(conv)


async def delete(store: Store, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
    if not await store.delete_conversation(owner_of(ctx), conversation_id):
        raise NotFoundError(f"conversation {conversation_id!r} not found", param="conversation_id")
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


async def add_items(store: Store, req: ItemsCreate, ctx: RequestContext, conversation_id: str) -> dict[str, Any]:
    await _conversation(store, ctx, conversation_id)
    return _list(await _add(store, ctx, conversation_id, req.items), False)


async def list_items(
    store: Store, ctx: RequestContext, conversation_id: str, *, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    await _conversation(store, ctx, conversation_id)
    got = await store.list_items(owner_of(ctx), conversation_id, after=after, limit=limit + 1, order="desc" if order == "desc" else "asc")
    return _list([i.item for i in got[:limit]], len(got) > limit)


async def get_item(store: Store, ctx: RequestContext, conversation_id: str, item_id: str) -> dict[str, Any]:
    item = await store.get_item(owner_of(ctx), conversation_id, item_id)
    if item is None:
        raise NotFoundError(f"item {item_id!r} not found in conversation {conversation_id!r}", param="item_id")
    return item.item


async def delete_item(store: Store, ctx: RequestContext, conversation_id: str, item_id: str) -> dict[str, Any]:
    conv = await _conversation(store, ctx, conversation_id)
    if not await store.delete_item(owner_of(ctx), conversation_id, item_id):
        raise NotFoundError(f"item {item_id!r} not found in conversation {conversation_id!r}", param="item_id")
    return _body(conv)
