"""The zero-cost fleet: its prefix cache, its SGLang-shaped answers (read by the official
smg-grpc-proto client in its own process, and by the project's stubs), and a real gateway
in front of it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from tokenizers import Tokenizer

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import (
    KEY_TOKENS,
    PAGE_SIZE,
    PrefixCache,
    ZeroFleet,
    ZeroWorker,
    model_folder,
    placement,
    read_records,
    reply_ids,
)
from tests.e2e.http.conftest import _serve

OFFICIAL_CLIENT = Path(__file__).resolve().parents[1] / "sim" / "official_client.py"


def test_prefix_cache_counts_whole_pages_of_a_seen_prefix() -> None:
    cache = PrefixCache(capacity_tokens=1024)
    first = list(range(100))
    assert cache.admit(first) == 0
    assert cache.admit(first) == 96  # 6 whole pages of 16; the last 4 tokens are no page
    assert cache.admit(first[:40] + [999] * 60) == 32  # diverges inside the third page
    assert cache.admit([7, *first[1:]]) == 0  # a different first token: the chain never matches


def test_prefix_cache_evicts_least_recently_used_pages() -> None:
    cache = PrefixCache(capacity_tokens=4 * PAGE_SIZE)
    a, b = list(range(64)), list(range(1000, 1064))
    cache.admit(a)
    cache.admit(b)  # four more pages: all of a's are gone
    assert cache.admit(b) == 64
    assert cache.admit(a) == 0
    cache.clear()
    assert cache.admit(a) == 0


async def test_uncached_prompt_tokens_cost_prefill_time_one_prompt_at_a_time(tmp_path: Path) -> None:
    import asyncio
    import time

    folder = model_folder(default_tokenizer_dir(), tmp_path, 4096)
    worker = ZeroWorker(folder, [1], 0.0, 8192, 4096, prefill_token_s=0.001)
    t0 = time.perf_counter()
    await asyncio.gather(worker.prefill(40), worker.prefill(40), worker.prefill(0))
    assert time.perf_counter() - t0 >= 0.08  # two 40 ms prefills queue on one worker; a full hit costs nothing
    free = ZeroWorker(folder, [1], 0.0, 8192, 4096)
    t0 = time.perf_counter()
    await free.prefill(10_000)
    assert time.perf_counter() - t0 < 0.05


def test_prompts_sharing_their_first_pages_share_a_key() -> None:
    cache = PrefixCache(capacity_tokens=1 << 16)
    shared = list(range(KEY_TOKENS))
    _, a = cache.admit_keyed([*shared, 1, 2, 3])
    cached, b = cache.admit_keyed([*shared, 9] * 2)
    assert a == b and len(a) == 16 and cached == KEY_TOKENS
    assert cache.admit_keyed([5, *shared])[1] != a
    assert cache.admit_keyed([1, 2, 3])[1] == ""  # under a page: no key


def test_placement_counts_workers_per_group_and_the_one_holder_ideal() -> None:
    recs = [
        {"port": 1, "t": 0.0, "key": "a", "prompt": 100, "cached": 0},
        {"port": 1, "t": 0.1, "key": "a", "prompt": 100, "cached": 80},
        {"port": 2, "t": 0.2, "key": "a", "prompt": 100, "cached": 0},  # a second holder: a miss
        {"port": 3, "t": 0.3, "key": "b", "prompt": 100, "cached": 0},
        {"port": 3, "t": 0.4, "key": "b", "prompt": 100, "cached": 80},
        {"port": 4, "t": 0.5, "key": "c", "prompt": 100, "cached": 0},  # seen once: no group
    ]
    out = placement(recs)
    assert out["groups"] == 2 and out["spread"] == {"a": [2, 1], "b": [2]}
    assert out["holders_mean"] == 1.5 and out["holders_max"] == 2
    assert out["hit_rate"] == round(160 / 600, 4)
    assert out["ideal"] == round((80 * 2 + 80) / 600, 4)  # every group's later requests at its best hit


def test_the_fleet_records_which_worker_got_which_prompt(tmp_path: Path) -> None:
    import asyncio

    async def send(url: str, ids: list[int]) -> None:
        async with grpc.aio.insecure_channel(url.removeprefix("grpc://")) as channel:
            request = pb.GenerateRequest(
                request_id="r", tokenized=pb.TokenizedInput(input_ids=ids), stream=False,
                sampling_params=pb.SamplingParams(max_new_tokens=1),
            )  # fmt: skip
            [r async for r in pb_grpc.SglangSchedulerStub(channel).Generate(request, timeout=10)]

    f = ZeroFleet(2, default_tokenizer_dir(), processes=2, capacity_tokens=8192, context_length=4096,
                  record_dir=tmp_path).start()  # fmt: skip
    try:
        prompt = list(range(1, 300))
        for url in (f.urls[0], f.urls[0], f.urls[1]):
            asyncio.run(send(url, prompt))
    finally:
        f.stop()  # flushes the record
    recs = read_records(tmp_path)
    assert [(r["port"], r["cached"]) for r in recs] == [(f.ports[0], 0), (f.ports[0], 288), (f.ports[1], 0)]
    assert placement(recs)["spread"] == {recs[0]["key"]: [2, 1]}
    assert read_records(tmp_path, since=recs[1]["t"]) == recs[1:]


def test_model_folder_has_the_tokenizer_and_a_config(tmp_path: Path) -> None:
    folder = model_folder(default_tokenizer_dir(), tmp_path, 4096)
    assert (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096 and config["model_type"] == "qwen3"


def test_a_thinking_reply_opens_with_a_think_block() -> None:
    plain, think = reply_ids(default_tokenizer_dir()), reply_ids(default_tokenizer_dir(), think=True)
    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    text = tok.decode(think, skip_special_tokens=False)
    assert text.startswith("<think>\n") and "</think>\n\n" in text and think[-len(plain):] == plain


@pytest.fixture(scope="module")
def fleet() -> Iterator[ZeroFleet]:
    f = ZeroFleet(3, default_tokenizer_dir(), processes=2, capacity_tokens=8192, context_length=4096).start()
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
async def stub(fleet: ZeroFleet) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(fleet.urls[0].removeprefix("grpc://")) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


def test_the_official_client_reads_sglang_shaped_answers(fleet: ZeroFleet) -> None:
    spec = {"input_ids": list(range(1, 50)), "max_new_tokens": 4, "n": 1}
    out = subprocess.run(
        [sys.executable, str(OFFICIAL_CLIENT), fleet.urls[1].removeprefix("grpc://")],
        input=json.dumps(spec), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert (Path(result["model_path"]) / "config.json").is_file()  # a model folder, as a real server reports
    stream = result["stream"]
    assert [m["kind"] for m in stream] == ["chunk"] * 4 + ["complete"]
    assert [m["completion_tokens"] for m in stream[:4]] == [1, 2, 3, 4]
    assert all(len(m["token_ids"]) == 1 for m in stream[:4])
    assert stream[-1]["output_ids"] == stream[3]["token_ids"]  # the complete repeats the last chunk
    assert stream[-1]["finish_reason"] == "length"
    unary = result["unary"]
    assert [m["kind"] for m in unary] == ["complete"]
    assert unary[0]["output_ids"] == [m["token_ids"][0] for m in stream[:4]]
    assert unary[0]["cached_tokens"] == 48  # the streamed call cached the prompt's 3 whole pages


async def test_control_calls_and_bad_input(fleet: ZeroFleet, stub: pb_grpc.SglangSchedulerStub) -> None:
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy
    server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert server.max_total_num_tokens == 8192 and server.scheduler_info["page_size"] == PAGE_SIZE
    loads = await stub.GetLoads(pb.GetLoadsRequest(), timeout=5)
    assert loads.loads[0].num_running_reqs == 0
    assert not (await stub.Abort(pb.AbortRequest(request_id="x"), timeout=5)).success
    assert (await stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5)).success
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=30)]
    assert chunks[-1].sha256
    for request in (
        pb.GenerateRequest(request_id="empty", tokenized=pb.TokenizedInput(input_ids=[])),
        pb.GenerateRequest(
            request_id="long", tokenized=pb.TokenizedInput(input_ids=[1] * 4000),
            sampling_params=pb.SamplingParams(max_new_tokens=200),
        ),
    ):  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in stub.Generate(request, timeout=5)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_gateway_in_front_serves_chat(fleet: ZeroFleet, tmp_path: Any) -> None:
    from gateway.server.config import GatewayConfig, ServerConfig
    from gateway.server.state import GatewayState

    config = GatewayConfig(server=ServerConfig(worker_urls=fleet.urls, tokenizer_cache_dir=str(tmp_path / "tok")))
    state = GatewayState(config)
    await state.start()
    server, task, url = await _serve(state)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    try:
        model = state.catalog.names()[0]
        messages: Any = [{"role": "user", "content": "hello there"}]
        reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage is not None and reply.usage.completion_tokens == 6
        text = reply.choices[0].message.content
        assert text
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=6, stream=True)
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(pieces) == text
    finally:
        await client.close()
        server.should_exit = True
        await task
        await state.stop()
