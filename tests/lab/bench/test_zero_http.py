"""The zero-cost workers' SGLang HTTP face: its refusals, and its answers as the gateway's
HTTP worker client reads them (a gateway in front of it: tests/lab/bench/scenarios/test_transports.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http import SglangHttpClient
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway_lab.bench import zero_http
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import PAGE_SIZE, ZeroWorker, model_folder, reply_ids


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([1, 2], "JSON object"),
        ({"input_ids": []}, "non-empty"),
        ({"input_ids": [1, "2"]}, "token ids"),
        ({"input_ids": [1], "sampling_params": []}, "sampling_params"),
        ({"input_ids": [1], "sampling_params": {"n": 0}}, "n at least 1"),
        ({"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 50}}, "exceeds the context"),
    ],
)
def test_bodies_sglang_refuses_are_refused(body: Any, why: str) -> None:
    with pytest.raises(zero_http.BadRequest, match=why):
        zero_http.parse_generate(body, context_length=128)


def test_a_body_reads_with_sglangs_defaults() -> None:
    ids, max_new, n, stream, rid = zero_http.parse_generate({"input_ids": [3, 4], "rid": "r1"}, 4096)
    assert (ids, max_new, n, stream, rid) == ([3, 4], zero_http.DEFAULT_MAX_NEW_TOKENS, 1, False, "r1")


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[ZeroWorker, str]]:
    folder = model_folder(default_tokenizer_dir(), tmp_path, 4096)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = ZeroWorker(folder, reply_ids(folder), 0.0, 8192, 4096, port)
    runner = await zero_http.start(w, port)
    try:
        yield w, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _request(rid: str, ids: list[int], max_new: int, stream: bool) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=ids), stream=stream,
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=max_new, n=1),
    )  # fmt: skip


async def _read_all(client: SglangHttpClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = client.generate(request, timeout=10)
    out = []
    while (message := await call.read()) is not END_OF_STREAM:
        assert isinstance(message, pb.GenerateResponse)
        out.append(message)
    return out


async def test_the_gateways_client_reads_its_streams_and_whole_answers(worker: tuple[ZeroWorker, str]) -> None:
    w, url = worker
    client = SglangHttpClient(url)
    try:
        prompt = list(range(1, 50))
        stream = await _read_all(client, _request("s", prompt, 3, True))
        assert [m.WhichOneof("response") for m in stream] == ["chunk"] * 3 + ["complete"]
        assert [list(m.chunk.token_ids) for m in stream[:3]] == [[t] for t in w.tokens(3)]
        assert stream[-1].complete.finish_reason == "length" and stream[-1].complete.cached_tokens == 0
        [whole] = await _read_all(client, _request("w", prompt, 3, False))
        assert list(whole.complete.output_ids) == w.tokens(3)
        assert whole.complete.cached_tokens == 3 * PAGE_SIZE  # the streamed call cached its whole pages
        with pytest.raises(WorkerCallError) as err:
            await _read_all(client, _request("long", [1] * 4000, 200, True))
        assert err.value.code is CallCode.INVALID_ARGUMENT
        server = await client.server_info(timeout=5)
        assert server.max_total_num_tokens == 8192 and server.server_args["page_size"] == PAGE_SIZE
        assert (await client.model_info(timeout=5)).model_path == str(w.folder)
        assert (await client.loads(timeout=5)).loads[0].num_running_reqs == 0
        assert (await client.health_check(timeout=5)).healthy
        assert (await client.flush_cache()).success
        [again] = await _read_all(client, _request("w", prompt, 1, False))
        assert again.complete.cached_tokens == 0
    finally:
        await client.close()
