"""The Conversations entry both doors share, over the memory store: bodies are parsed with
the HTTP API's models, paging is checked, and objects are scoped to their key."""

from __future__ import annotations

import pytest

from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.memory import MemoryStore
from gateway.protocol.errors import InvalidRequestError, NotFoundError
from gateway.server.conversations_entry import ConversationsEntry


async def test_a_conversation_through_the_entry() -> None:
    store = MemoryStore()

    async def opened() -> MemoryStore:
        return store

    entry = ConversationsEntry(opened)
    mine, other = RequestContext(api_key_id="a"), RequestContext(api_key_id="b")
    conv = await entry.create(mine, {"metadata": {"k": "v"}, "items": [{"role": "user", "content": "hi"}]})
    assert conv["object"] == "conversation" and conv["metadata"] == {"k": "v"}
    page = await entry.list_items(mine, conv["id"], after=None, limit=None, order="asc")
    assert [i["role"] for i in page["data"]] == ["user"] and not page["has_more"]
    added = await entry.add_items(mine, conv["id"], {"items": [{"role": "assistant", "content": "yo"}]})
    assert (await entry.get_item(mine, conv["id"], added["data"][0]["id"]))["role"] == "assistant"
    assert (await entry.update(mine, conv["id"], {"metadata": {}}))["metadata"] == {}
    with pytest.raises(InvalidRequestError):
        await entry.add_items(mine, conv["id"], {"items": []})
    with pytest.raises(InvalidRequestError):
        await entry.list_items(mine, conv["id"], after=None, limit="0", order=None)
    with pytest.raises(NotFoundError):
        await entry.retrieve(other, conv["id"])
    assert (await entry.delete(mine, conv["id"]))["deleted"]
