"""/v1/messages (Anthropic Messages) on the chat pipeline.

The request becomes a chat completion (``to_chat``): ``system`` a system message,
``tool_use`` blocks an assistant's tool calls, ``tool_result`` blocks tool messages,
``thinking`` blocks the assistant's reasoning, ``stop_sequences`` stop strings and
``thinking`` the template's ``enable_thinking``. The turn runs through the chat
stream (``endpoints.turn``) and its blocks come back as Anthropic content blocks,
whole or as Anthropic's stream events.

Usage: ``input_tokens`` counts the prompt tokens the worker had to compute and
``cache_read_input_tokens`` those its prefix cache held, as Anthropic counts them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from pydantic import ValidationError

from gateway.endpoints.chat_parsers import template_kwargs
from gateway.endpoints.events import Answer, Events
from gateway.endpoints.turn import (
    BlockDelta,
    BlockEvent,
    BlockStart,
    BlockStop,
    Turn,
    TurnEnd,
    start_turn,
)
from gateway.pipeline.engine import Engine
from gateway.pipeline.generation import UsageCounts
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.tenancy import effective_salt
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.errors import GatewayError, InvalidRequestError, validation_error_to_gateway
from gateway.protocol.messages import MessagesRequest, anthropic_error
from gateway.protocol.responses import new_id


def _chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = req.system_text()
    if system:
        out.append({"role": "system", "content": system})
    for m in req.messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        if m.role == "user":
            texts: list[str] = []
            for b in m.content:
                if b.type == "tool_result":
                    if not b.tool_use_id:
                        raise InvalidRequestError("a tool_result block needs tool_use_id", param="messages")
                    text = b.plain_text()
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": f"Error: {text}" if b.is_error else text})
                elif b.type == "text":
                    texts.append(b.text or "")
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
            continue
        reasoning = "".join(b.thinking or "" for b in m.content if b.type == "thinking")
        content = "".join(b.text or "" for b in m.content if b.type == "text")
        calls = [
            {"id": b.id or new_id("toolu"), "type": "function", "function": {"name": b.name or "", "arguments": json.dumps(b.input or {})}}
            for b in m.content if b.type == "tool_use"
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        if reasoning:
            msg["reasoning_content"] = reasoning
        out.append(msg)
    return out


def to_chat(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat completion this Messages request is."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _chat_messages(req),
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences or None,
        "chat_template_kwargs": {"enable_thinking": req.thinking is not None and req.thinking.type != "disabled"},
    }
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in req.tools
        ]
        choice = req.tool_choice
        if choice is not None:
            if choice.type == "tool":
                if not choice.name:
                    raise InvalidRequestError("tool_choice of type 'tool' needs a name", param="tool_choice")
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            else:
                body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
            body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None


def _stop_reason(end: TurnEnd | None, req: MessagesRequest, used_tools: bool) -> tuple[str, str | None]:
    if end is None:
        return "end_turn", None
    if used_tools or end.finish_reason == "tool_calls":
        return "tool_use", None
    if end.finish_reason == "length":
        return "max_tokens", None
    if isinstance(end.matched_stop, str) and end.matched_stop in (req.stop_sequences or ()):
        return "stop_sequence", end.matched_stop
    return "end_turn", None


def _usage(u: UsageCounts) -> dict[str, Any]:
    return {
        "input_tokens": max(0, u.prompt_tokens - u.cached_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _start_block(event: BlockStart) -> dict[str, Any]:
    block = event.block
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": ""}
    return {"type": "tool_use", "id": block.call_id or new_id("toolu"), "name": block.name or "", "input": {}}


def _whole_block(kind: str, text: str, call_id: str | None, name: str | None) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "thinking", "thinking": text, "signature": ""}
    if kind == "text":
        return {"type": "text", "text": text}
    return {"type": "tool_use", "id": call_id or new_id("toolu"), "name": name or "", "input": _tool_input(text)}


async def create_message(engine: Engine, req: MessagesRequest, ctx: RequestContext) -> dict[str, Any]:
    turn = await start_turn(engine, to_chat(req), ctx)
    end: TurnEnd | None = None
    async for event in turn.events:
        if isinstance(event, TurnEnd):
            end = event
    blocks = turn.blocks.blocks
    used_tools = any(b.kind == "tool_call" for b in blocks)
    stop_reason, stop_sequence = _stop_reason(end, req, used_tools)
    return {
        "id": ctx.response_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": turn.gen.prepared.model,
        "content": [_whole_block(b.kind, b.text, b.call_id, b.name) for b in blocks],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(turn.gen.usage),
    }


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One Anthropic stream event: its name and its JSON (which repeats the name as ``type``)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def open(engine: Engine, req: MessagesRequest, ctx: RequestContext) -> Answer | Events:
    """The Messages API's one entry point (``endpoints.events``): the whole message, or
    for ``stream`` the started turn's Anthropic stream events, already framed: message_start,
    ping, a content_block_start/delta/stop run per block, message_delta (stop reason,
    final usage), message_stop; a failure after the start is an ``error`` event."""
    if not req.stream:
        return await create_message(engine, req, ctx)
    turn = await start_turn(engine, to_chat(req), ctx)
    return Events(_stream(turn, req, ctx), [turn.gen])


async def _stream(turn: Turn, req: MessagesRequest, ctx: RequestContext) -> AsyncGenerator[bytes, None]:
    gen = turn.gen
    start_usage = {**_usage(gen.usage), "output_tokens": 0}
    yield sse("message_start", {"type": "message_start", "message": {
        "id": ctx.response_id("msg"), "type": "message", "role": "assistant", "model": gen.prepared.model,
        "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage,
    }})
    yield sse("ping", {"type": "ping"})
    end: TurnEnd | None = None
    used_tools = False
    try:
        async for event in turn.events:
            yield_event = _stream_event(event)
            if isinstance(event, TurnEnd):
                end = event
            elif isinstance(event, BlockStart) and event.block.kind == "tool_call":
                used_tools = True
            if yield_event is not None:
                yield yield_event
    except GatewayError as exc:
        yield sse("error", anthropic_error(exc))
        return
    finally:
        await _close(turn)
    stop_reason, stop_sequence = _stop_reason(end, req, used_tools)
    yield sse("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": _usage(gen.usage),
    })
    yield sse("message_stop", {"type": "message_stop"})


async def _close(turn: Turn) -> None:
    aclose = getattr(turn.events, "aclose", None)
    if aclose is not None:
        await aclose()


def _stream_event(event: BlockEvent) -> bytes | None:
    if isinstance(event, BlockStart):
        return sse("content_block_start", {"type": "content_block_start", "index": event.block.index, "content_block": _start_block(event)})
    if isinstance(event, BlockDelta):
        kind = event.block.kind
        if kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": event.text}
        elif kind == "text":
            delta = {"type": "text_delta", "text": event.text}
        else:
            delta = {"type": "input_json_delta", "partial_json": event.text}
        return sse("content_block_delta", {"type": "content_block_delta", "index": event.block.index, "delta": delta})
    if isinstance(event, BlockStop):
        return sse("content_block_stop", {"type": "content_block_stop", "index": event.block.index})
    return None


async def count_tokens(engine: Engine, req: MessagesRequest, ctx: RequestContext) -> dict[str, Any]:
    """The prompt's token count as the model will see it (template, tools and the
    tenant's salt prefix, as for the request itself)."""
    chat = to_chat(req)
    entry = engine.catalog.get(chat.model)
    salt = effective_salt(ctx.cache_salt, chat.cache_salt)
    _, ids = await engine.render_chat(
        entry, chat.template_messages(), tools=chat.template_tools(),
        chat_template_kwargs=template_kwargs(chat) or None, cache_salt=salt,
    )
    return {"input_tokens": len(ids)}
