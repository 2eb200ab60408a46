"""A worker that lies about its output cannot make the gateway return more than was
asked, hold a request forever or pass on ids no model has; /health answers meanwhile."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import json
import logging
import statistics
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from gateway.proto import common_pb2
from gateway.workers.client import MAX_TOKENIZER_MESSAGE_BYTES
from gateway_lab.sim.hostile import HostilePlan, hostile_worker
from tests.e2e.live_gateway import Gateway, gateway, health_probe
from tests.tokenization.helpers import copy_tokenizer, qwen_files


async def test_a_streamed_flood_past_max_tokens_is_cut_at_max_tokens(tmp_path: Path) -> None:
    plan = HostilePlan(flood_tokens=300_000)  # chunks of 1,000 tokens: each within its bound
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw, health_probe(gw.url) as lat:
        chunks = await gw.client.completions.create(
            model=gw.model, prompt="hello", max_tokens=40, stream=True, stream_options={"include_usage": True})
        events = [c async for c in chunks]
        usage = events[-1].usage
        finish = [c.choices[0].finish_reason for c in events if c.choices and c.choices[0].finish_reason]
        assert usage is not None and usage.completion_tokens == 40
        assert finish == ["length"]
        assert plan.sent == [300_000]
        assert all(w.load.in_flight == 0 for w in gw.state.registry.all())
    assert max(lat) < 0.1, f"/health took {max(lat):.3f}s"


@pytest.mark.parametrize(("transport", "stream", "tokens", "padding"), [
    ("h2", False, 300_000, 0),  # one GenerateComplete of ~300 KB where 40 tokens need ~130 KB
    ("h2", True, 300_000, 0),  # one chunk as large
    ("grpcio", False, 10, 5_000_000),  # grpc.aio bounds per channel: a 5 MB complete, past the 4 MiB tier
])
async def test_a_reply_past_what_the_request_allows_is_a_502_and_a_worker_failure(
    tmp_path: Path, transport: str, stream: bool, tokens: int, padding: int
) -> None:
    bad_plan = HostilePlan(flood_tokens=tokens, chunk_tokens=tokens, padding=padding)
    async with (
        hostile_worker(bad_plan, served_model_name="flood") as bad,
        hostile_worker(HostilePlan(), served_model_name="good") as good,
        gateway([bad, good], tmp_path / "tok", worker_stream_transport=transport) as gw,
    ):
        async with health_probe(gw.url):  # the probe's own first connection, not the reply's cost
            pass
        # Nor a full collection of the test process's heap: serve collects (and freezes) its
        # start-up heap before it takes traffic (server/gc_policy.py); this in-process gateway
        # gets the same collection here, or the first one after start-up may fall in the window.
        gc.collect()
        async with health_probe(gw.url) as lat:
            await _one_oversized_reply_among_honest_requests(gw, bad, stream)
        assert max(lat) < 0.1, f"/health took {max(lat):.3f}s"


async def _one_oversized_reply_among_honest_requests(gw: Gateway, bad: str, stream: bool) -> None:
    flood = next(w for w in gw.state.registry.all() if w.url == bad)

    async def honest() -> int:
        body = {"model": "good", "prompt": "hello", "max_tokens": 8}
        return sum([(await gw.http.post("/v1/completions", json=body)).status_code == 200 for _ in range(10)])

    others = asyncio.create_task(honest())
    body = {"model": "flood", "prompt": "hello", "max_tokens": 40, "stream": stream}
    resp = await gw.http.post("/v1/completions", json=body)
    if stream and resp.status_code == 200:  # refused after the stream began: an error event
        error = json.loads(next(line[6:] for line in resp.text.splitlines() if '"error"' in line))["error"]
    else:
        assert resp.status_code == 502, resp.text
        error = resp.json()["error"]
    assert error["code"] == "worker_reply_too_large", error
    assert "larger than this request allows" in error["message"]
    assert await others == 10  # requests to another worker are not harmed
    assert flood.breaker.consecutive_failures >= 1  # counted as the worker's failure
    assert all(w.load.in_flight == 0 for w in gw.state.registry.all())


@pytest.mark.parametrize("stream", [False, True])
async def test_an_endless_stream_ends_at_max_tokens(tmp_path: Path, stream: bool) -> None:
    plan = HostilePlan(endless=True)
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw:
        body = {"model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        if stream:
            chunks = await gw.client.chat.completions.create(**body, stream=True)
            events = [c async for c in chunks]
            finish = [c.choices[0].finish_reason for c in events if c.choices and c.choices[0].finish_reason]
        else:
            resp = await asyncio.wait_for(gw.client.chat.completions.create(**body), 10)
            assert resp.usage is not None and resp.usage.completion_tokens == 16
            finish = [resp.choices[0].finish_reason]
        assert finish == ["length"]
        for _ in range(100):  # the worker's stream is cancelled: it stops sending
            if all(w.load.in_flight == 0 for w in gw.state.registry.all()):
                break
            await asyncio.sleep(0.01)
        # The cancel reaches the worker a moment after the slot is freed: wait (bounded) for
        # its count to stop moving, then it must stay still and far below an endless stream.
        stable = False
        for _ in range(40):
            sent = plan.sent[-1]
            await asyncio.sleep(0.05)
            if plan.sent[-1] == sent:
                stable = True
                break
        assert stable and sent < 100


@pytest.mark.parametrize("bad", [2**32 - 1, 10**9, 151_700])
async def test_ids_outside_the_vocabulary_are_a_worker_error(tmp_path: Path, bad: int, caplog: pytest.LogCaptureFixture) -> None:
    plan = HostilePlan(flood_tokens=3, token_id=bad)
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw:
        with caplog.at_level(logging.INFO):
            caplog.clear()
            with pytest.raises(openai.APIStatusError) as err:
                await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=8)
            assert err.value.status_code == 502
            assert "vocabulary" in err.value.message
            chunks = await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=8, stream=True)
            with pytest.raises(openai.APIError, match="vocabulary"):
                async for _ in chunks:
                    pass
        guard = [r for r in caplog.records if r.name == "gateway.pipeline.output_guard"]
        assert len(guard) == 2, [r.getMessage() for r in caplog.records]  # one line a request
        assert not any(r.exc_info for r in caplog.records)
        assert all(w.load.in_flight == 0 for w in gw.state.registry.all())


# One worker template, several bombs: ``chat_template_kwargs={"bomb": ...}`` picks one.
BOMBS = {
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "multiplication": "{{ 'x' * 1000000000 }}",
    "recursion": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "doubling": "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
    "constant": "{{ 'x'|center(1000000000) }}",
    "power": "{{ 9 ** (9 ** 9) }}",
}
# Inside the budget (3,000 steps) but slow: each step writes the messages as JSON and drops it.
SLOW = "{% for i in range(3000) %}{% if (messages|tojson|length) < 0 %}x{% endif %}{% endfor %}"
TEMPLATE = "".join(f"{{% if bomb == '{name}' %}}{source}{{% endif %}}" for name, source in BOMBS.items()) + (
    "{% if bomb == 'slow' %}" + SLOW + "{% endif %}"
    "{% if bomb is not defined %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}"
)


def _bomb_tokenizer(dest: Path) -> Path:
    """The real Qwen3 tokenizer with a chat template full of bombs."""
    folder = copy_tokenizer(qwen_files(), dest)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


async def test_template_bombs_fail_at_once_and_health_keeps_answering(tmp_path: Path) -> None:
    folder = _bomb_tokenizer(tmp_path / "bomb")
    async with hostile_worker(HostilePlan(), tokenizer_path=str(folder)) as url, gateway([url], tmp_path / "tok") as gw:
        hi = [{"role": "user", "content": "hi"}]
        ok = await gw.client.chat.completions.create(model=gw.model, messages=hi, max_tokens=4)  # honest: served
        assert ok.choices[0].finish_reason
        async with health_probe(gw.url) as lat:
            for name in BOMBS:
                started = time.monotonic()
                with pytest.raises(openai.BadRequestError, match="chat template") as err:
                    await asyncio.wait_for(gw.client.chat.completions.create(
                        model=gw.model, messages=hi, max_tokens=4, extra_body={"chat_template_kwargs": {"bomb": name}}), 10)
                assert err.value.code == "chat_template_budget", name
                assert time.monotonic() - started < 1.0, name
        assert statistics.median(lat) < 0.1 and max(lat) < 1.0, f"/health took {sorted(lat)}s"
        assert all(w.load.in_flight == 0 for w in gw.state.registry.all())


async def test_template_bombs_on_the_grpc_door_are_invalid_argument_in_the_same_shape(tmp_path: Path) -> None:
    from google.protobuf import struct_pb2
    from grpc import aio

    from gateway.proto import gateway_pb2, gateway_pb2_grpc
    from gateway.server.grpc.server import start_grpc_server

    folder = _bomb_tokenizer(tmp_path / "bomb")
    async with hostile_worker(HostilePlan(), tokenizer_path=str(folder)) as url, gateway([url], tmp_path / "tok") as gw:
        server = await start_grpc_server(gw.state, "127.0.0.1", 0)
        try:
            async with aio.insecure_channel(server.target) as channel:
                stub = gateway_pb2_grpc.TokenGatewayStub(channel)
                for name in BOMBS:
                    kwargs = struct_pb2.Struct()
                    kwargs.update({"bomb": name})
                    request = gateway_pb2.ChatCompletionRequest(
                        messages=[gateway_pb2.ChatMessage(role="user", content="hi")], max_completion_tokens=4,
                        chat_template_kwargs=kwargs)
                    with pytest.raises(aio.AioRpcError) as err:
                        await asyncio.wait_for(stub.ChatCompletion(request), 10)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
                    trailing = dict(err.value.trailing_metadata() or ())
                    assert trailing.get("x-error-code") == "chat_template_budget", (name, trailing)
                    assert trailing.get("x-http-status") == "400"
                ok = await stub.ChatCompletion(gateway_pb2.ChatCompletionRequest(
                    messages=[gateway_pb2.ChatMessage(role="user", content="hi")], max_completion_tokens=4))
                assert ok.choices[0].finish_reason
        finally:
            await server.stop(0)
        assert (await gw.http.get("/health")).status_code == 200


async def test_a_template_that_loops_without_writing_is_refused_quickly_and_health_answers(tmp_path: Path) -> None:
    folder = _bomb_tokenizer(tmp_path / "bomb")
    async with hostile_worker(HostilePlan(), tokenizer_path=str(folder)) as url, gateway([url], tmp_path / "tok") as gw:
        async with health_probe(gw.url):  # the probe's own first connection, not the template's cost
            pass
        async with health_probe(gw.url) as lat:
            took = []
            for _ in range(5):  # it serializes a 200 KB conversation 3,000 times and writes nothing
                started = time.monotonic()
                with pytest.raises(openai.BadRequestError, match="read or made more than") as err:
                    await asyncio.wait_for(gw.client.chat.completions.create(
                        model=gw.model, messages=[{"role": "user", "content": "x" * 200_000}], max_tokens=4,
                        extra_body={"chat_template_kwargs": {"bomb": "slow"}}), 10)
                took.append(time.monotonic() - started)
                assert err.value.code == "chat_template_budget"
            ok = await gw.client.completions.create(model=gw.model, prompt="hello", max_tokens=4)
            assert ok.choices[0].finish_reason
        # it ran into the 2 s CPU deadline before; a loaded shared host still answers well within 1 s
        assert statistics.median(took) < 1.0, took
        assert len(lat) >= 3 and statistics.median(lat) < 0.1 and max(lat) < 0.5, f"/health took {sorted(lat)}s"


def _chunks_of(data: bytes, sha256: str) -> list[common_pb2.GetTokenizerChunk]:
    return [common_pb2.GetTokenizerChunk(data=data[i:i + 65536], sha256=sha256 if i + 65536 >= len(data) else "")
            for i in range(0, len(data), 65536)]


def _traversal_zip() -> tuple[bytes, str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in qwen_files().iterdir():
            zf.write(f, f.name)
        zf.writestr("../../escaped.txt", "out of the cache")
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class _Endless:
    """1 MiB chunks for ever (counts what it sent)."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self) -> Iterator[common_pb2.GetTokenizerChunk]:
        while True:
            self.sent += 1
            yield common_pb2.GetTokenizerChunk(data=b"\0" * (1 << 20))


