"""A run's block events as Responses events and items; MCP calls kept out of sight; the
status and incomplete reason a run ends with."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.endpoints.response_history import History
from gateway.endpoints.response_run import Run, turn_events
from gateway.endpoints.turn import Block, BlockDelta, BlockStart, BlockStop, TurnEnd
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.mcp_client import McpConfig, McpServer, McpTool, McpTools
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.responses_api import ResponsesRequest
from gateway.tokenization import ChatPromptCache, Tokenizer
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def entry() -> ModelEntry:
    tokenizer = Tokenizer.from_path(qwen_files())
    return ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer))


def _run(entry: ModelEntry, **kw: Any) -> Run:
    return Run(ResponsesRequest.model_validate({"input": "x"}), RequestContext(), entry, History(), [], **kw)


def test_a_text_block_becomes_a_message_item_with_its_events(entry: ModelEntry) -> None:
    run = _run(entry)
    block = Block(0, "text")
    out = turn_events(run, BlockStart(block))
    assert [e["type"] for e in out] == ["response.output_item.added", "response.content_part.added"]
    assert out[0]["item"]["type"] == "message" and out[0]["item"]["status"] == "in_progress" and out[0]["output_index"] == 0
    block.text = "Hi"
    [delta] = turn_events(run, BlockDelta(block, "Hi"))
    assert (delta["type"], delta["delta"], delta["item_id"]) == ("response.output_text.delta", "Hi", out[0]["item"]["id"])
    done = turn_events(run, BlockStop(block))
    assert [e["type"] for e in done] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert done[-1]["item"]["content"][0]["text"] == "Hi" and done[-1]["item"]["status"] == "completed"
    assert turn_events(run, TurnEnd("length", None)) == [] and run.final_status() == "incomplete"
    assert run.body("incomplete")["incomplete_details"] == {"reason": "max_output_tokens"}


def test_calls_of_mcp_tools_are_not_function_call_items(entry: ModelEntry) -> None:
    server = McpServer("s", "http://127.0.0.1:9/mcp")
    run = _run(entry, mcp=McpTools(McpConfig(), [McpTool(server, "lookup", None, {"type": "object"})]))
    run.done_output = [{"type": "mcp_list_tools", "id": "l"}]
    mine, client = Block(0, "tool_call", call_id="c1", name="lookup"), Block(1, "tool_call", call_id="c2", name="theirs")
    assert turn_events(run, BlockStart(mine)) == []
    [added] = turn_events(run, BlockStart(client))
    assert added["item"]["type"] == "function_call" and added["output_index"] == 1  # after the tool list
    assert list(run.item_ids) == [1]  # only the client's call is an output item of this round


def test_final_status(entry: ModelEntry) -> None:
    run = _run(entry)
    assert run.final_status() == "completed"
    run.out_of_rounds = True
    assert run.final_status() == "incomplete" and run.body("incomplete")["incomplete_details"] == {"reason": "max_tool_rounds"}
    run.cancelled = True
    assert run.final_status() == "cancelled"
