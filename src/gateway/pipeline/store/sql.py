"""The SQL store: every query of the interface, written once for SQLite and PostgreSQL.

Backends differ only in how they connect and run a statement (``SqlStore._run``);
queries use ``?`` placeholders and portable SQL (``ON CONFLICT`` upserts, which both
have). JSON columns hold orjson text, so the two databases store the same bytes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.pipeline.store.base import Order, Store, StoredConversation, StoredItem, StoredResponse

Row = Sequence[Any]


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


_RESPONSE_COLUMNS = "id, owner, created_at, previous_response_id, conversation_id, body, input_items, output_token_ids"
_RESPONSE_READ = _RESPONSE_COLUMNS + ", heartbeat"
_ITEM_COLUMNS = "seq, id, conversation_id, owner, created_at, item, token_ids"


def _response(row: Row) -> StoredResponse:
    return StoredResponse(
        id=row[0], owner=row[1], created_at=float(row[2]), previous_response_id=row[3], conversation_id=row[4],
        body=_loads(row[5]), input_items=_loads(row[6]),
        output_token_ids=_loads(row[7]), heartbeat=None if row[8] is None else float(row[8]),
    )


def _item(row: Row) -> StoredItem:
    return StoredItem(
        seq=int(row[0]), id=row[1], conversation_id=row[2], owner=row[3], created_at=float(row[4]),
        item=_loads(row[5]), token_ids=_loads(row[6]),
    )


class SqlStore(Store):
    """The queries; subclasses run them (``_run``, ``_run_many``) and migrate (``open``)."""

    @abc.abstractmethod
    async def _run(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[Row], int]:
        """Run one statement in its own transaction: (rows, affected row count)."""

    @abc.abstractmethod
    async def _run_many(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        """Run statements in one transaction; each one's rows."""

    async def put_response(self, rec: StoredResponse) -> None:
        await self._run(
            f"INSERT INTO responses ({_RESPONSE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET body = excluded.body, output_token_ids = excluded.output_token_ids",
            (
                rec.id, rec.owner, rec.created_at, rec.previous_response_id, rec.conversation_id,
                _dumps(rec.body), _dumps(rec.input_items), _dumps(rec.output_token_ids),
            ),
        )

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        rows, _ = await self._run(
            f"SELECT {_RESPONSE_READ} FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
        )
        return _response(rows[0]) if rows else None

    async def touch_response(self, owner: str, response_id: str, at: float) -> None:
        await self._run("UPDATE responses SET heartbeat = ? WHERE id = ? AND owner = ?", (at, response_id, owner))

    async def delete_response(self, owner: str, response_id: str) -> bool:
        rows = await self._run_many([
            ("DELETE FROM responses WHERE id = ? AND owner = ? RETURNING id", (response_id, owner)),
            ("DELETE FROM response_events WHERE response_id = ? AND owner = ?", (response_id, owner)),
        ])
        return bool(rows[0])

    async def append_events(self, owner: str, response_id: str, events: list[tuple[int, dict[str, Any]]]) -> None:
        if events:
            await self._run_many([
                (
                    "INSERT INTO response_events (response_id, owner, seq, event) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (response_id, seq) DO NOTHING",
                    (response_id, owner, seq, _dumps(event)),
                )
                for seq, event in events
            ])

    async def list_events(self, owner: str, response_id: str, *, after: int = -1, limit: int = 1000) -> list[tuple[int, dict[str, Any]]]:
        rows, _ = await self._run(
            "SELECT seq, event FROM response_events WHERE response_id = ? AND owner = ? AND seq > ? ORDER BY seq LIMIT ?",
            (response_id, owner, after, limit),
        )
        return [(int(r[0]), _loads(r[1])) for r in rows]

    async def put_conversation(self, rec: StoredConversation) -> None:
        await self._run(
            "INSERT INTO conversations (id, owner, created_at, metadata) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET metadata = excluded.metadata",
            (rec.id, rec.owner, rec.created_at, _dumps(rec.metadata)),
        )

    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None:
        rows, _ = await self._run(
            "SELECT id, owner, created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
            (conversation_id, owner),
        )
        if not rows:
            return None
        row = rows[0]
        return StoredConversation(id=row[0], owner=row[1], created_at=float(row[2]), metadata=_loads(row[3]))

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        rows = await self._run_many([
            ("DELETE FROM conversations WHERE id = ? AND owner = ? RETURNING id", (conversation_id, owner)),
            ("DELETE FROM conversation_items WHERE conversation_id = ? AND owner = ?", (conversation_id, owner)),
        ])
        return bool(rows[0])

    async def add_items(self, items: list[StoredItem]) -> list[StoredItem]:
        if not items:
            return []
        rows = await self._run_many([
            (
                "INSERT INTO conversation_items (id, conversation_id, owner, created_at, item, token_ids) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
                (
                    i.id, i.conversation_id, i.owner, i.created_at, _dumps(i.item),
                    None if i.token_ids is None else _dumps(i.token_ids),
                ),
            )
            for i in items
        ])
        out = []
        for item, got in zip(items, rows, strict=True):
            out.append(StoredItem(
                id=item.id, conversation_id=item.conversation_id, owner=item.owner, created_at=item.created_at,
                item=item.item, token_ids=item.token_ids, seq=int(got[0][0]),
            ))
        return out

    async def list_items(
        self, owner: str, conversation_id: str, *, after: str | None = None, limit: int = 20, order: Order = "asc"
    ) -> list[StoredItem]:
        direction, cmp = ("ASC", ">") if order == "asc" else ("DESC", "<")
        params: list[Any] = [conversation_id, owner]
        where = ""
        if after is not None:
            where = f" AND seq {cmp} COALESCE((SELECT seq FROM conversation_items WHERE conversation_id = ? AND id = ?), {'-1' if order == 'asc' else '9223372036854775807'})"
            params += [conversation_id, after]
        rows, _ = await self._run(
            f"SELECT {_ITEM_COLUMNS} FROM conversation_items WHERE conversation_id = ? AND owner = ?{where} "
            f"ORDER BY seq {direction} LIMIT ?",
            (*params, limit),
        )
        return [_item(r) for r in rows]

    async def get_item(self, owner: str, conversation_id: str, item_id: str) -> StoredItem | None:
        rows, _ = await self._run(
            f"SELECT {_ITEM_COLUMNS} FROM conversation_items WHERE conversation_id = ? AND id = ? AND owner = ?",
            (conversation_id, item_id, owner),
        )
        return _item(rows[0]) if rows else None

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        _, n = await self._run(
            "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ? AND owner = ?",
            (conversation_id, item_id, owner),
        )
        return n > 0

    async def put_run(self, owner: str, response_id: str, spec: dict[str, Any], runner: str) -> None:
        await self._run(
            "INSERT INTO background_runs (response_id, owner, spec, generated, runner) VALUES (?, ?, ?, '[]', ?) "
            "ON CONFLICT (response_id) DO UPDATE SET spec = excluded.spec, runner = excluded.runner",
            (response_id, owner, _dumps(spec), runner),
        )

    async def save_generated(self, owner: str, response_id: str, token_ids: list[int], runner: str) -> bool:
        _, n = await self._run(
            "UPDATE background_runs SET generated = ? WHERE response_id = ? AND owner = ? AND runner = ?",
            (_dumps(token_ids), response_id, owner, runner),
        )
        return n == 1

    async def get_run(self, owner: str, response_id: str) -> tuple[dict[str, Any], list[int]] | None:
        rows, _ = await self._run(
            "SELECT spec, generated FROM background_runs WHERE response_id = ? AND owner = ?", (response_id, owner)
        )
        return (_loads(rows[0][0]), _loads(rows[0][1])) if rows else None

    async def end_run(self, owner: str, response_id: str) -> None:
        await self._run("DELETE FROM background_runs WHERE response_id = ? AND owner = ?", (response_id, owner))

    async def claim_stale(self, beat_before: float, now: float, runner: str) -> list[tuple[str, str]]:
        rows, _ = await self._run(
            "SELECT b.owner, b.response_id, COALESCE(r.heartbeat, r.created_at) FROM background_runs b "
            "JOIN responses r ON r.id = b.response_id WHERE COALESCE(r.heartbeat, r.created_at) < ?",
            (beat_before,),
        )
        claimed = []
        for owner, rid, beat in rows:
            _, n = await self._run(  # one winner: the heartbeat must still be the stale one
                "UPDATE responses SET heartbeat = ? WHERE id = ? AND COALESCE(heartbeat, created_at) = ?",
                (now, rid, beat),
            )
            if n == 1:
                await self._run("UPDATE background_runs SET runner = ? WHERE response_id = ?", (runner, rid))
                claimed.append((owner, rid))
        return claimed

    async def prune(self, older_than: float) -> int:
        rows = await self._run_many([
            ("DELETE FROM responses WHERE created_at < ? RETURNING id", (older_than,)),
            ("DELETE FROM conversations WHERE created_at < ? RETURNING id", (older_than,)),
            ("DELETE FROM conversation_items WHERE conversation_id NOT IN (SELECT id FROM conversations)", ()),
            ("DELETE FROM response_events WHERE response_id NOT IN (SELECT id FROM responses)", ()),
            ("DELETE FROM background_runs WHERE response_id NOT IN (SELECT id FROM responses)", ()),
        ])
        return len(rows[0]) + len(rows[1])
