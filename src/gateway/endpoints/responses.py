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
this process; a finished response cannot be cancelled.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from gateway.endpoints.events import Answer, Events
from gateway.endpoints.turn import (
    Block,
    BlockDelta,
    BlockEvent,
    BlockStart,
    Turn,
    TurnEnd,
    start_turn,
)
from gateway.pipeline.catalog import ModelEntry
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
    validation_error_to_gateway,
)
from gateway.protocol.ids import random_hex
from gateway.protocol.responses_api import ResponsesRequest

MAX_CHAIN = 256  # previous_response_id links followed at most
CONVERSATION_PAGE = 1000
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def item_id(kind: str) -> str:
    return f"{_ID_PREFIX.get(kind, 'item')}_{random_hex()}"


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as stored and listed: each with an id, messages with a content parts list."""
    out = []
    for item in items:
        item = dict(item)
        item.setdefault("id", item_id(item["type"]))
        if item["type"] == "message":
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content}]
            item.setdefault("status", "completed")
        out.append(item)
    return out


def owner_of(ctx: RequestContext) -> str:
    return ctx.api_key_id or ""


# ----------------------------------------------------------------- history -> chat
@dataclass
class History:
    items: list[dict[str, Any]] = field(default_factory=list)
    token_ids: dict[str, list[int]] = field(default_factory=dict)  # assistant message id -> its generated ids


async def load_history(store: Store, owner: str, req: ResponsesRequest) -> History:
    history = History()
    if req.previous_response_id:
        chain: list[StoredResponse] = []
        next_id: str | None = req.previous_response_id
        while next_id and len(chain) < MAX_CHAIN:
            rec = await store.get_response(owner, next_id)
            if rec is None:
                if not chain:
                    raise NotFoundError(f"previous response {next_id!r} not found", param="previous_response_id")
                break  # an older link expired: the context starts after it
            chain.append(rec)
            next_id = rec.previous_response_id
        for rec in reversed(chain):
            history.items += rec.input_items + list(rec.body.get("output") or [])
            history.token_ids.update(rec.output_token_ids)
    elif req.conversation_id:
        conv_id = req.conversation_id
        if await store.get_conversation(owner, conv_id) is None:
            raise NotFoundError(f"conversation {conv_id!r} not found", param="conversation")
        after: str | None = None
        while True:
            page = await store.list_items(owner, conv_id, after=after, limit=CONVERSATION_PAGE)
            for it in page:
                history.items.append(it.item)
                if it.token_ids:
                    history.token_ids[it.id] = it.token_ids
            if len(page) < CONVERSATION_PAGE:
                break
            after = page[-1].id
    return history


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content or [] if isinstance(p, dict))


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as chat messages: function calls join the assistant turn before them,
    their outputs become tool messages, reasoning goes onto the next assistant message."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    reasoning: list[str] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning.append(_text(item.get("content")) or _text(item.get("summary")))
        elif kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"))}
            if role == "assistant" and reasoning:
                msg["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(msg)
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last["content"]):
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                out.append(msg)
        elif kind == "mcp_call":  # a tool the gateway ran: the call and its result
            call = {"id": item["id"], "type": "function", "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"}}
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = item.get("output") if item.get("error") is None else f"Error: {item.get('error')}"
            out.append({"role": "tool", "tool_call_id": item["id"], "content": result or ""})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output if isinstance(output, str) else json.dumps(output)})
    return out


def to_chat(req: ResponsesRequest, messages: list[dict[str, Any]], extra_tools: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat completion of one round; ``extra_tools``: the MCP servers' tools as functions."""
    if req.background and not req.store:
        raise InvalidRequestError("a background response must be stored: background needs store true", param="background")
    if not messages or all(m["role"] == "system" for m in messages):
        raise InvalidRequestError("the request has no input", param="input")
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "parallel_tool_calls": req.parallel_tool_calls,
    }
    if (fmt := req.response_format()) is not None:
        body["response_format"] = fmt
    effort = req.reasoning.effort if req.reasoning else None
    if effort == "none":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif effort is not None:
        body["reasoning_effort"] = effort
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters or {"type": "object"}}}
        for t in req.tools or [] if t.type == "function"
    ] + list(extra_tools or [])
    if tools:
        body["tools"] = tools
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not choice.get("name"):
            raise InvalidRequestError("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        body["tool_choice"] = choice
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None


def seed_replies(entry: ModelEntry, salt: str | None, history: History) -> None:
    """Hand the stored replies' generated ids to the reply-token cache (see the module doc)."""
    cache = entry.reply_cache
    if cache is None or not history.token_ids:
        return
    for item in history.items:
        ids = history.token_ids.get(item.get("id", ""))
        if ids and item.get("type") == "message" and item.get("role") == "assistant":
            cache.record(salt, _text(item.get("content")), ids)


# ----------------------------------------------------------------- output
def _output_item(block: Block, item_ids: dict[int, str], *, done: bool) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    iid = item_ids[block.index]
    if block.kind == "reasoning":
        return {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": block.text}] if done else [], "status": status}
    if block.kind == "text":
        content = [{"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}] if done else []
        return {"type": "message", "id": iid, "role": "assistant", "status": status, "content": content}
    return {"type": "function_call", "id": iid, "call_id": block.call_id or f"call_{random_hex()}", "name": block.name or "", "arguments": block.text if done else "", "status": status}


@dataclass
class Run:
    """One response being made: its request, its id, what it has produced so far."""

    req: ResponsesRequest
    ctx: RequestContext
    entry: ModelEntry
    history: History
    input_items: list[dict[str, Any]]
    turn: Turn | None = None
    id: str = field(default_factory=lambda: f"resp_{random_hex()}")
    created_at: float = field(default_factory=time.time)
    item_ids: dict[int, str] = field(default_factory=dict)  # this round's blocks shown as items
    end: TurnEnd | None = None
    cancelled: bool = False
    error: GatewayError | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)  # this round's chat messages
    mcp: McpTools | None = None
    done_output: list[dict[str, Any]] = field(default_factory=list)  # earlier rounds' items
    past_usage: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # prompt, completion, cached, reasoning
    rounds: int = 1
    out_of_rounds: bool = False

    def body(self, status: str) -> dict[str, Any]:
        req = self.req
        blocks = self.turn.blocks.blocks if self.turn else []
        output = self.done_output + [_output_item(b, self.item_ids, done=True) for b in blocks if b.index in self.item_ids]
        usage = None
        if self.turn is not None and status != "in_progress":
            u = self.turn.gen.usage
            prompt, completion, cached, reasoning = self.past_usage
            reasoning += u.reasoning_tokens or self._reasoning_tokens(blocks)
            prompt, completion, cached = prompt + u.prompt_tokens, completion + u.completion_tokens, cached + u.cached_tokens
            usage = {
                "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": prompt + completion,
            }
        reason = "max_tool_rounds" if self.out_of_rounds else "max_output_tokens"
        incomplete = {"reason": reason} if status == "incomplete" else None
        error = {"code": self.error.code or self.error.type, "message": self.error.message} if self.error else None
        tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
        return {
            "id": self.id, "object": "response", "created_at": int(self.created_at), "status": status,
            "background": req.background, "error": error, "incomplete_details": incomplete,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.entry.name,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": req.conversation_id} if req.conversation_id else None,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store, "temperature": req.temperature, "text": req.text or {"format": {"type": "text"}},
            "tool_choice": tool_choice, "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": req.top_p, "truncation": "disabled", "usage": usage, "user": req.user,
            "metadata": req.metadata or {},
        }

    def _reasoning_tokens(self, blocks: list[Block]) -> int:
        return sum(len(self.entry.tokenizer.encode(b.text, add_special_tokens=False)) for b in blocks if b.kind == "reasoning")

    def final_status(self) -> str:
        if self.cancelled:
            return "cancelled"
        if self.error is not None:
            return "failed"
        if self.out_of_rounds or (self.end is not None and self.end.finish_reason == "length"):
            return "incomplete"
        return "completed"

    def mcp_calls(self) -> list[Block]:
        """This round's calls of MCP tools (run by the gateway), when it made no call the
        client must run (then the response ends there, with every call in it)."""
        if self.mcp is None or self.turn is None:
            return []
        calls = [b for b in self.turn.blocks.blocks if b.kind == "tool_call"]
        if not calls or not all(self.mcp.owns(b.name) for b in calls):
            return []
        return calls

    def next_round(self, results: list[tuple[Block, dict[str, Any]]]) -> None:
        """Fold this round into the earlier ones (its items, usage, chat messages) before
        the next round starts with the tools' results."""
        assert self.turn is not None
        blocks = self.turn.blocks.blocks
        self.done_output += [_output_item(b, self.item_ids, done=True) for b in blocks if b.index in self.item_ids]
        self.done_output += [item for _, item in results]
        u = self.turn.gen.usage
        self.past_usage[0] += u.prompt_tokens
        self.past_usage[1] += u.completion_tokens
        self.past_usage[2] += u.cached_tokens
        self.past_usage[3] += u.reasoning_tokens or self._reasoning_tokens(blocks)
        text = "".join(b.text for b in blocks if b.kind == "text")
        reasoning = "".join(b.text for b in blocks if b.kind == "reasoning")
        assistant: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": [
            {"id": item["id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            for _, item in results
        ]}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        self.messages.append(assistant)
        for _, item in results:
            content = item["output"] if item.get("error") is None else f"Error: {item['error']}"
            self.messages.append({"role": "tool", "tool_call_id": item["id"], "content": content or ""})
        self.item_ids = {}
        self.end = None
        self.rounds += 1

    def reply_ids(self) -> dict[str, list[int]]:
        """The generated ids of the one plain text answer (what the next turn resends)."""
        if self.turn is None or self.done_output:
            return {}
        blocks = self.turn.blocks.blocks
        if len(blocks) != 1 or blocks[0].kind != "text" or blocks[0].index not in self.item_ids:
            return {}
        gen = self.turn.gen
        ends = self.entry.tokenizer.eos_token_ids | frozenset(gen.prepared.stop_plan.token_stops)
        ids = gen.output_ids(0)
        n = len(ids)
        while n and ids[n - 1] in ends:
            n -= 1
        return {self.item_ids[blocks[0].index]: list(ids[:n])} if n else {}


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

    async def begin(self, req: ResponsesRequest, ctx: RequestContext) -> Run:
        """Load the history and start the turn (errors before output raise here)."""
        owner = owner_of(ctx)
        history = await load_history(await self.store(), owner, req) if (req.previous_response_id or req.conversation_id) else History()
        inputs = with_ids(req.input_items())
        messages = chat_messages(req.instructions, history.items + inputs)
        to_chat(req, messages)  # a bad request fails before any MCP server is dialled
        servers = [
            McpServer(t.server_label or "", t.server_url or "", dict(t.headers or {}), t.allowed_names())
            for t in req.tools or [] if t.type == "mcp"
        ]
        mcp = await McpTools.discover(self.mcp, servers) if servers else None
        chat = to_chat(req, messages, mcp.functions() if mcp else None)
        entry = self.engine.catalog.get(chat.model)
        seed_replies(entry, effective_salt(ctx.cache_salt, chat.cache_salt), history)
        run = Run(req, ctx, entry, history, inputs, messages=messages, mcp=mcp)
        if mcp is not None:
            run.done_output = mcp.list_items(lambda: f"mcpl_{random_hex()}")
        run.turn = await start_turn(self.engine, chat, ctx)
        return run

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

    async def open(self, req: ResponsesRequest, ctx: RequestContext) -> Answer | Events:
        """The Responses API's one entry point (``endpoints.events``) for requests that are
        not background runs: the whole response, or the started run's stream events,
        already framed as SSE."""
        if not req.stream:
            return await self.create(req, ctx)
        run = await self.begin(req, ctx)
        self.running[run.id] = run
        assert run.turn is not None
        return Events(sse_stream(self.events(run)), [run.turn.gen])

    async def events(self, run: Run) -> AsyncIterator[dict[str, Any]]:
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
                    for out in _turn_event(run, ev):
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
                await _close(run)
                run.next_round(results)
                chat = to_chat(run.req, run.messages, run.mcp.functions() if run.mcp else None)
                run.turn = await start_turn(self.engine, chat, run.ctx)
        except GatewayError as exc:
            run.error = exc
        finally:
            self.running.pop(run.id, None)
            await _close(run)
        body = await self._finish(run)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}.get(body["status"], "response.incomplete")
        yield event(kind, response=body)

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
            await _close(run)
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


def page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """An OpenAI list page of ``items`` (in order, ``desc`` newest first) after ``after``."""
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after in ids:
            ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {
        "object": "list", "data": data, "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit,
    }


def _turn_event(run: Run, ev: BlockEvent) -> list[dict[str, Any]]:
    """The Responses events of one block event of the current round (calls of MCP tools
    are the gateway's to run: they show as ``mcp_call`` items, not function calls)."""
    if isinstance(ev, TurnEnd):
        run.end = ev
        return []
    block = ev.block
    if block.kind == "tool_call" and run.mcp is not None and run.mcp.owns(block.name):
        return []
    if isinstance(ev, BlockStart):
        run.item_ids[block.index] = item_id(_kind(block))
    iid, at = run.item_ids[block.index], _output_index(run, block)
    if isinstance(ev, BlockStart):
        out = [{"type": "response.output_item.added", "output_index": at, "item": _output_item(block, run.item_ids, done=False)}]
        if block.kind == "text":
            out.append({"type": "response.content_part.added", "item_id": iid, "output_index": at, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})
        return out
    if isinstance(ev, BlockDelta):
        if block.kind == "text":
            return [{"type": "response.output_text.delta", "item_id": iid, "output_index": at, "content_index": 0, "delta": ev.text, "logprobs": []}]
        if block.kind == "reasoning":
            return [{"type": "response.reasoning_text.delta", "item_id": iid, "output_index": at, "content_index": 0, "delta": ev.text}]
        return [{"type": "response.function_call_arguments.delta", "item_id": iid, "output_index": at, "delta": ev.text}]
    if block.kind == "text":
        out = [
            {"type": "response.output_text.done", "item_id": iid, "output_index": at, "content_index": 0, "text": block.text, "logprobs": []},
            {"type": "response.content_part.done", "item_id": iid, "output_index": at, "content_index": 0,
             "part": {"type": "output_text", "text": block.text, "annotations": []}},
        ]
    elif block.kind == "reasoning":
        out = [{"type": "response.reasoning_text.done", "item_id": iid, "output_index": at, "content_index": 0, "text": block.text}]
    else:
        out = [{"type": "response.function_call_arguments.done", "item_id": iid, "output_index": at, "name": block.name, "arguments": block.text}]
    out.append({"type": "response.output_item.done", "output_index": at, "item": _output_item(block, run.item_ids, done=True)})
    return out


def _kind(block: Block) -> str:
    return {"reasoning": "reasoning", "text": "message", "tool_call": "function_call"}[block.kind]


def _output_index(run: Run, block: Block) -> int:
    return len(run.done_output) + sorted(run.item_ids).index(block.index)


async def _close(run: Run) -> None:
    if run.turn is not None:
        aclose = getattr(run.turn.events, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except (RuntimeError, asyncio.CancelledError):  # already running (a cancel from another task)
                pass
