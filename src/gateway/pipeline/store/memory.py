"""The in-memory store: the contract's reference, for tests and ``--history-backend memory``."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from gateway.pipeline.store.base import Order, Store, StoredConversation, StoredItem, StoredResponse


class MemoryStore(Store):
    """Dicts in this process; nothing survives it. Records are copied in and out, so a
    caller's later change never reaches what is stored (as with a database)."""

    name = "memory"

    def __init__(self) -> None:
        self._responses: dict[str, StoredResponse] = {}
        self._conversations: dict[str, StoredConversation] = {}
        self._items: dict[str, dict[str, StoredItem]] = {}  # conversation id -> item id -> item
        self._seq = itertools.count(1)
        self._events: dict[str, tuple[str, dict[int, dict[str, Any]]]] = {}  # response id -> (owner, seq -> event)
        self._runs: dict[str, tuple[str, dict[str, Any], list[int], str]] = {}  # id -> (owner, spec, generated, runner)

    async def put_response(self, rec: StoredResponse) -> None:
        old = self._responses.get(rec.id)
        stored = copy.deepcopy(rec)
        if old is not None:  # as the SQL upsert: the heartbeat is the runner's alone
            stored.heartbeat = old.heartbeat
        self._responses[rec.id] = stored

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        rec = self._responses.get(response_id)
        return copy.deepcopy(rec) if rec is not None and rec.owner == owner else None

    async def touch_response(self, owner: str, response_id: str, at: float) -> None:
        rec = self._responses.get(response_id)
        if rec is not None and rec.owner == owner:
            rec.heartbeat = at

    async def delete_response(self, owner: str, response_id: str) -> bool:
        rec = self._responses.get(response_id)
        if rec is None or rec.owner != owner:
            return False
        del self._responses[response_id]
        self._events.pop(response_id, None)
        return True

    async def put_conversation(self, rec: StoredConversation) -> None:
        self._conversations[rec.id] = copy.deepcopy(rec)
        self._items.setdefault(rec.id, {})

    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None:
        rec = self._conversations.get(conversation_id)
        return copy.deepcopy(rec) if rec is not None and rec.owner == owner else None

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        rec = self._conversations.get(conversation_id)
        if rec is None or rec.owner != owner:
            return False
        del self._conversations[conversation_id]
        self._items.pop(conversation_id, None)
        return True

    async def add_items(self, items: list[StoredItem]) -> list[StoredItem]:
        out = []
        for item in items:
            stored = copy.deepcopy(item)
            stored.seq = next(self._seq)
            self._items.setdefault(item.conversation_id, {})[item.id] = stored
            out.append(copy.deepcopy(stored))
        return out

    async def list_items(
        self, owner: str, conversation_id: str, *, after: str | None = None, limit: int = 20, order: Order = "asc"
    ) -> list[StoredItem]:
        conv = self._conversations.get(conversation_id)
        if conv is None or conv.owner != owner:
            return []
        items = sorted(self._items.get(conversation_id, {}).values(), key=lambda i: i.seq, reverse=order == "desc")
        if after is not None:
            mark = self._items.get(conversation_id, {}).get(after)
            if mark is not None:
                items = [i for i in items if (i.seq > mark.seq if order == "asc" else i.seq < mark.seq)]
        return [copy.deepcopy(i) for i in items[:limit]]

    async def get_item(self, owner: str, conversation_id: str, item_id: str) -> StoredItem | None:
        item = self._items.get(conversation_id, {}).get(item_id)
        return copy.deepcopy(item) if item is not None and item.owner == owner else None

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        items = self._items.get(conversation_id, {})
        item = items.get(item_id)
        if item is None or item.owner != owner:
            return False
        del items[item_id]
        return True

    async def append_events(self, owner: str, response_id: str, events: list[tuple[int, dict[str, Any]]]) -> None:
        journal = self._events.setdefault(response_id, (owner, {}))[1]
        for seq, event in events:
            journal[seq] = copy.deepcopy(event)

    async def list_events(self, owner: str, response_id: str, *, after: int = -1, limit: int = 1000) -> list[tuple[int, dict[str, Any]]]:
        found = self._events.get(response_id)
        if found is None or found[0] != owner:
            return []
        return [(seq, copy.deepcopy(e)) for seq, e in sorted(found[1].items()) if seq > after][:limit]

    async def put_run(self, owner: str, response_id: str, spec: dict[str, Any], runner: str) -> None:
        self._runs[response_id] = (owner, copy.deepcopy(spec), [], runner)

    async def save_generated(self, owner: str, response_id: str, token_ids: list[int], runner: str) -> bool:
        run = self._runs.get(response_id)
        if run is None or run[0] != owner or run[3] != runner:
            return False
        self._runs[response_id] = (owner, run[1], list(token_ids), runner)
        return True

    async def get_run(self, owner: str, response_id: str) -> tuple[dict[str, Any], list[int]] | None:
        run = self._runs.get(response_id)
        return (copy.deepcopy(run[1]), list(run[2])) if run is not None and run[0] == owner else None

    async def end_run(self, owner: str, response_id: str) -> None:
        run = self._runs.get(response_id)
        if run is not None and run[0] == owner:
            del self._runs[response_id]

    async def claim_stale(self, beat_before: float, now: float, runner: str) -> list[tuple[str, str]]:
        claimed = []
        for rid, (owner, spec, generated, _) in list(self._runs.items()):
            rec = self._responses.get(rid)
            if rec is not None and (rec.heartbeat or rec.created_at) < beat_before:
                rec.heartbeat = now
                self._runs[rid] = (owner, spec, generated, runner)
                claimed.append((owner, rid))
        return claimed

    async def prune(self, older_than: float) -> int:
        gone = [k for k, r in self._responses.items() if r.created_at < older_than]
        for k in gone:
            del self._responses[k]
            self._events.pop(k, None)
        convs = [k for k, c in self._conversations.items() if c.created_at < older_than]
        for k in convs:
            del self._conversations[k]
            self._items.pop(k, None)
        return len(gone) + len(convs)
