"""Malformed and hostile requests on every endpoint: the right 4xx, OpenAI error shape, no harm done.

One gateway (with API keys and a small body limit) serves the whole table; after
every case it must still answer /health, and at the end a normal request must
succeed with every load counter back at zero. tests/e2e/http/test_chat.py covers a
few chat cases through the default stack; this table covers the rest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.http.conftest import Stack, StackOptions, start_stack

KEY = "sk-test-key"
MAX_BODY = 64 * 1024
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Case:
    id: str
    path: str
    body: Any  # bytes are sent as they are; anything else as JSON
    status: int
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    param: str | None = None  # the error's "param", when the gateway can name it

    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


POSTS = {
    "/v1/chat/completions": {"messages": MSG, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/embeddings": {"input": "hi"},
    "/v1/tokenize": {"prompt": "hi"},
    "/v1/detokenize": {"tokens": [1, 2]},
}


def _every_endpoint() -> list[Case]:
    """Framing, encoding, size and auth faults, the same for every POST endpoint."""
    cases: list[Case] = []
    deep = b"[" * 5000 + b"]" * 5000
    for path, good in POSTS.items():
        name = path.strip("/").replace("/", "_")
        ok = json.dumps(good).encode()
        cases += [
            Case(f"{name}-no-auth", path, good, 401, headers={"content-type": "application/json"}),
            Case(f"{name}-wrong-key", path, good, 401, headers={"authorization": "Bearer sk-wrong"}),
            Case(f"{name}-basic-auth", path, good, 401, headers={"authorization": f"Basic {KEY}"}),
            Case(f"{name}-empty-bearer", path, good, 401, headers={"authorization": "Bearer"}),
            Case(f"{name}-broken-json", path, b'{"model": ', 400),
            Case(f"{name}-trailing-garbage", path, ok + b"}}", 400),
            Case(f"{name}-empty-body", path, b"", 400),
            Case(f"{name}-array", path, b"[1, 2]", 400),
            Case(f"{name}-string", path, b'"hello"', 400),
            Case(f"{name}-null", path, b"null", 400),
            Case(f"{name}-invalid-utf8", path, ok[:-1] + b', "x": "\xff\xfe"}', 400),
            Case(f"{name}-lone-surrogate", path, ok[:-1] + b', "x": "\\ud800"}', 400),
            Case(f"{name}-too-deep", path, deep, 400),
            Case(f"{name}-oversized", path, b'{"x": "' + b"a" * (MAX_BODY + 10) + b'"}', 413),
            Case(f"{name}-unknown-model", path, {**good, "model": "no-such-model"}, 404) if path != "/generate" else
            Case(f"{name}-rid-not-string", path, {**good, "rid": 5}, 400),
        ]
    return cases


HUGE = 10**30
SPECIFIC = [
    # chat
    Case("chat-messages-not-list", "/v1/chat/completions", {"messages": "hi"}, 400, param="messages"),
    Case("chat-bad-role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    Case("chat-content-int", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    Case("chat-top-p-5", "/v1/chat/completions", {"messages": MSG, "top_p": 5}, 400),
    Case("chat-temperature-nan", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
    Case("chat-n-huge", "/v1/chat/completions", {"messages": MSG, "n": HUGE}, 400),
    Case("chat-max-tokens-negative", "/v1/chat/completions", {"messages": MSG, "max_tokens": -1}, 400),
    Case("chat-seed-huge", "/v1/chat/completions", {"messages": MSG, "seed": HUGE}, 400),
    Case("chat-stream-list", "/v1/chat/completions", {"messages": MSG, "stream": [1]}, 400),
    Case("chat-many-stops", "/v1/chat/completions", {"messages": MSG, "stop": [f"s{i}" for i in range(1000)]}, 400),
    Case("chat-stop-int", "/v1/chat/completions", {"messages": MSG, "stop": 7}, 400),
    Case("chat-logit-bias-bad", "/v1/chat/completions", {"messages": MSG, "logit_bias": {"abc": 1}}, 400),
    Case("chat-top-logprobs-huge", "/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 10_000}, 400),
    Case("chat-tools-not-list", "/v1/chat/completions", {"messages": MSG, "tools": "all"}, 400),
    Case("chat-model-int", "/v1/chat/completions", {"messages": MSG, "model": 5}, 400),
    # completions
    Case("cmpl-no-prompt", "/v1/completions", {"max_tokens": 2}, 400),
    Case("cmpl-prompt-int", "/v1/completions", {"prompt": 5}, 400),
    Case("cmpl-prompt-dict", "/v1/completions", {"prompt": {"a": 1}}, 400),
    Case("cmpl-negative-ids", "/v1/completions", {"prompt": [-1, 5]}, 400),
    Case("cmpl-ids-past-vocab", "/v1/completions", {"prompt": [10**9]}, 400),
    Case("cmpl-ids-huge", "/v1/completions", {"prompt": [HUGE]}, 400),
    Case("cmpl-empty-prompt-list", "/v1/completions", {"prompt": []}, 400),
    Case("cmpl-empty-inner", "/v1/completions", {"prompt": [[]]}, 400),
    Case("cmpl-n-zero", "/v1/completions", {"prompt": "x", "n": 0}, 400),
    Case("cmpl-max-tokens-past-context", "/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400),
    Case("cmpl-logprobs-huge", "/v1/completions", {"prompt": "x", "logprobs": 10_000}, 400),
    Case("cmpl-echo-string", "/v1/completions", {"prompt": "x", "echo": "sure"}, 400),
    # generate
    Case("gen-no-input", "/generate", {"sampling_params": {}}, 400),
    Case("gen-sampling-not-dict", "/generate", {"text": "x", "sampling_params": "hot"}, 400),
    Case("gen-max-new-negative", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, 400),
    Case("gen-temperature-negative", "/generate", {"text": "x", "sampling_params": {"temperature": -1}}, 400),
    Case("gen-ids-past-vocab", "/generate", {"input_ids": [10**9]}, 400),
    Case("gen-ids-nested-bad", "/generate", {"input_ids": [[1], "x"]}, 400),
    Case("gen-top-logprobs-huge", "/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 10**6}, 400),
    # embeddings
    Case("emb-no-input", "/v1/embeddings", {}, 400),
    Case("emb-input-int", "/v1/embeddings", {"input": 5}, 400),
    Case("emb-input-empty-string", "/v1/embeddings", {"input": ""}, 400),
    Case("emb-encoding-hex", "/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400),
    Case("emb-dimensions-negative", "/v1/embeddings", {"input": "x", "dimensions": -1}, 400),
    # tokenize / detokenize
    Case("tok-prompt-int", "/v1/tokenize", {"prompt": 5}, 400),
    Case("tok-messages-string", "/v1/tokenize", {"messages": "hi"}, 400),
    Case("detok-negative", "/v1/detokenize", {"tokens": [-5]}, 400),
    Case("detok-past-vocab", "/v1/detokenize", {"tokens": [10**9]}, 400),
    Case("detok-huge", "/v1/detokenize", {"tokens": [HUGE]}, 400),
    Case("detok-strings", "/v1/detokenize", {"tokens": "abc"}, 400),
    # issue 16: work bounded before it starts, one rule set
    Case("cmpl-batch-too-large", "/v1/completions", {"prompt": ["hi"] * 300, "max_tokens": 1}, 400, param="prompt"),
    Case("gen-batch-too-large", "/generate", {"text": ["hi"] * 300}, 400, param="prompt"),
    Case("emb-batch-too-large", "/v1/embeddings", {"input": ["hi"] * 300}, 400, param="input"),
    Case("cmpl-max-tokens-true", "/v1/completions", {"prompt": "hi", "max_tokens": True}, 400, param="max_tokens"),
    Case("chat-n-true", "/v1/chat/completions", {"messages": MSG, "n": True}, 400, param="n"),
    Case("gen-max-new-tokens-true", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": True}}, 400),
    Case("cmpl-regex-bad", "/v1/completions", {"prompt": "hi", "regex": "([a-z"}, 400, param="regex"),
    Case("cmpl-json-schema-bad", "/v1/completions", {"prompt": "hi", "json_schema": "{not json"}, 400, param="json_schema"),
    Case("cmpl-json-schema-array", "/v1/completions", {"prompt": "hi", "json_schema": "[1]"}, 400, param="json_schema"),
    Case("gen-regex-bad", "/generate", {"text": "hi", "sampling_params": {"regex": "(?P<"}}, 400),
    Case("emb-ids-past-vocab", "/v1/embeddings", {"input": [1, 10**6]}, 400, param="input"),
    Case("emb-ids-negative", "/v1/embeddings", {"input": [1, -3]}, 400, param="input"),
    Case("cmpl-logit-bias-past-vocab", "/v1/completions", {"prompt": "hi", "logit_bias": {"1000000": 1}}, 400, param="logit_bias"),
    Case("cmpl-stop-token-past-vocab", "/v1/completions", {"prompt": "hi", "stop_token_ids": [10**6]}, 400, param="stop_token_ids"),
    Case("gen-rid-too-long", "/generate", {"text": "hi", "rid": "r" * 10_000}, 400),
    Case("cmpl-temperature-nan", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400),
]

CASES = _every_endpoint() + SPECIFIC


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    opts = StackOptions(workers=2, server={"api_keys": [KEY], "max_body_bytes": MAX_BODY})
    async with start_stack(opts, tmp_path_factory.mktemp("hostile")) as s:
        yield s


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_request_gets_clean_4xx(hostile_stack: Stack, case: Case) -> None:
    stack = hostile_stack
    r = await stack.http.post(case.path, content=case.content(), headers=case.headers)
    assert r.status_code == case.status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if case.status == 401:
        assert KEY not in r.text and error["type"] == "authentication_error"
    if case.param is not None:
        assert error["param"] == case.param
    assert r.headers.get("x-request-id")
    assert (await stack.http.get("/health")).status_code == 200


async def test_chunked_oversized_body_is_413(hostile_stack: Stack) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 4096 + 2):
            yield b"a" * 4096
        yield b'"}'

    r = await hostile_stack.http.post("/v1/completions", content=chunks(), headers=AUTH)
    assert r.status_code == 413
    assert r.json()["error"]["message"]


async def test_gateway_healthy_and_idle_after_the_table(hostile_stack: Stack) -> None:
    stack = hostile_stack
    r = await stack.http.post("/v1/completions", headers=AUTH, json={"model": stack.model, "prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())
    assert all(w.scheduler.num_running == 0 and w.scheduler.num_waiting == 0 for w in stack.fleet.workers)
    metrics = (await stack.http.get("/metrics")).text
    assert 'status="500"' not in metrics


async def test_body_sent_in_slow_chunks_arrives_whole(hostile_stack: Stack) -> None:
    """The disconnect watcher must not steal body chunks from the JSON reader."""
    prompt = "word " * 6000

    async def chunks() -> AsyncIterator[bytes]:
        data = json.dumps({"model": hostile_stack.model, "prompt": prompt, "max_tokens": 2}).encode()
        for i in range(0, len(data), 2048):
            yield data[i : i + 2048]
            await asyncio.sleep(0.002)

    r = await hostile_stack.http.post("/v1/completions", content=chunks(), headers=AUTH)
    assert r.status_code == 200, r.text


async def test_client_leaving_mid_body_harms_nothing(hostile_stack: Stack) -> None:
    host, port = hostile_stack.url.removeprefix("http://").split(":")
    for _ in range(5):
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ncontent-length: 5000\r\n\r\n".encode()
            + b'{"prompt": "abc'
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await writer.wait_closed()
    await asyncio.sleep(0.1)
    assert (await hostile_stack.http.get("/health")).status_code == 200
    metrics = (await hostile_stack.http.get("/metrics")).text
    assert 'status="500"' not in metrics
