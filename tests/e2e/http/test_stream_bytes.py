"""The streamed bytes on the wire do not depend on how the detokenizer finds its texts: the
byte path (``tokenization.token_bytes``) and ``DecodeStream`` give the same SSE events,
byte for byte, for unicode, a think block, tool calls, logprobs, usage and n>1."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gateway.tokenization import Tokenizer
from tests.e2e.http.conftest import Stack

_NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
# What differs between two runs of one request: its id and its time.
_VOLATILE = re.compile(rb'"(id|created|system_fingerprint)":("[^"]*"|\d+)')


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"please answer <<sim-reply>>{text}<</sim-reply>>"}]


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": _reply("Grüße, 世界! 👩‍👩‍👧‍👦 naïve café \ufffd ok"), "max_tokens": 60, **_NO_THINK}),
    ("/v1/chat/completions", {"messages": _reply("<think>Let me think: 2+2.</think>The answer is 4 ✓."), "max_tokens": 60,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": _reply('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'),
                              "tools": _TOOLS, "max_tokens": 80, **_NO_THINK}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 12, "seed": 5,
                              "logprobs": True, "top_logprobs": 2, "ignore_eos": True, "stream_options": {"include_usage": True},
                              **_NO_THINK}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "seed": 7, "ignore_eos": True,
                         "stream_options": {"include_usage": True}}),
]


async def _streams(stack: Stack) -> list[bytes]:
    out = []
    for path, body in REQUESTS:
        response = await stack.http.post(path, json={"model": stack.model, "stream": True, **body})
        assert response.status_code == 200, response.text
        out.append(_VOLATILE.sub(rb'"\1":0', response.content))
    return out


async def test_byte_path_and_decode_stream_send_the_same_bytes(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = stack.state.catalog.get(stack.model).tokenizer
    assert tokenizer.token_bytes(True) is not None  # the byte path is the one that serves by default
    fast = await _streams(stack)
    monkeypatch.setattr(Tokenizer, "token_bytes", lambda self, skip: None)
    reference = await _streams(stack)
    assert fast == reference
    events = [json.loads(line[6:]) for line in fast[0].split(b"\n\n") if line.startswith(b"data: {")]
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert content == "Grüße, 世界! 👩‍👩‍👧‍👦 naïve café \ufffd ok"  # the stream carried the multi-byte text
    assert len(events) > 5
