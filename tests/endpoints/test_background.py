"""Background runs' readers: replay from the store after ``starting_after``, exactly once,
and the end a reader writes for a run whose process stopped beating."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gateway.endpoints import background as bg
from gateway.endpoints.background import Alignment, BackgroundRuns, Journal
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import StoredResponse
from gateway.protocol.errors import InvalidRequestError, NotFoundError
from gateway.server.config import GatewayConfig
from gateway.server.state import GatewayState

CTX = RequestContext(api_key_id="k")


@pytest.fixture
async def state() -> AsyncIterator[GatewayState]:
    config = GatewayConfig()
    config.history.history_backend = "memory"
    config.history.history_stale_s = 0.5
    made = GatewayState(config)
    try:
        yield made
    finally:
        made.engine.close()
        await made.history.close()


async def _put(state: GatewayState, rid: str, status: str, *, background: bool = True, heartbeat: float | None = None) -> None:
    store = await state.history.store()
    await store.put_response(StoredResponse(rid, "k", time.time(), {"id": rid, "status": status, "background": background}, []))
    if heartbeat is not None:
        await store.touch_response("k", rid, heartbeat)


async def test_replay_after_starting_after_until_the_last_event(state: GatewayState) -> None:
    await _put(state, "resp_a", "completed")
    store = await state.history.store()
    events = [{"type": "response.output_text.delta", "sequence_number": n} for n in range(4)]
    events.append({"type": "response.completed", "sequence_number": 4})
    await store.append_events("k", "resp_a", [(e["sequence_number"], e) for e in events])
    got = [e["sequence_number"] async for e in await state.background.replay(CTX, "resp_a", 1)]
    assert got == [2, 3, 4]


async def test_a_run_that_cannot_be_continued_ends_failed_once_for_every_reader(state: GatewayState, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bg, "POLL_S", 0.01)
    await _put(state, "resp_b", "in_progress", heartbeat=time.time() - 60)
    store = await state.history.store()
    await store.append_events("k", "resp_b", [(0, {"type": "response.created", "sequence_number": 0})])
    first = [e async for e in await state.background.replay(CTX, "resp_b", -1)]
    assert [e["type"] for e in first] == ["response.created", "response.failed"]
    second = [e async for e in await state.background.replay(CTX, "resp_b", 0)]
    assert second == first[1:]
    rec = await store.get_response("k", "resp_b")
    assert rec is not None and rec.body["status"] == "failed"


async def test_replay_refuses_what_is_not_a_background_response(state: GatewayState) -> None:
    await _put(state, "resp_c", "completed", background=False)
    with pytest.raises(InvalidRequestError):
        await state.background.replay(CTX, "resp_c", -1)
    with pytest.raises(NotFoundError):
        await state.background.replay(RequestContext(api_key_id="other"), "resp_c", -1)


async def test_a_live_journal_is_read_from_memory(state: GatewayState) -> None:
    runs: BackgroundRuns = state.background
    await _put(state, "resp_d", "in_progress", heartbeat=time.time())
    journal = runs.live["resp_d"] = Journal("k")
    await journal.add([{"type": "x", "sequence_number": n} for n in range(3)])
    await journal.add([{"type": "response.completed", "sequence_number": 3}], close=True)
    got = [e["sequence_number"] async for e in await runs.replay(CTX, "resp_d", 0)]
    assert got == [1, 2, 3]


def test_alignment_sends_only_what_was_not_journaled() -> None:
    journaled = [
        {"type": "response.created", "sequence_number": 0},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": {"id": "msg_1"}},
        {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1", "delta": "Hel"},
        {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_1", "delta": "lo w"},
    ]
    align = Alignment(journaled)
    assert align.item_ids == ["msg_1"]
    recomputed = [
        {"type": "response.created", "sequence_number": 0},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": {"id": "msg_1"}},
        {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1", "delta": "Hello"},  # all journaled
        {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_1", "delta": " world"},
        {"type": "response.output_text.done", "sequence_number": 4, "item_id": "msg_1", "text": "Hello world"},
    ]
    out = [e for e in (align.align(e) for e in recomputed) if e is not None]
    assert [(e["type"], e.get("delta"), e["sequence_number"]) for e in out] == [
        ("response.output_text.delta", "orld", 4), ("response.output_text.done", None, 5),
    ]
    assert "".join(e["delta"] for e in journaled[2:]) + out[0]["delta"] == "Hello world"
