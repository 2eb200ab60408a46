"""MCP servers a Responses request names: list their tools, call them (official ``mcp`` SDK).

The gateway dials only the URLs the operator allows (``--mcp-allowed-urls``, prefixes):
a client-supplied ``server_url`` would otherwise make the gateway a proxy into its own
network. Local servers run over stdio only as the operator configures them
(``--mcp-stdio-servers LABEL=COMMAND``); a request names one by its label alone. Each listing and each call opens its own streamable-HTTP session and closes it
in the same task (the SDK's transport is a task group that must end where it began),
under ``--mcp-timeout-s``. The ``mcp`` package is an optional extra, imported here only.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import shlex
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.protocol.errors import InvalidRequestError
from gateway.settings import option

T = TypeVar("T")


@dataclass
class McpConfig:
    mcp_allowed_urls: list[str] = option([], "MCP server URL prefixes a Responses request may name in an 'mcp' tool (none: MCP tools are refused)")
    mcp_max_rounds: int = option(8, "model/tool rounds of one response at most; past that it ends as incomplete")
    mcp_timeout_s: float = option(60.0, "time one MCP listing or tool call may take, seconds")
    mcp_stdio_servers: list[str] = option([], "local MCP servers over stdio, each 'LABEL=COMMAND ARG...'; a request names one as {\"type\": \"mcp\", \"server_label\": LABEL} without server_url")

    def stdio_command(self, label: str) -> list[str] | None:
        """The command of the stdio server configured under ``label``, if any."""
        for spec in self.mcp_stdio_servers:
            name, _, command = spec.partition("=")
            if name.strip() == label and command.strip():
                return shlex.split(command)
        return None


@dataclass
class McpServer:
    """One ``{"type": "mcp"}`` tool of a request."""

    label: str
    url: str | None  # None: an operator-configured stdio server (``command``)
    headers: dict[str, str] = field(default_factory=dict)
    allowed_tools: list[str] | None = None
    command: list[str] | None = None


@dataclass
class McpTool:
    server: McpServer
    name: str
    description: str | None
    input_schema: dict[str, Any]


class McpTools:
    """The tools of a request's MCP servers, by name."""

    def __init__(self, config: McpConfig, tools: list[McpTool]) -> None:
        self.config = config
        self.tools = {t.name: t for t in tools}

    @classmethod
    async def discover(cls, config: McpConfig, servers: list[McpServer]) -> McpTools:
        for server in servers:
            if server.url is None:
                server.command = config.stdio_command(server.label)
                if server.command is None:
                    raise InvalidRequestError(
                        f"no MCP server is configured under the label {server.label!r} (give server_url, or see --mcp-stdio-servers)",
                        param="tools",
                    )
            elif not any(server.url.startswith(prefix) for prefix in config.mcp_allowed_urls):
                raise InvalidRequestError(
                    f"MCP server {server.url!r} is not allowed on this gateway (--mcp-allowed-urls)", param="tools",
                )
        found: list[McpTool] = []
        for server in servers:
            try:
                listed = await _apart(_list_tools(server, config.mcp_timeout_s))
            except InvalidRequestError:
                raise
            except Exception as exc:
                raise InvalidRequestError(f"MCP server {server.label!r} could not list its tools: {exc}", param="tools") from exc
            for tool in listed.tools:
                if server.allowed_tools is None or tool.name in server.allowed_tools:
                    found.append(McpTool(server, tool.name, tool.description, dict(tool.input_schema or {"type": "object"})))
        names = [t.name for t in found]
        if len(set(names)) != len(names):
            raise InvalidRequestError("two MCP servers offer a tool of the same name; narrow allowed_tools", param="tools")
        return cls(config, found)

    def owns(self, name: str | None) -> bool:
        return name is not None and name in self.tools

    def functions(self) -> list[dict[str, Any]]:
        """The tools as chat function tools (what the model is shown)."""
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in self.tools.values()
        ]

    def list_items(self, new_id: Any) -> list[dict[str, Any]]:
        """One ``mcp_list_tools`` output item per server."""
        by_server: dict[str, list[McpTool]] = {}
        for t in self.tools.values():
            by_server.setdefault(t.server.label, []).append(t)
        return [
            {"type": "mcp_list_tools", "id": new_id(), "server_label": label,
             "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]}
            for label, tools in by_server.items()
        ]

    async def call(self, name: str, arguments: str) -> tuple[str | None, str | None]:
        """(output text, None) or (None, error text): a failing tool is the model's to read,
        never the request's failure."""
        tool = self.tools[name]
        try:
            args = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(args, dict):
                return None, "the arguments are not a JSON object"
        except ValueError:
            return None, "the arguments are not valid JSON"
        try:
            result = await _apart(_call_tool(tool.server, name, args, self.config.mcp_timeout_s))
        except TimeoutError:
            return None, f"the tool did not answer within {self.config.mcp_timeout_s} s"
        except Exception as exc:
            return None, f"the tool call failed: {exc}"
        text = "".join(getattr(part, "text", "") for part in result.content)
        return (None, text or "the tool failed") if result.is_error else (text, None)


async def _list_tools(server: McpServer, timeout_s: float) -> Any:
    async with asyncio.timeout(timeout_s), _session(server) as session:
        return await session.list_tools()


async def _call_tool(server: McpServer, name: str, args: dict[str, Any], timeout_s: float) -> Any:
    async with asyncio.timeout(timeout_s), _session(server) as session:
        return await session.call_tool(name, args)


async def _apart(exchange: Coroutine[Any, Any, T]) -> T:
    """Run one MCP exchange in a task with an empty context. The SDK's task groups (anyio)
    leave a cancelled task in a reference cycle for each session they close; that task's
    context would be the request's (its log record, its span), kept with the cycle until a
    rare full collection (``gc_policy``). A cancelled caller cancels the task."""
    return await asyncio.get_running_loop().create_task(exchange, context=contextvars.Context())


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[Any]:
    try:
        import httpx2
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
    except ImportError as exc:
        raise InvalidRequestError("MCP tools need the gateway's 'mcp' extra", param="tools") from exc
    if server.command is not None:
        params = StdioServerParameters(command=server.command[0], args=server.command[1:])
        async with stdio_client(params) as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            yield session
        return
    assert server.url is not None
    async with httpx2.AsyncClient(headers=server.headers, timeout=30) as http, \
            streamable_http_client(server.url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session
