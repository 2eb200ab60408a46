"""Background responses (``background: true``): run without a client, journaled, replayable,
continued by another process when theirs dies.

The create call answers at once (status ``in_progress``) while a task of this process
drives the generation. Its stream events go to the store in bounded batches
(``JOURNAL_BATCH`` events or ``JOURNAL_INTERVAL_S``, whichever comes first), each batch
with the token ids generated so far, and only then to this process's readers: no
client ever sees an event that is not journaled. ``GET /v1/responses/{id}?stream=true
&starting_after=N`` sends every event after ``N`` exactly once, then follows the run
until its last event, from memory here or from the store on any process or replica
sharing it.

The running process beats a heartbeat into the store several times per
``--history-stale-s``. Every process sweeps for runs whose heartbeat is older; one of
them claims each (a conditional update: one winner) and continues it: the same
request, its stored input items and item ids, and a generation that goes on from the
journaled tokens through the resume path (``Engine.start_from_journal``). Its events
are recomputed from the start and aligned on the journal (``Alignment``): what was
journaled is not sent again, numbering goes on after the last journaled event.
A clean stop leaves the run to be continued the same way (by another process, or by
this one after its restart). What cannot be continued (MCP tool rounds, a seeded or
constrained request) ends as ``response.failed`` for its readers once its heartbeat
is stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gateway.endpoints.response_history import owner_of
from gateway.endpoints.response_run import Run
from gateway.endpoints.responses import ResponsesApi
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import Store, StoredResponse
from gateway.protocol.errors import (
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
)
from gateway.protocol.ids import random_hex
from gateway.protocol.responses_api import ResponsesRequest

log = logging.getLogger(__name__)

JOURNAL_BATCH = 32  # events per store write at most
JOURNAL_INTERVAL_S = 0.2  # and at least this often while events come
POLL_S = 0.1  # how often a reader of a run in another process looks for more
MAX_POLL_S = 3600.0  # a reader of a run that stopped progressing gives up after this long
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta"})


class _LostClaim(Exception):
    """This process's run was claimed by another (it stalled past the stale time)."""


@dataclass
class Journal:
    """A live run's journaled events in this process, for its readers here."""

    owner: str
    events: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False  # no more events here (the run ended, or this process stopped it)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def add(self, events: list[dict[str, Any]], *, close: bool = False) -> None:
        async with self.changed:
            self.events.extend(events)
            self.closed = self.closed or close
            self.changed.notify_all()


def _more(journal: Journal, at: int) -> bool:
    return len(journal.events) > at or journal.closed


def _item_key(event: dict[str, Any]) -> str | None:
    item = event.get("item")
    return item.get("id") if isinstance(item, dict) else event.get("item_id")


