"""/v1/responses (OpenAI Responses) on the chat pipeline, with stored history.

A request's context is its stored history (the ``previous_response_id`` chain, or
the ``conversation``'s items) followed by its input; ``instructions`` become a system
message. The context becomes chat messages and runs through the chat stream
(``endpoints.turn``); its blocks come back as output items (``reasoning``,
``message``, ``function_call``), whole or as the Responses stream events, each with
its ``sequence_number``.

Token-identical turns: an assistant message is stored with the ids it was generated
as (trailing stop tokens cut). Before the next turn's prompt is tokenized, those ids
are handed to the model's reply-token cache (``tokenization.reply_cache``), which
tokenizes that message as them, so the prompt matches what the worker cached even
in another process, on another replica or after a restart.

``store: false`` leaves nothing behind (a ``conversation`` still gets the turn's
items: it is stored by its own creation). Cancelling reaches runs in progress in
this process; a finished response cannot be cancelled. A client that leaves before
its response ends cancels it: the worker's request stops, and the response is stored
as ``cancelled`` with what it had produced.
"""


from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from gateway.endpoints.events import Answer, Events
from gateway.endpoints.long_lists import STEP_ITEMS, parse_model_in_steps
from gateway.endpoints.response_history import (
    TOO_LONG,
    History,
    chat_body,
    chat_messages,
    drop_oldest,
    load_history,
    owner_of,
    page,
    seed_replies,
    to_chat,
    with_ids,
)
from gateway.endpoints.response_run import Run, close_run, turn_events
from gateway.endpoints.turn import (
    Block,
    Turn,
    start_turn,
)
from gateway.pipeline.engine import Engine
from gateway.pipeline.mcp_client import McpConfig, McpServer, McpTools
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import Store, StoredItem, StoredResponse
from gateway.pipeline.tenancy import effective_salt
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
)
from gateway.protocol.ids import random_hex
from gateway.protocol.responses_api import ResponsesRequest

log = logging.getLogger(__name__)

