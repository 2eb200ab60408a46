"""The parser debugging routes (server/http/parse.py): a model's text through a named
parser, over HTTP, with the inference key and the error shape of every route."""

from __future__ import annotations

import json

from gateway.server.config import GatewayConfig
from tests.server.http.gateway_app import bearer, gateway

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


async def test_tool_calls_and_reasoning_are_parsed() -> None:
    async with gateway() as (_, client):
        text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        r = await client.post("/parse/tool_calls", json={"text": text, "parser": "qwen25", "tools": [TOOL]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["content"] == "Let me check."
        assert [(c["name"], json.loads(c["arguments"])) for c in body["tool_calls"]] == [("get_weather", {"city": "Paris"})]
        r = await client.post("/parse/reasoning", json={"text": "<think>hmm</think>answer", "parser": "qwen3"})
        assert r.json() == {"reasoning_content": "hmm", "content": "answer"}


async def test_bad_requests_get_a_400_naming_the_field() -> None:
    async with gateway() as (_, client):
        unknown = await client.post("/parse/tool_calls", json={"text": "x", "parser": "nope"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "parser"
        missing = await client.post("/parse/reasoning", json={"parser": "qwen3"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "text"
        assert (await client.post("/parse/reasoning", content=b"{oops")).status_code == 400


async def test_the_routes_take_the_inference_key() -> None:
    config = GatewayConfig()
    config.server.api_keys = ["k1"]
    async with gateway(config) as (_, client):
        body = {"text": "<think>a</think>b", "parser": "qwen3"}
        assert (await client.post("/parse/reasoning", json=body)).status_code == 401
        assert (await client.post("/parse/reasoning", json=body, headers=bearer("k1"))).status_code == 200
