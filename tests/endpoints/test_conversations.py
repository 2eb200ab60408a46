"""The Conversations API over a store: objects, items, order, paging and key scoping."""

from __future__ import annotations

import pytest

from gateway.endpoints import conversations as conv
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.memory import MemoryStore
from gateway.protocol.errors import NotFoundError
from gateway.protocol.responses_api import ConversationCreate, ConversationUpdate, ItemsCreate

ME, OTHER = RequestContext(api_key_id="k1"), RequestContext(api_key_id="k2")


async def test_life_of_a_conversation() -> None:
    store = MemoryStore()
    made = await conv.create(store, ConversationCreate.model_validate({"metadata": {"a": "1"}, "items": [{"role": "user", "content": "one"}]}), ME)
    cid = made["id"]
    assert made["object"] == "conversation" and made["metadata"] == {"a": "1"}
    added = await conv.add_items(store, ItemsCreate.model_validate({"items": [{"role": "user", "content": "two"}, {"role": "assistant", "content": "three"}]}), ME, cid)
    assert [i["content"][0]["type"] for i in added["data"]] == ["input_text", "output_text"]
    first = await conv.list_items(store, ME, cid, after=None, limit=2, order="asc")
    assert [i["content"][0]["text"] for i in first["data"]] == ["one", "two"] and first["has_more"]
    rest = await conv.list_items(store, ME, cid, after=first["last_id"], limit=2, order="asc")
    assert [i["content"][0]["text"] for i in rest["data"]] == ["three"] and not rest["has_more"]
    assert (await conv.update(store, ConversationUpdate.model_validate({"metadata": {"b": "2"}}), ME, cid))["metadata"] == {"b": "2"}
    item_id = rest["data"][0]["id"]
    assert (await conv.get_item(store, ME, cid, item_id))["role"] == "assistant"
    assert (await conv.delete_item(store, ME, cid, item_id))["id"] == cid
    with pytest.raises(NotFoundError):
        await conv.get_item(store, ME, cid, item_id)
    assert (await conv.delete(store, ME, cid)) == {"id": cid, "object": "conversation.deleted", "deleted": True}
    with pytest.raises(NotFoundError):
        await conv.retrieve(store, ME, cid)


async def test_another_key_sees_nothing() -> None:
    store = MemoryStore()
    cid = (await conv.create(store, ConversationCreate(), ME))["id"]
    for call in (
        conv.retrieve(store, OTHER, cid),
        conv.list_items(store, OTHER, cid, after=None, limit=5, order="asc"),
        conv.add_items(store, ItemsCreate.model_validate({"items": [{"role": "user", "content": "x"}]}), OTHER, cid),
        conv.delete(store, OTHER, cid),
    ):
        with pytest.raises(NotFoundError):
            await call
    assert (await conv.retrieve(store, ME, cid))["id"] == cid
