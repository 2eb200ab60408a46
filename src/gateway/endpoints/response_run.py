"""One response being made (``Run``) and its Responses stream events.

A run is one or more rounds (more when the gateway runs MCP tools between them); each
round is a chat turn whose blocks become output items. ``turn_events`` turns a round's
block events into the Responses events (``output_item.added``, the deltas, the dones),
numbered later by ``ResponsesApi.events``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.endpoints.response_history import History, item_id
from gateway.endpoints.turn import (
    Block,
    BlockDelta,
    BlockEvent,
    BlockStart,
    Turn,
    TurnEnd,
)
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.mcp_client import McpTools
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import (
    GatewayError,
)
from gateway.protocol.ids import random_hex
from gateway.protocol.responses import TokenLogprob
from gateway.protocol.responses_api import ResponsesRequest


def logprobs_json(logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat logprobs in the Responses shape (``bytes`` always a list)."""
    def raw(token: str, got: list[int] | None) -> list[int]:
        return got if got is not None else list(token.encode("utf-8"))

    return [{
        "token": lp.token, "logprob": lp.logprob, "bytes": raw(lp.token, lp.bytes),
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": raw(t.token, t.bytes)} for t in lp.top_logprobs],
    } for lp in logprobs]


def _output_item(block: Block, item_ids: dict[int, str], *, done: bool) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    iid = item_ids[block.index]
    if block.kind == "reasoning":
        return {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": block.text}] if done else [], "status": status}
    if block.kind == "text":
        content = [{"type": "output_text", "text": block.text, "annotations": [], "logprobs": logprobs_json(block.logprobs)}] if done else []
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
    preset_ids: list[str] = field(default_factory=list)  # a continued run: its items' ids so far, in order
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
            # A run cut short (its client left) has no final count yet: the tokens it got so far.
            made = u.completion_tokens or sum(u.per_sample_completion.values())
            prompt, completion, cached = prompt + u.prompt_tokens, completion + made, cached + u.cached_tokens
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
            "top_p": req.top_p, "truncation": req.truncation, "usage": usage, "user": req.user,
            "top_logprobs": req.top_logprobs,
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


def turn_events(run: Run, ev: BlockEvent) -> list[dict[str, Any]]:
    """The Responses events of one block event of the current round (calls of MCP tools
    are the gateway's to run: they show as ``mcp_call`` items, not function calls)."""
    if isinstance(ev, TurnEnd):
        run.end = ev
        return []
    block = ev.block
    if block.kind == "tool_call" and run.mcp is not None and run.mcp.owns(block.name):
        return []
    if isinstance(ev, BlockStart):
        run.item_ids[block.index] = run.preset_ids.pop(0) if run.preset_ids else item_id(_kind(block))
    iid, at = run.item_ids[block.index], _output_index(run, block)
    if isinstance(ev, BlockStart):
        out = [{"type": "response.output_item.added", "output_index": at, "item": _output_item(block, run.item_ids, done=False)}]
        if block.kind == "text":
            out.append({"type": "response.content_part.added", "item_id": iid, "output_index": at, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})
        return out
    if isinstance(ev, BlockDelta):
        if block.kind == "text":
            return [{"type": "response.output_text.delta", "item_id": iid, "output_index": at, "content_index": 0, "delta": ev.text,
                     "logprobs": logprobs_json(ev.logprobs) if ev.logprobs else []}]
        if block.kind == "reasoning":
            return [{"type": "response.reasoning_text.delta", "item_id": iid, "output_index": at, "content_index": 0, "delta": ev.text}]
        return [{"type": "response.function_call_arguments.delta", "item_id": iid, "output_index": at, "delta": ev.text}]
    if block.kind == "text":
        out = [
            {"type": "response.output_text.done", "item_id": iid, "output_index": at, "content_index": 0, "text": block.text,
             "logprobs": logprobs_json(block.logprobs)},
            {"type": "response.content_part.done", "item_id": iid, "output_index": at, "content_index": 0,
             "part": {"type": "output_text", "text": block.text, "annotations": [], "logprobs": logprobs_json(block.logprobs)}},
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


async def close_run(run: Run) -> None:
    if run.turn is not None:
        aclose = getattr(run.turn.events, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except (RuntimeError, asyncio.CancelledError):  # already running (a cancel from another task)
                pass
