"""What the gateway learns from vLLM's own servers, and how a request ends when its client leaves."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx

from tests.interop_sglang.servers import Process, Recording
from tests.interop_vllm.servers import SERVED_MODEL

# vLLM's CPU platform sets 64-token blocks; the stand-in reports 4,096 of them.
BLOCK, BLOCKS = 64, 4096


def _worker(front: Process) -> dict[str, Any]:
    (worker,) = httpx.get(front.extra["url"] + "/workers", timeout=10).json()["workers"]
    return worker


def test_the_engine_and_its_facts_are_detected(front: Process) -> None:
    worker = _worker(front)
    kind = "vllm/http" if front.extra["worker"].extra["url"].startswith("http") else "vllm/grpc"
    assert (
        worker["kind"] == kind and worker["model"] == SERVED_MODEL and worker["token_ids"] is True
    )
    assert worker["healthy"] and worker["page_size"] == BLOCK and worker["is_generation"] is True
    if kind == "vllm/http":  # from /metrics' vllm:cache_config_info
        assert worker["kv_capacity_tokens"] == BLOCK * BLOCKS
    models = httpx.get(front.extra["url"] + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [SERVED_MODEL]


def test_loads_and_health_from_vllms_own_http_server(vllm_http: Process, model: str) -> None:
    """The client's /metrics parser against vLLM's real page, while a request runs and after."""
    from gateway.workers.vllm_http import VllmHttpClient

    url = vllm_http.extra["url"]
    body = {"model": model, "prompt": [1000, 1001, 1002], "max_tokens": 400, "ignore_eos": True}

    async def run() -> tuple[int, int, int]:
        client = VllmHttpClient(url)
        try:
            await client.health_check()
            async with httpx.AsyncClient(timeout=60) as http:
                task = asyncio.ensure_future(http.post(url + "/v1/completions", json=body))
                running = 0
                for _ in range(100):
                    await asyncio.sleep(0.02)
                    running = max(running, (await client.loads()).aggregate.total_running_reqs)
                    if running:
                        break
                await task
            idle = (await client.loads()).aggregate
            return running, idle.total_running_reqs, idle.total_waiting_reqs
        finally:
            await client.close()

    running, after, waiting = asyncio.run(run())
    assert running == 1 and (after, waiting) == (0, 0)


def test_closing_a_stream_aborts_the_request_in_vllm(
    front: Process, model: str, recording: Recording
) -> None:
    url = front.extra["url"] + "/v1/chat/completions"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=30) as http, http.stream("POST", url, json=body) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        got = 0
        while got < 5:
            got += next(lines).startswith("data:")
    (sent,) = recording.wait("generate", 1)
    aborts = recording.wait("abort", 1, timeout=15)
    assert any(sent["rid"] in a["rids"] for a in aborts), aborts
    deadline = time.monotonic() + 15
    while _worker(front)["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _worker(front)["in_flight"] == 0  # the gateway freed its slot too


def test_flush_reaches_vllms_prefix_cache(front: Process, model: str, recording: Recording) -> None:
    reply = httpx.post(front.extra["url"] + "/flush_cache", timeout=30)
    assert reply.status_code == 200, reply.text
    assert recording.wait("flush", 1)


def test_kv_events_teach_the_gateway_what_it_did_not_route(
    gateway_grpc: Process, vllm_grpc: Process
) -> None:
    """A prompt sent straight to vLLM's servicer: its stored blocks reach the gateway's tree
    through SubscribeKvEvents (the servicer's relay of vLLM's ZMQ publisher), also after a
    flush through the gateway (which replaces its policies, and so their trees)."""
    import grpc

    from gateway.proto import sglang_scheduler_pb2 as pb
    from gateway.proto import vllm_engine_pb2_grpc
    from gateway.workers.vllm_grpc_wire import generate_request

    prompt = [3000 + k for k in range(200)]
    inspect = gateway_grpc.extra["url"] + "/admin/inspect"

    def learned() -> int:
        (worker,) = httpx.post(inspect, json={"input_ids": prompt}, timeout=30).json()["workers"]
        return int(worker["raw_match_tokens"])

    flushed = httpx.post(gateway_grpc.extra["url"] + "/flush_cache", timeout=30)
    assert flushed.status_code == 200 and flushed.json()["success"] is True, flushed.text
    assert learned() == 0
    request = pb.GenerateRequest(
        request_id="kv-events-direct",
        stream=False,
        sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=1),
    )
    request.tokenized.input_ids.extend(prompt)
    with grpc.insecure_channel(vllm_grpc.extra["url"].removeprefix("grpc://")) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        replies = list(stub.Generate(generate_request(request), timeout=60))
    assert replies[-1].WhichOneof("response") == "complete"
    deadline, got = time.monotonic() + 15, 0
    while not got and time.monotonic() < deadline:
        got = learned()
        time.sleep(0.1)
    assert got == 192  # the prompt's three whole 64-token blocks, as vLLM's publisher sent them


def test_concurrent_requests_all_end(client: Any, model: str) -> None:
    """A small burst, streamed and whole mixed: every request ends with its full answer."""
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            if k % 2:
                r = client.completions.create(model=model, prompt=f"burst {k}", max_tokens=8)
                assert r.usage.completion_tokens == 8
            else:
                n = sum(
                    1
                    for c in client.completions.create(
                        model=model, prompt=f"burst {k}", max_tokens=8, stream=True
                    )
                    if c.choices and c.choices[0].text
                )
                assert n >= 1
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_the_tokenizer_comes_from_the_grpc_servicer(
    interop_dir: Any, vllm_grpc: Process, model: str
) -> None:
    """A gateway given no tokenizer loads the one GetTokenizer streams, and renders chat with it."""
    from tests.interop_sglang import expect
    from tests.interop_sglang import servers as common

    workdir = interop_dir / "tokenizer-from-grpc"
    workdir.mkdir(exist_ok=True)
    from tests.interop_vllm.servers import GATEWAY_START_S

    start = common.start_gateway(workdir, vllm_grpc.extra["url"], timeout=GATEWAY_START_S)
    with common.running(start) as gateway:
        common.wait_for_model(gateway)
        messages = [{"role": "user", "content": "hello"}]
        body = {"model": model, "messages": messages, "max_tokens": 3}
        reply = httpx.post(
            gateway.extra["url"] + "/v1/chat/completions", json=body, timeout=60
        ).json()
        assert reply["choices"][0]["message"]["content"] == expect.output_text(3)
        assert reply["usage"]["prompt_tokens"] == len(expect.chat_ids(messages))