@pytest.mark.parametrize("kind", ["oversized", "one big message", "sha256", "traversal", "fails"])
async def test_a_bad_tokenizer_download_is_a_502_with_the_reason(tmp_path: Path, kind: str) -> None:
    endless = _Endless()
    if kind == "oversized":
        stream: Any = endless
        reason = "larger than 8388608 bytes"
    elif kind == "one big message":  # inside --max-tokenizer-bytes, past the per-message cap
        big = common_pb2.GetTokenizerChunk(data=b"\0" * (MAX_TOKENIZER_MESSAGE_BYTES + 1), sha256="0" * 64)
        stream = lambda: [big]  # noqa: E731
        reason = "GetTokenizer message is too large"
    elif kind == "sha256":
        data, _ = _traversal_zip()
        stream = lambda: _chunks_of(data, "0" * 64)  # noqa: E731
        reason = "sha256 mismatch"
    elif kind == "traversal":
        data, digest = _traversal_zip()
        stream = lambda: _chunks_of(data, digest)  # noqa: E731
        reason = "escaped.txt"
    else:
        def stream() -> Iterator[common_pb2.GetTokenizerChunk]:
            raise RuntimeError("no tokenizer here")
        reason = "hub (qwen3-sim): disabled"
    cache = tmp_path / "a" / "b" / "tok"
    async with hostile_worker(HostilePlan(tokenizer_chunks=stream)) as url, gateway([], cache, max_tokenizer_bytes=8 << 20) as gw:
        added = await gw.http.post("/workers", json={"url": url})
        assert added.status_code == 502, added.text
        body = added.json()["error"]
        assert body["code"] == "worker_registration_failed" and reason in body["message"], body["message"]
        assert gw.state.registry.all() == []
        assert (await gw.http.get("/health")).status_code == 200
    # Cut soon after 8 MiB: the chunks past it are what HTTP/2 flow-control windows and the
    # server's send queue held when the call ended. gRPC's BDP probe grows those windows with
    # timing, so the count moves (24-27 seen); an uncut download would run on without end.
    assert endless.sent <= 40
    assert not await asyncio.to_thread(lambda: list(tmp_path.rglob("escaped.txt")))
