"""The store interface and the records it holds.

Responses and conversations are state the gateway owns (a ``previous_response_id``
or a ``conversation`` must rebuild the same prompt later, in another process or
after a restart), so they live behind one async interface with interchangeable
backends: memory for tests, SQLite by default, PostgreSQL for several processes
and replicas. Every record carries its ``owner`` (the API key id that made it, ""
when the gateway has no keys) and every read is scoped to it: another key's id
reads as missing, never as forbidden, so ids leak nothing.

Records keep their API objects as JSON dicts (``body``, ``item``): the endpoints
own their shape; the store only keeps, scopes and expires them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

Order = Literal["asc", "desc"]


@dataclass
class StoredResponse:
    """A Responses API object plus what rebuilding its turn needs."""

    id: str
    owner: str
    created_at: float
    body: dict[str, Any]  # the response object as the API returns it
    input_items: list[dict[str, Any]]  # this turn's input, as items
    previous_response_id: str | None = None
    conversation_id: str | None = None
    # The ids each output message was generated as (by output item id): the next turn's
    # prompt is tokenized with them, as the worker cached them.
    output_token_ids: dict[str, list[int]] = field(default_factory=dict)
    heartbeat: float | None = None  # a background run's process was alive then (epoch seconds)


@dataclass
class StoredConversation:
    id: str
    owner: str
    created_at: float
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class StoredItem:
    """One item of a conversation (a message, a function call or its output)."""

    id: str
    conversation_id: str
    owner: str
    created_at: float
    item: dict[str, Any]
    token_ids: list[int] | None = None  # an assistant message's generated ids
    seq: int = 0  # set by the store: the item's place in the conversation


class Store(abc.ABC):
    """Async, owner-scoped persistence of responses and conversations."""

    name: str = ""

    async def open(self) -> None:  # noqa: B027 - backends without a connection need nothing
        """Connect and bring the schema to the current version."""

    async def close(self) -> None:  # noqa: B027
        """Release connections."""

    # -- responses
    @abc.abstractmethod
    async def put_response(self, rec: StoredResponse) -> None:
        """Insert or replace a response (a background run updates its body)."""

    @abc.abstractmethod
    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None: ...

    @abc.abstractmethod
    async def touch_response(self, owner: str, response_id: str, at: float) -> None:
        """Record the heartbeat of the process running a background response."""

    @abc.abstractmethod
    async def delete_response(self, owner: str, response_id: str) -> bool:
        """Delete a response and its event journal."""

    # -- conversations
    @abc.abstractmethod
    async def put_conversation(self, rec: StoredConversation) -> None: ...

    @abc.abstractmethod
    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None: ...

    @abc.abstractmethod
    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        """Delete a conversation and its items."""

    @abc.abstractmethod
    async def add_items(self, items: list[StoredItem]) -> list[StoredItem]:
        """Append items to their conversation in order; returns them with ``seq`` set."""

    @abc.abstractmethod
    async def list_items(
        self, owner: str, conversation_id: str, *, after: str | None = None, limit: int = 20, order: Order = "asc"
    ) -> list[StoredItem]:
        """Items in conversation order (``desc``: newest first), those after item ``after``."""

    @abc.abstractmethod
    async def get_item(self, owner: str, conversation_id: str, item_id: str) -> StoredItem | None: ...

    @abc.abstractmethod
    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> bool: ...

    # -- the event journal of background responses
    @abc.abstractmethod
    async def append_events(self, owner: str, response_id: str, events: list[tuple[int, dict[str, Any]]]) -> None:
        """Journal a batch of a response's stream events (``(sequence_number, event)``)."""

    @abc.abstractmethod
    async def list_events(self, owner: str, response_id: str, *, after: int = -1, limit: int = 1000) -> list[tuple[int, dict[str, Any]]]:
        """Journaled events with a sequence number above ``after``, in order."""

    # -- continuing a background run elsewhere
    @abc.abstractmethod
    async def put_run(self, owner: str, response_id: str, spec: dict[str, Any], runner: str) -> None:
        """Record a background run's spec (what continuing it needs) and the process that runs it."""

    @abc.abstractmethod
    async def save_generated(self, owner: str, response_id: str, token_ids: list[int], runner: str) -> bool:
        """The ids the run generated so far (saved with each journal flush); False when
        ``runner`` no longer runs it (another process claimed it: it must stop)."""

    @abc.abstractmethod
    async def get_run(self, owner: str, response_id: str) -> tuple[dict[str, Any], list[int]] | None:
        """(spec, generated ids) of a run still in progress, or None."""

    @abc.abstractmethod
    async def end_run(self, owner: str, response_id: str) -> None:
        """The run ended (however): nothing left to continue."""

    @abc.abstractmethod
    async def claim_stale(self, beat_before: float, now: float, runner: str) -> list[tuple[str, str]]:
        """Claim the runs whose heartbeat is older than ``beat_before``: each becomes
        ``runner``'s (its heartbeat set to ``now``), exactly one caller per run; returns
        the claimed ``(owner, response_id)``s."""

    # -- retention
    @abc.abstractmethod
    async def prune(self, older_than: float) -> int:
        """Delete responses and conversations (with their items) created before ``older_than``
        (epoch seconds); returns how many top-level objects went."""
