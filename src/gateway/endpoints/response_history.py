"""A Responses request's context as chat messages: its stored history and its input.

The history is the ``previous_response_id`` chain (each link's input items and output)
or the ``conversation``'s items; ``instructions`` become a system message. Items are
turned into chat messages (function calls join the assistant turn before them, their
outputs and the gateway's MCP calls become tool messages), then into the chat request
of one round. ``seed_replies`` hands the stored replies' generated ids to the model's
reply-token cache, so the prompt is tokenized as the worker cached it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.store.base import Store, StoredResponse
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.errors import (
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
    try:
        return ChatCompletionRequest.model_validate(chat_body(req, messages, extra_tools))
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None


def chat_body(req: ResponsesRequest, messages: list[dict[str, Any]], extra_tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``to_chat``'s request as the chat API's JSON body (validated by the caller)."""
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
    if req.seed is not None:
        body["seed"] = req.seed
    if req.logprobs:
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
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
    return body


# The engine's refusals of a prompt too long for the model or the gateway.
TOO_LONG = frozenset({"context_length_exceeded", "prompt_too_long"})


def drop_oldest(messages: list[dict[str, Any]]) -> bool:
    """Drop the oldest turn of a context (``truncation: auto``): its first message after
    the system ones, then any that would open the context on a reply rather than a user
    message (an assistant turn, a tool result cut from its call). Keeps the last message;
    False when nothing more can go."""
    first = next((n for n, m in enumerate(messages) if m["role"] != "system"), len(messages))
    if len(messages) - first <= 1:
        return False
    del messages[first]
    while len(messages) - first > 1 and messages[first]["role"] not in ("user", "system"):
        del messages[first]
    return True


def seed_replies(entry: ModelEntry, salt: str | None, history: History) -> None:
    """Hand the stored replies' generated ids to the reply-token cache (see the module doc)."""
    cache = entry.reply_cache
    if cache is None or not history.token_ids:
        return
    for item in history.items:
        ids = history.token_ids.get(item.get("id", ""))
        if ids and item.get("type") == "message" and item.get("role") == "assistant":
            cache.record(salt, _text(item.get("content")), ids)


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
