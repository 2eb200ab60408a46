"""The ``Store`` contract, run on every backend (memory, SQLite, PostgreSQL): round trips,
owner scoping, conversation order and paging, deletes, retention."""

from __future__ import annotations

import time

from gateway.pipeline.store.base import Store, StoredConversation, StoredItem, StoredResponse


def _response(rid: str, owner: str = "k1", created: float | None = None, **kw: object) -> StoredResponse:
    return StoredResponse(
        id=rid, owner=owner, created_at=time.time() if created is None else created,
        body={"id": rid, "object": "response", "status": "completed", "output": [{"type": "message", "id": "msg_1"}]},
        input_items=[{"type": "message", "role": "user", "content": "héllo"}],
        output_token_ids={"msg_1": [1, 2, 3, 151643]}, **kw,  # type: ignore[arg-type]
    )


def _item(iid: str, conv: str, owner: str = "k1", text: str = "x") -> StoredItem:
    return StoredItem(
        id=iid, conversation_id=conv, owner=owner, created_at=time.time(),
        item={"id": iid, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    )


async def test_response_round_trip_and_update(store: Store) -> None:
    rec = _response("resp_a", previous_response_id="resp_0", conversation_id="conv_1")
    await store.put_response(rec)
    got = await store.get_response("k1", "resp_a")
    assert got == rec
    rec.body["status"] = "cancelled"
    rec.output_token_ids = {"msg_1": [9]}
    await store.put_response(rec)
    got = await store.get_response("k1", "resp_a")
    assert got is not None and got.body["status"] == "cancelled" and got.output_token_ids == {"msg_1": [9]}


async def test_responses_are_scoped_to_their_owner(store: Store) -> None:
    await store.put_response(_response("resp_b", owner="k1"))
    assert await store.get_response("k2", "resp_b") is None
    assert not await store.delete_response("k2", "resp_b")
    assert await store.get_response("k1", "resp_b") is not None
    assert await store.delete_response("k1", "resp_b")
    assert await store.get_response("k1", "resp_b") is None
    assert not await store.delete_response("k1", "resp_b")


async def test_conversation_items_keep_order_and_page(store: Store) -> None:
    await store.put_conversation(StoredConversation("conv_a", "k1", time.time(), {"topic": "t"}))
    added = await store.add_items([_item(f"msg_{i}", "conv_a", text=str(i)) for i in range(5)])
    assert [i.id for i in added] == [f"msg_{i}" for i in range(5)]
    assert [i.seq for i in added] == sorted(i.seq for i in added)
    more = await store.add_items([_item("msg_5", "conv_a", text="5")])
    assert more[0].seq > added[-1].seq
    ids = [i.id for i in await store.list_items("k1", "conv_a", limit=100)]
    assert ids == [f"msg_{i}" for i in range(6)]
    assert [i.id for i in await store.list_items("k1", "conv_a", limit=2)] == ["msg_0", "msg_1"]
    assert [i.id for i in await store.list_items("k1", "conv_a", after="msg_1", limit=2)] == ["msg_2", "msg_3"]
    assert [i.id for i in await store.list_items("k1", "conv_a", order="desc", limit=2)] == ["msg_5", "msg_4"]
    assert [i.id for i in await store.list_items("k1", "conv_a", order="desc", after="msg_4", limit=2)] == ["msg_3", "msg_2"]
    got = await store.get_item("k1", "conv_a", "msg_3")
    assert got is not None and got.item["content"][0]["text"] == "3"
    assert await store.list_items("k2", "conv_a") == []
    assert await store.get_item("k2", "conv_a", "msg_3") is None


async def test_conversation_update_and_deletes(store: Store) -> None:
    await store.put_conversation(StoredConversation("conv_b", "k1", time.time(), {"a": "1"}))
    assert await store.get_conversation("k2", "conv_b") is None
    await store.put_conversation(StoredConversation("conv_b", "k1", time.time(), {"a": "2"}))
    conv = await store.get_conversation("k1", "conv_b")
    assert conv is not None and conv.metadata == {"a": "2"}
    item = StoredItem("msg_x", "conv_b", "k1", time.time(), {"type": "message"}, token_ids=[5, 6])
    await store.add_items([item, _item("msg_y", "conv_b")])
    got = await store.get_item("k1", "conv_b", "msg_x")
    assert got is not None and got.token_ids == [5, 6]
    assert not await store.delete_item("k2", "conv_b", "msg_x")
    assert await store.delete_item("k1", "conv_b", "msg_x")
    assert [i.id for i in await store.list_items("k1", "conv_b")] == ["msg_y"]
    assert not await store.delete_conversation("k2", "conv_b")
    assert await store.delete_conversation("k1", "conv_b")
    assert await store.get_conversation("k1", "conv_b") is None
    assert await store.get_item("k1", "conv_b", "msg_y") is None


async def test_prune_deletes_only_what_is_older(store: Store) -> None:
    now = time.time()
    await store.put_response(_response("resp_old", created=now - 100))
    await store.put_response(_response("resp_new", created=now))
    await store.put_conversation(StoredConversation("conv_old", "k1", now - 100))
    await store.add_items([_item("msg_o", "conv_old")])
    await store.put_conversation(StoredConversation("conv_new", "k1", now))
    assert await store.prune(now - 50) == 2
    assert await store.get_response("k1", "resp_old") is None
    assert await store.get_response("k1", "resp_new") is not None
    assert await store.get_conversation("k1", "conv_old") is None
    assert await store.get_item("k1", "conv_old", "msg_o") is None
    assert await store.get_conversation("k1", "conv_new") is not None


async def test_event_journal(store: Store) -> None:
    await store.put_response(_response("resp_j"))
    await store.append_events("k1", "resp_j", [(0, {"type": "a"}), (1, {"type": "b"})])
    await store.append_events("k1", "resp_j", [(1, {"type": "b"}), (2, {"type": "c"})])  # a batch written twice keeps one copy
    assert [s for s, _ in await store.list_events("k1", "resp_j")] == [0, 1, 2]
    assert await store.list_events("k1", "resp_j", after=0, limit=1) == [(1, {"type": "b"})]
    assert await store.list_events("k2", "resp_j") == []
    assert await store.delete_response("k1", "resp_j")
    assert await store.list_events("k1", "resp_j") == []


async def test_heartbeat(store: Store) -> None:
    await store.put_response(_response("resp_h"))
    assert (await store.get_response("k1", "resp_h")).heartbeat is None  # type: ignore[union-attr]
    await store.touch_response("k2", "resp_h", 5.0)  # another key's touch changes nothing
    assert (await store.get_response("k1", "resp_h")).heartbeat is None  # type: ignore[union-attr]
    await store.touch_response("k1", "resp_h", 7.5)
    rec = await store.get_response("k1", "resp_h")
    assert rec is not None and rec.heartbeat == 7.5
    await store.put_response(rec)  # a body update keeps the heartbeat
    assert (await store.get_response("k1", "resp_h")).heartbeat == 7.5  # type: ignore[union-attr]


async def test_runs_to_continue_and_their_claim(store: Store) -> None:
    now = time.time()
    await store.put_response(_response("resp_r", created=now - 100))
    await store.put_run("k1", "resp_r", {"request": {"input": "x"}}, "p1")
    assert await store.save_generated("k1", "resp_r", [4, 5, 6], "p1")
    assert await store.get_run("k1", "resp_r") == ({"request": {"input": "x"}}, [4, 5, 6])
    assert await store.get_run("k2", "resp_r") is None
    await store.touch_response("k1", "resp_r", now - 30)
    assert await store.claim_stale(now - 60, now, "p2") == []  # beat 30 s ago: alive
    assert await store.claim_stale(now - 10, now, "p2") == [("k1", "resp_r")]
    assert await store.claim_stale(now - 10, now + 1, "p3") == []  # claimed: its beat is now
    assert not await store.save_generated("k1", "resp_r", [4, 5, 6, 7], "p1")  # p1 lost it: it must stop
    assert await store.save_generated("k1", "resp_r", [4, 5, 6, 7], "p2")
    await store.end_run("k1", "resp_r")
    assert await store.get_run("k1", "resp_r") is None
    assert await store.claim_stale(now + 100, now + 100, "p2") == []
