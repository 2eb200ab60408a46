"""MCP tools: only allowed servers are dialled; bad arguments never reach a server; the
tools' shapes for the model and for the output (the real server is in tests/e2e)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from gateway.pipeline import mcp_client
from gateway.pipeline.mcp_client import McpConfig, McpServer, McpTool, McpTools
from gateway.protocol.errors import InvalidRequestError


async def test_servers_outside_the_allowed_prefixes_are_refused() -> None:
    config = McpConfig(mcp_allowed_urls=["http://127.0.0.1:1/"])
    with pytest.raises(InvalidRequestError, match="not allowed"):
        await McpTools.discover(config, [McpServer("s", "http://10.0.0.1/mcp")])
    with pytest.raises(InvalidRequestError, match="not allowed"):
        await McpTools.discover(McpConfig(), [McpServer("s", "http://127.0.0.1:1/mcp")])  # none allowed by default


async def test_a_server_that_is_not_there_is_a_clean_error() -> None:
    config = McpConfig(mcp_allowed_urls=["http://127.0.0.1:9/"], mcp_timeout_s=5)
    with pytest.raises(InvalidRequestError, match="could not list its tools"):
        await McpTools.discover(config, [McpServer("s", "http://127.0.0.1:9/mcp")])


async def test_tool_shapes_and_bad_arguments() -> None:
    server = McpServer("weather", "http://127.0.0.1:9/mcp")
    tools = McpTools(McpConfig(), [McpTool(server, "get_weather", "weather", {"type": "object"})])
    assert tools.owns("get_weather") and not tools.owns("other") and not tools.owns(None)
    assert tools.functions() == [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {"type": "object"}}}]
    [listed] = tools.list_items(lambda: "mcpl_1")
    assert listed == {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "weather",
                      "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}]}
    assert await tools.call("get_weather", "{not json") == (None, "the arguments are not valid JSON")
    assert await tools.call("get_weather", "[1]") == (None, "the arguments are not a JSON object")


def test_stdio_servers_by_label() -> None:
    config = McpConfig(mcp_stdio_servers=["local=python -m tools.server --flag 'a b'", "bad"])
    assert config.stdio_command("local") == ["python", "-m", "tools.server", "--flag", "a b"]
    assert config.stdio_command("bad") is None and config.stdio_command("other") is None


async def test_an_unconfigured_label_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="no MCP server is configured"):
        await McpTools.discover(McpConfig(), [McpServer("nowhere", None)])


_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="nothing")


async def test_an_exchange_runs_apart_from_the_request_context_and_ends_with_its_caller() -> None:
    async def reads() -> str:
        return _SEEN.get()

    _SEEN.set("the request's record")
    assert await mcp_client._apart(reads()) == "nothing"  # the request's context does not reach it
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def waits() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(mcp_client._apart(waits()))
    await started.wait()
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    assert cancelled.is_set()