class Alignment:
    """A continued run's recomputed events against what its first process journaled:
    structural events already journaled are dropped, a delta keeps only the text beyond
    the journaled text of its item, the rest is numbered after the last journaled event."""

    def __init__(self, journaled: list[dict[str, Any]]) -> None:
        self.next_seq = journaled[-1]["sequence_number"] + 1 if journaled else 0
        self.seen = {(e["type"], _item_key(e)) for e in journaled if e["type"] not in DELTAS}
        self.journaled_text: dict[str | None, int] = {}
        for e in journaled:
            if e["type"] in DELTAS:
                key = _item_key(e)
                self.journaled_text[key] = self.journaled_text.get(key, 0) + len(e["delta"])
        self.recomputed_text: dict[str | None, int] = {}
        self.item_ids = [e["item"]["id"] for e in journaled if e["type"] == "response.output_item.added"]

    def align(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind, key = event["type"], _item_key(event)
        if kind in DELTAS:
            delta: str = event["delta"]
            before = self.recomputed_text.get(key, 0)
            self.recomputed_text[key] = before + len(delta)
            have = self.journaled_text.get(key, 0)
            if before + len(delta) <= have:
                return None
            if before < have:
                event = {**event, "delta": delta[have - before:]}
        elif (kind, key) in self.seen:
            return None
        event = {**event, "sequence_number": self.next_seq}
        self.next_seq += 1
        return event


class BackgroundRuns:
    """This process's background runs: start, drive and journal them, continue those of
    dead processes, replay their events."""

    def __init__(
        self, api: ResponsesApi, stale_s: float = 15.0, *,
        salt_of: Callable[[str | None], str | None] = lambda _: None,
        store_in_use: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.stale_s = stale_s  # no heartbeat for this long: the run's process is gone
        self.salt_of = salt_of  # a key's cache salt (a continued run's context)
        self.store_in_use = store_in_use  # whether sweeping may open the store
        self.runner = random_hex()  # this process, as the runner of its runs in the store
        self.live: dict[str, Journal] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, req: ResponsesRequest, ctx: RequestContext, *, on_end: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Start the run (errors before output raise here) and answer with it in progress;
        ``on_end`` runs when the run ends here, however (its admission slot's release)."""
        run = await self.api.begin(req, ctx)
        body = run.body("in_progress")
        store = await self.api.store()
        owner = owner_of(ctx)
        await store.put_response(StoredResponse(
            id=run.id, owner=owner, created_at=run.created_at, body=body, input_items=run.input_items,
            previous_response_id=req.previous_response_id, conversation_id=req.conversation_id,
        ))
        await store.touch_response(owner, run.id, time.time())
        if run.mcp is None:  # tool rounds are not continued elsewhere
            await store.put_run(owner, run.id, {"request": req.model_dump(mode="json", exclude_none=True)}, self.runner)
        self._launch(run, Journal(owner), None, on_end)
        return body

    def _launch(self, run: Run, journal: Journal, alignment: Alignment | None, on_end: Callable[[], None]) -> None:
        self.live[run.id] = journal
        self.api.running[run.id] = run  # retrieve and cancel reach it
        task = asyncio.get_running_loop().create_task(self._drive(run, journal, alignment))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: on_end())

    async def _drive(self, run: Run, journal: Journal, alignment: Alignment | None) -> None:
        store = await self.api.store()
        owner = owner_of(run.ctx)
        pending: list[dict[str, Any]] = []
        flushed = time.monotonic()
        beat = asyncio.get_running_loop().create_task(self._beat(run.id, owner))

        async def flush() -> None:
            nonlocal pending, flushed
            batch, pending, flushed = pending, [], time.monotonic()
            if run.turn is not None and run.mcp is None:
                if not await store.save_generated(owner, run.id, run.turn.gen.output_ids(0), self.runner):
                    raise _LostClaim(run.id)  # another process continues it: stop without a word
            await store.append_events(owner, run.id, [(e["sequence_number"], e) for e in batch])
            await journal.add(batch)  # readers here see only what is journaled

        try:
            async for event in self.api.events(run):
                if alignment is not None and (event := alignment.align(event)) is None:  # type: ignore[assignment]
                    continue
                pending.append(event)
                if len(pending) >= JOURNAL_BATCH or time.monotonic() - flushed >= JOURNAL_INTERVAL_S:
                    await flush()
            await flush()
            await store.end_run(owner, run.id)
        except _LostClaim:
            log.warning("background response %s is run by another process now; stopped here", run.id)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await flush()  # a clean stop: what it has is journaled; the run is continued
                if await store.get_run(owner, run.id) is None:
                    await self._fail(store, owner, run.id, run.body("failed"))
            raise
        except Exception:
            log.exception("background response %s failed", run.id)
            with contextlib.suppress(Exception):
                await flush()
                await self._fail(store, owner, run.id, run.body("failed"))
                await store.end_run(owner, run.id)
        finally:
            beat.cancel()
            await journal.add([], close=True)
            self.live.pop(run.id, None)
            self.api.running.pop(run.id, None)

    async def _beat(self, response_id: str, owner: str) -> None:
        """Say this process still runs the response, several times per ``stale_s``."""
        store = await self.api.store()
        while True:
            try:
                await store.touch_response(owner, response_id, time.time())
            except Exception:
                log.exception("heartbeat of background response %s failed", response_id)
            await asyncio.sleep(self.stale_s / 5)

    async def _fail(self, store: Store, owner: str, response_id: str, body: dict[str, Any], message: str | None = None) -> None:
        """Record a run as failed: its body, and ``response.failed`` after its last journaled
        event (so every reader ends on the same event)."""
        body = {**body, "status": "failed"}
        if message is not None or body.get("error") is None:
            body["error"] = {"code": "server_error", "message": message or "the gateway stopped before the response finished"}
        journaled = await store.list_events(owner, response_id, limit=1_000_000)
        seq = journaled[-1][0] + 1 if journaled else 0
        await store.append_events(owner, response_id, [(seq, {"type": "response.failed", "sequence_number": seq, "response": body})])
        rec = await store.get_response(owner, response_id)
        if rec is not None:
            rec.body = body
            await store.put_response(rec)

    # ------------------------------------------------------------ continuing elsewhere
    def start_sweeper(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Claim and continue the runs whose process stopped beating."""
        while True:
            await asyncio.sleep(self.stale_s / 2)
            if not self.store_in_use():
                continue
            try:
                store = await self.api.store()
                now = time.time()
                for owner, response_id in await store.claim_stale(now - self.stale_s, now, self.runner):
                    await self.take_over(store, owner, response_id)
            except Exception:
                log.exception("sweeping for background runs to continue failed")

    async def take_over(self, store: Store, owner: str, response_id: str) -> None:
        """Continue a run another process began (this process has just claimed it)."""
        rec = await store.get_response(owner, response_id)
        got = await store.get_run(owner, response_id)
        if rec is None or got is None or rec.body.get("status") != "in_progress":
            await store.end_run(owner, response_id)
            return
        spec, generated = got
        journaled = [e for _, e in await store.list_events(owner, response_id, limit=1_000_000)]
        key = owner or None
        ctx = RequestContext(api_key_id=key, cache_salt=self.salt_of(key), journal_ids=generated)
        try:
            req = ResponsesRequest.model_validate(spec["request"])
            run = await self.api.begin(req, ctx, resume=rec)
        except (NotFoundError, ServiceUnavailableError) as exc:
            # Not here, not now (the model is not served here, no worker is up): the claim
            # lapses with its heartbeat and a sweeper (maybe this one) tries again.
            log.info("background response %s not continued here yet: %s", response_id, exc.message)
            return
        except GatewayError as exc:
            log.warning("background response %s cannot be continued: %s", response_id, exc.message)
            await self._fail(store, owner, response_id, rec.body, f"the gateway process running this response stopped: {exc.message}")
            await store.end_run(owner, response_id)
            return
        log.warning("continuing background response %s from %d journaled tokens", response_id, len(generated))
        alignment = Alignment(journaled)
        run.preset_ids = list(alignment.item_ids)
        self._launch(run, Journal(owner, list(journaled)), alignment, lambda: None)

    # ------------------------------------------------------------ readers
    async def replay(self, ctx: RequestContext, response_id: str, starting_after: int) -> AsyncIterator[dict[str, Any]]:
        """Check the response is the caller's and a background one (errors raise here),
        then its events after ``starting_after``."""
        rec = await (await self.api.store()).get_response(owner_of(ctx), response_id)
        if rec is None:
            raise NotFoundError(f"response {response_id!r} not found", param="response_id")
        if not rec.body.get("background"):
            raise InvalidRequestError("only a background response can be streamed again", param="stream")
        return self._events(owner_of(ctx), response_id, starting_after)

    async def _events(self, owner: str, response_id: str, after: int) -> AsyncIterator[dict[str, Any]]:
        journal = self.live.get(response_id)
        if journal is not None and journal.owner == owner:
            # This process runs it: memory holds every journaled event, in order.
            at = after + 1
            while True:
                async with journal.changed:
                    await journal.changed.wait_for(partial(_more, journal, at))
                    fresh = journal.events[at:]
                    closed = journal.closed
                for event in fresh:
                    yield event
                    after = event["sequence_number"]
                    if event.get("type") in TERMINAL:
                        return
                at += len(fresh)
                if closed and at >= len(journal.events):
                    break  # stopped here without its last event: the store tells the rest
        store = await self.api.store()
        deadline = time.monotonic() + MAX_POLL_S
        checked = time.monotonic()
        while True:
            stored = await store.list_events(owner, response_id, after=after)
            for seq, event in stored:
                yield event
                after = seq
                if event.get("type") in TERMINAL:
                    return
            if not stored:
                if time.monotonic() > deadline:
                    raise GatewayTimeoutError(f"response {response_id!r} made no progress")
                if time.monotonic() - checked >= self.stale_s / 5:
                    checked = time.monotonic()
                    await self._fail_if_orphaned(store, owner, response_id)
                await asyncio.sleep(POLL_S)

    async def _fail_if_orphaned(self, store: Store, owner: str, response_id: str) -> None:
        """A run in progress whose process stopped beating and that cannot be continued
        (the sweepers leave it) is recorded as failed."""
        rec = await store.get_response(owner, response_id)
        if rec is None or rec.body.get("status") != "in_progress":
            return
        if time.time() - (rec.heartbeat or rec.created_at) < self.stale_s:
            return
        if await store.get_run(owner, response_id) is not None:
            return  # a sweeper continues it
        log.warning("background response %s lost its process; recorded as failed", response_id)
        await self._fail(store, owner, response_id, rec.body,
                         "the gateway process running this response stopped before it finished")

    async def close(self) -> None:
        """Stop this process's runs: each is journaled as far as it got and left to be
        continued (what cannot be is recorded as failed)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
