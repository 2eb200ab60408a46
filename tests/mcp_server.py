"""A real MCP server for tests, built with the official ``mcp`` SDK, on streamable HTTP.

Run as a script: ``python -m tests.mcp_server PORT`` (streamable HTTP) or
``python -m tests.mcp_server stdio``. Its tools answer in the simulated
worker's script marker, so the model's next round says what the tool returned.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("weather")


@app.tool()
def get_weather(city: str) -> str:
    """The weather of a city."""
    return f"<<sim-reply>>It is sunny in {city}.<</sim-reply>>"


@app.tool()
def get_time(zone: str) -> str:
    """The time in a zone (always fails: the model reads the error)."""
    raise ToolError(f"no clock for {zone}")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        app.run("stdio")
    else:
        uvicorn.run(app.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
