"""MCP tools in Responses: the gateway lists a real MCP server's tools (official ``mcp``
SDK, streamable HTTP, a separate process), runs the model/tool loop and stores its items."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.cycles import assert_leaves_no_cycle, thaw
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

ROOT = Path(__file__).resolve().parents[3]


def _scripted(text: str) -> str:
    return f"please answer <<sim-reply>>{text}<</sim-reply>>"


def _call(name: str, args: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tests.mcp_server", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _tool(url: str, **kw: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "require_approval": "never", **kw}


@pytest.fixture
async def mcp_stack(tmp_path: Any, mcp_url: str) -> AsyncIterator[Stack]:
    opts = StackOptions(workers=1, sections={"mcp": {"mcp_allowed_urls": [mcp_url], "mcp_max_rounds": 3}})
    async with start_stack(opts, tmp_path) as stack:
        yield stack


@pytest.mark.parametrize("stream", [False, True])
async def test_the_gateway_runs_the_tool_loop(mcp_stack: Stack, mcp_url: str, stream: bool) -> None:
    c, model = mcp_stack.client, mcp_stack.model
    kwargs: dict[str, Any] = {"model": model, "input": _scripted(_call("get_weather", {"city": "Paris"})), "tools": [_tool(mcp_url)]}
    if stream:
        events = [e async for e in await c.responses.create(stream=True, **kwargs)]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        added = [e.item.type for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
        assert added == ["mcp_list_tools", "mcp_call", "message"]
        resp = events[-1].response  # type: ignore[union-attr]
    else:
        resp = await c.responses.create(**kwargs)
    assert [o.type for o in resp.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed, call = resp.output[0], resp.output[1]
    assert sorted(t.name for t in listed.tools) == ["get_time", "get_weather"]  # type: ignore[union-attr]
    assert (call.name, json.loads(call.arguments), call.error) == ("get_weather", {"city": "Paris"}, None)  # type: ignore[union-attr]
    assert "sunny in Paris" in (call.output or "")  # type: ignore[union-attr]
    assert resp.output_text == "It is sunny in Paris." and resp.status == "completed"
    assert resp.usage is not None and resp.usage.output_tokens > 0
    stored = await c.responses.retrieve(resp.id)
    assert [o.type for o in stored.output] == ["mcp_list_tools", "mcp_call", "message"]
    # the stored call is history for the next turn
    follow = await c.responses.create(model=model, previous_response_id=resp.id, input=_scripted("Noted."))
    assert follow.output_text == "Noted."


async def test_allowed_tools_errors_and_round_limit(mcp_stack: Stack, mcp_url: str) -> None:
    c, model = mcp_stack.client, mcp_stack.model
    only = await c.responses.create(model=model, input=_scripted("fine"), tools=[_tool(mcp_url, allowed_tools=["get_weather"])])  # type: ignore[list-item]
    assert [t.name for t in only.output[0].tools] == ["get_weather"]  # type: ignore[union-attr]
    # a failing tool: its error goes to the model, the response completes
    failing = await c.responses.create(model=model, input=_scripted(_call("get_time", {"zone": "CET"})), tools=[_tool(mcp_url)])  # type: ignore[list-item]
    call = failing.output[1]
    assert call.type == "mcp_call" and "no clock for CET" in (call.error or "")  # type: ignore[union-attr]
    # the model asks again and again: the loop stops after --mcp-max-rounds
    loop = await c.responses.create(model=model, input=_scripted(_call("get_time", {"zone": "CET"})), tools=[_tool(mcp_url)])  # type: ignore[list-item]
    assert loop.status == "incomplete" and loop.incomplete_details.reason == "max_tool_rounds"  # type: ignore[union-attr, comparison-overlap]
    assert sum(o.type == "mcp_call" for o in loop.output) == 2  # rounds 1 and 2 ran theirs; round 3 is the last


async def test_servers_the_operator_did_not_allow_are_refused(mcp_stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError, match="not allowed"):
        await mcp_stack.client.responses.create(model=mcp_stack.model, input="x", tools=[_tool("http://127.0.0.1:9/mcp")])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="require_approval"):
        await mcp_stack.client.responses.create(
            model=mcp_stack.model, input="x", tools=[{**_tool("http://127.0.0.1:9/mcp"), "require_approval": "always"}],  # type: ignore[list-item]
        )


async def test_an_operator_configured_stdio_server(tmp_path: Any) -> None:
    """A local server the operator configures runs over stdio; a request names it by label."""
    spec = f"local={sys.executable} -m tests.mcp_server stdio"
    opts = StackOptions(workers=1, sections={"mcp": {"mcp_stdio_servers": [spec]}})
    async with start_stack(opts, tmp_path) as stack:
        resp = await stack.client.responses.create(
            model=stack.model, input=_scripted(_call("get_weather", {"city": "Oslo"})),
            tools=[{"type": "mcp", "server_label": "local", "require_approval": "never"}],  # type: ignore[list-item]
        )
        assert [o.type for o in resp.output] == ["mcp_list_tools", "mcp_call", "message"]
        assert resp.output_text == "It is sunny in Oslo."
        with pytest.raises(openai.BadRequestError, match="no MCP server is configured"):
            await stack.client.responses.create(model=stack.model, input="x", tools=[{"type": "mcp", "server_label": "other"}])  # type: ignore[list-item]


async def test_the_tool_loop_leaves_no_cycle(mcp_stack: Stack, mcp_url: str) -> None:
    """A tool loop that succeeds, one whose tool fails, one cut at the round limit,
    streamed and not: none leaves the gateway's objects in a reference cycle."""
    c, model = mcp_stack.client, mcp_stack.model
    cases = {
        "tool answers": _scripted(_call("get_weather", {"city": "Paris"})),
        "tool fails, rounds run out": _scripted(_call("get_time", {"zone": "CET"})),
    }
    try:
        for name, prompt in cases.items():
            async def whole(prompt: str = prompt) -> None:
                await c.responses.create(model=model, input=prompt, tools=[_tool(mcp_url)])  # type: ignore[list-item]

            async def streamed(prompt: str = prompt) -> None:
                async for _ in await c.responses.create(model=model, input=prompt, tools=[_tool(mcp_url)], stream=True):  # type: ignore[list-item]
                    pass

            for how, run in (("whole", whole), ("streamed", streamed)):
                try:
                    await assert_leaves_no_cycle(run)
                except AssertionError as exc:
                    raise AssertionError(f"{name}, {how}: {exc}") from None
    finally:
        thaw()