class ResponsesApi:
    """The Responses routes' logic over one engine and one store (opened on first use)."""

    def __init__(self, engine: Engine, store: Any, mcp: McpConfig | None = None) -> None:
        self.engine = engine
        self._store = store  # an awaitable factory: ``History.store``
        self.mcp = mcp or McpConfig()
        self.running: dict[str, Run] = {}

    async def store(self) -> Store:
        store: Store = await self._store()
        return store

    async def begin(self, req: ResponsesRequest, ctx: RequestContext, *, resume: StoredResponse | None = None) -> Run:
        """Load the history and start the turn (errors before output raise here).
        ``resume``: the stored response of a run another process began (its id, its input
        items; ``ctx.journal_ids`` the tokens it generated)."""
        owner = owner_of(ctx)
        history = await load_history(await self.store(), owner, req) if (req.previous_response_id or req.conversation_id) else History()
        inputs = resume.input_items if resume is not None else with_ids(req.input_items())
        if len(inputs) > STEP_ITEMS:  # thousands of items: a loop turn between their conversions
            await asyncio.sleep(0)
        messages = chat_messages(req.instructions, history.items + inputs)
        # A bad request fails before any MCP server is dialled.
        chat = await parse_model_in_steps(ChatCompletionRequest, chat_body(req, messages))
        servers = [
            McpServer(t.server_label or "", t.server_url or None, dict(t.headers or {}), t.allowed_names())
            for t in req.tools or [] if t.type == "mcp"
        ]
        mcp = await McpTools.discover(self.mcp, servers) if servers else None
        if mcp is not None:
            chat = to_chat(req, messages, mcp.functions())
        entry = self.engine.catalog.get(chat.model)
        seed_replies(entry, effective_salt(ctx.cache_salt, chat.cache_salt), history)
        run = Run(req, ctx, entry, history, inputs, messages=messages, mcp=mcp)
        if resume is not None:
            run.id, run.created_at = resume.id, resume.created_at
        if mcp is not None:
            run.done_output = mcp.list_items(lambda: f"mcpl_{random_hex()}")
        run.turn = await self._start_fitting(run, chat)
        return run

    async def _start_fitting(self, run: Run, chat: ChatCompletionRequest) -> Turn:
        """Start the round's turn; with ``truncation: auto``, a context that does not fit
        loses its oldest items (never the system message, never the last input) until it
        does. The engine's own length check decides, so the rule is the chat path's."""
        while True:
            try:
                return await start_turn(self.engine, chat, run.ctx)
            except InvalidRequestError as exc:
                if run.req.truncation != "auto" or exc.code not in TOO_LONG or not drop_oldest(run.messages):
                    raise
            chat = chat.model_copy(update={"messages": to_chat(run.req, run.messages).messages})

    async def _finish(self, run: Run) -> dict[str, Any]:
        body = run.body(run.final_status())
        store_needed = run.req.store or run.req.conversation_id
        if store_needed:
            store = await self.store()
            owner = owner_of(run.ctx)
            ids = run.reply_ids()
            if run.req.store:
                await store.put_response(StoredResponse(
                    id=run.id, owner=owner, created_at=run.created_at, body=body, input_items=run.input_items,
                    previous_response_id=run.req.previous_response_id, conversation_id=run.req.conversation_id,
                    output_token_ids=ids,
                ))
            conv = run.req.conversation_id
            if conv and body["status"] in ("completed", "incomplete"):
                now = time.time()
                await store.add_items([
                    StoredItem(id=i["id"], conversation_id=conv, owner=owner, created_at=now, item=i, token_ids=ids.get(i["id"]))
                    for i in run.input_items + body["output"]
                ])
        return body

    async def create(self, req: ResponsesRequest, ctx: RequestContext) -> dict[str, Any]:
        """The whole response: its stream's events, run to the end and dropped."""
        run = await self.begin(req, ctx)
        self.running[run.id] = run
        last: dict[str, Any] = {}
        async for event in self.events(run):
            last = event
        body: dict[str, Any] = last["response"]
        return body

    async def open(self, req: ResponsesRequest, ctx: RequestContext, *, sse: bool = True) -> Answer | Events:
        """The Responses API's one entry point (``endpoints.events``) for requests that are
        not background runs: the whole response, or the started run's stream events
        (``sse``: already framed as SSE; else the event objects, for a door that converts
        each)."""
        if not req.stream:
            return await self.create(req, ctx)
        run = await self.begin(req, ctx)
        self.running[run.id] = run
        assert run.turn is not None
        events = self.events(run)
        return Events(sse_stream(events) if sse else events, [run.turn.gen])

    async def events(self, run: Run) -> AsyncGenerator[dict[str, Any], None]:
        """The run's Responses stream events, numbered; the run is finished (and stored)
        before the last one."""
        assert run.turn is not None
        seq = 0

        def event(kind: str, **data: Any) -> dict[str, Any]:
            nonlocal seq
            payload = {"type": kind, "sequence_number": seq, **data}
            seq += 1
            return payload

        try:
            yield event("response.created", response=run.body("in_progress"))
            yield event("response.in_progress", response=run.body("in_progress"))
            for at, item in enumerate(run.done_output):  # the MCP servers' tool lists
                yield event("response.output_item.added", output_index=at, item=item)
                yield event("response.output_item.done", output_index=at, item=item)
            while True:
                assert run.turn is not None
                async for ev in run.turn.events:
                    if run.cancelled:
                        break
                    for out in turn_events(run, ev):
                        yield event(out.pop("type"), **out)
                calls = run.mcp_calls() if not run.cancelled and run.end is not None else []
                if not calls:
                    break
                if run.rounds >= self.mcp.mcp_max_rounds:
                    run.out_of_rounds = True
                    break
                results: list[tuple[Block, dict[str, Any]]] = []
                for block in calls:
                    item = {"type": "mcp_call", "id": f"mcp_{random_hex()}", "server_label": run.mcp.tools[block.name or ""].server.label,  # type: ignore[union-attr]
                            "name": block.name, "arguments": block.text, "output": None, "error": None, "status": "in_progress"}
                    at = len(run.done_output) + len(run.item_ids) + len(results)
                    yield event("response.output_item.added", output_index=at, item=dict(item))
                    output, error = await run.mcp.call(block.name or "", block.text)  # type: ignore[union-attr]
                    item.update(output=output, error=error, status="completed" if error is None else "failed")
                    yield event("response.output_item.done", output_index=at, item=dict(item))
                    results.append((block, item))
                await close_run(run)
                run.next_round(results)
                chat = to_chat(run.req, run.messages, run.mcp.functions() if run.mcp else None)
                run.turn = await self._start_fitting(run, chat)
        except GatewayError as exc:
            run.error = exc
        except (GeneratorExit, asyncio.CancelledError):
            if not run.req.background:  # a background run stopped here is continued elsewhere
                await self._abandoned(run)
            raise
        finally:
            self.running.pop(run.id, None)
            await close_run(run)
        body = await self._finish(run)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}.get(body["status"], "response.incomplete")
        yield event(kind, response=body)

    async def _abandoned(self, run: Run) -> None:
        """The client left mid-run (its stream closed, its request cancelled): the worker
        request ends now and the response is stored as ``cancelled``, never lost nor left
        ``in_progress``. The store write is shielded from a second cancel of the task."""
        run.cancelled = True
        self.running.pop(run.id, None)
        await close_run(run)
        try:
            await asyncio.shield(self._finish(run))
        except Exception:  # the store failing must not mask the client's leaving
            log.exception("storing cancelled response %s failed", run.id)

    async def retrieve(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        run = self.running.get(response_id)
        if run is not None and owner_of(run.ctx) == owner_of(ctx):
            return run.body("in_progress")
        rec = await (await self.store()).get_response(owner_of(ctx), response_id)
        if rec is None:
            raise NotFoundError(f"response {response_id!r} not found", param="response_id")
        return rec.body

    async def delete(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        if not await (await self.store()).delete_response(owner_of(ctx), response_id):
            raise NotFoundError(f"response {response_id!r} not found", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, ctx: RequestContext, response_id: str) -> dict[str, Any]:
        run = self.running.get(response_id)
        if run is not None and owner_of(run.ctx) == owner_of(ctx):
            run.cancelled = True
            await close_run(run)
            return run.body("cancelled")
        body = await self.retrieve(ctx, response_id)
        raise InvalidRequestError(f"response {response_id!r} is {body.get('status')}: only a response in progress can be cancelled", param="response_id")

    async def input_items(self, ctx: RequestContext, response_id: str, *, after: str | None, limit: int, order: str) -> dict[str, Any]:
        rec = await (await self.store()).get_response(owner_of(ctx), response_id)
        if rec is None:
            raise NotFoundError(f"response {response_id!r} not found", param="response_id")
        return page(rec.input_items, after=after, limit=limit, order=order)


def sse_event(event: dict[str, Any]) -> bytes:
    """One Responses stream event as SSE: its type as the event name, then its JSON."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def sse_stream(events: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[bytes, None]:
    try:
        async for event in events:
            yield sse_event(event)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
