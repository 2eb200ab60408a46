"""The memory store keeps copies: what a caller changes after a call never reaches it."""

from __future__ import annotations

import time

from gateway.pipeline.store.base import StoredConversation, StoredItem, StoredResponse
from gateway.pipeline.store.memory import MemoryStore


async def test_records_are_copied_in_and_out() -> None:
    store = MemoryStore()
    rec = StoredResponse("resp_1", "k", time.time(), {"status": "completed"}, [{"type": "message"}])
    await store.put_response(rec)
    rec.body["status"] = "changed by the caller"
    got = await store.get_response("k", "resp_1")
    assert got is not None and got.body["status"] == "completed"
    got.body["status"] = "changed again"
    again = await store.get_response("k", "resp_1")
    assert again is not None and again.body["status"] == "completed"

    await store.put_conversation(StoredConversation("conv_1", "k", time.time()))
    item = StoredItem("msg_1", "conv_1", "k", time.time(), {"text": "a"})
    [stored] = await store.add_items([item])
    item.item["text"] = "b"
    assert stored.seq > 0 and item.seq == 0  # the caller's object is not the stored one
    got_item = await store.get_item("k", "conv_1", "msg_1")
    assert got_item is not None and got_item.item == {"text": "a"}
