"""Background responses (``background: true``): run without a client, journaled, replayable.

The create call answers at once (status ``in_progress``) while a task of this process
drives the generation. Its stream events go to an in-memory journal for readers in
this process and to the store in bounded batches (``JOURNAL_BATCH`` events or
``JOURNAL_INTERVAL_S``, whichever comes first), so a reader anywhere, on another
process or replica too, can replay them: ``GET /v1/responses/{id}?stream=true
&starting_after=N`` sends every event after ``N`` exactly once, then follows the run
until its last event.

The running process beats a heartbeat into the store several times per
``--history-stale-s``; a reader that finds a run in progress without a recent beat
(its process was killed, or lost the store) journals ``response.failed`` after the
last stored event and ends there, as every later reader does. A run whose process
only stalled that long is cut off the same way: its later events are not read.
Continuing such a run elsewhere (the resume path over the journaled tokens) is not
done yet.
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
from gateway.pipeline.store.base import StoredResponse
from gateway.protocol.errors import (
    GatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
)
from gateway.protocol.responses_api import ResponsesRequest

log = logging.getLogger(__name__)

JOURNAL_BATCH = 32  # events per store write at most
JOURNAL_INTERVAL_S = 0.2  # and at least this often while events come
POLL_S = 0.1  # how often a reader of a run in another process looks for more
MAX_POLL_S = 3600.0  # a reader of a run that stopped progressing gives up after this long
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass
class Journal:
    """A live run's events in this process, for its readers here."""

    owner: str
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def add(self, event: dict[str, Any] | None) -> None:
        async with self.changed:
            if event is None:
                self.done = True
            else:
                self.events.append(event)
            self.changed.notify_all()


def _more(journal: Journal, at: int) -> bool:
    return len(journal.events) > at or journal.done


class BackgroundRuns:
    """This process's background runs: start, drive and journal them, replay their events."""

    def __init__(self, api: ResponsesApi, stale_s: float = 15.0) -> None:
        self.api = api
        self.stale_s = stale_s  # no heartbeat for this long: the run's process is gone
        self.live: dict[str, Journal] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, req: ResponsesRequest, ctx: RequestContext, *, on_end: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Start the run (errors before output raise here) and answer with it in progress;
        ``on_end`` runs when the run ends, however (its admission slot's release)."""
        run = await self.api.begin(req, ctx)
        body = run.body("in_progress")
        store = await self.api.store()
        await store.put_response(StoredResponse(
            id=run.id, owner=owner_of(ctx), created_at=run.created_at, body=body, input_items=run.input_items,
            previous_response_id=req.previous_response_id, conversation_id=req.conversation_id,
        ))
        journal = self.live[run.id] = Journal(owner_of(ctx))
        self.api.running[run.id] = run  # retrieve and cancel reach it
        task = asyncio.get_running_loop().create_task(self._drive(run, journal))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: on_end())
        return body

    async def _drive(self, run: Run, journal: Journal) -> None:
        store = await self.api.store()
        owner = owner_of(run.ctx)
        pending: list[tuple[int, dict[str, Any]]] = []
        flushed = time.monotonic()
        beat = asyncio.get_running_loop().create_task(self._beat(run.id, owner))
        try:
            async for event in self.api.events(run):
                await journal.add(event)
                pending.append((event["sequence_number"], event))
                if len(pending) >= JOURNAL_BATCH or time.monotonic() - flushed >= JOURNAL_INTERVAL_S:
                    await store.append_events(owner, run.id, pending)
                    pending, flushed = [], time.monotonic()
            await store.append_events(owner, run.id, pending)
        except asyncio.CancelledError:
            await self._stopped(run, pending)
            raise
        except Exception:
            log.exception("background response %s failed", run.id)
            await self._stopped(run, pending)
        finally:
            beat.cancel()
            await journal.add(None)
            self.live.pop(run.id, None)

    async def _beat(self, response_id: str, owner: str) -> None:
        """Say this process still runs the response, several times per ``stale_s``."""
        store = await self.api.store()
        while True:
            try:
                await store.touch_response(owner, response_id, time.time())
            except Exception:
                log.exception("heartbeat of background response %s failed", response_id)
            await asyncio.sleep(self.stale_s / 5)

    async def _stopped(self, run: Run, pending: list[tuple[int, dict[str, Any]]]) -> None:
        """The run ended without its last event (the process is stopping): journal what it
        has and record it as failed, so readers end instead of waiting."""
        with contextlib.suppress(Exception):
            store = await self.api.store()
            owner = owner_of(run.ctx)
            await store.append_events(owner, run.id, pending)
            run.error = run.error or GatewayError("the gateway stopped before the response finished", status=503, type="server_error")
            body = run.body("failed")
            seq = pending[-1][0] + 1 if pending else len(await store.list_events(owner, run.id, limit=1_000_000))
            await store.append_events(owner, run.id, [(seq, {"type": "response.failed", "sequence_number": seq, "response": body})])
            rec = await store.get_response(owner, run.id)
            if rec is not None:
                rec.body = body
                await store.put_response(rec)

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
            # This process runs it: the store has a prefix of the journal, memory has all of it.
            at = after + 1
            while True:
                async with journal.changed:
                    await journal.changed.wait_for(partial(_more, journal, at))
                    fresh = journal.events[at:]
                    done = journal.done
                for event in fresh:
                    yield event
                at += len(fresh)
                if done and at >= len(journal.events):
                    return
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
                    await self._fail_if_orphaned(owner, response_id, after)
                await asyncio.sleep(POLL_S)

    async def _fail_if_orphaned(self, owner: str, response_id: str, after: int) -> None:
        """A run in progress whose process stopped beating (killed, or cut off from the
        store) is recorded as failed, its last event journaled after the last one there,
        so every reader ends on the same event."""
        store = await self.api.store()
        rec = await store.get_response(owner, response_id)
        if rec is None or rec.body.get("status") != "in_progress":
            return
        if time.time() - (rec.heartbeat or rec.created_at) < self.stale_s:
            return
        log.warning("background response %s lost its process; recorded as failed", response_id)
        rec.body = {**rec.body, "status": "failed", "error": {
            "code": "server_error", "message": "the gateway process running this response stopped before it finished",
        }}
        await store.append_events(owner, response_id, [
            (after + 1, {"type": "response.failed", "sequence_number": after + 1, "response": rec.body}),
        ])
        await store.put_response(rec)

    async def close(self) -> None:
        """Stop this process's runs (each is recorded as failed)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
