"""Live calls: our client against a servicer written on the OFFICIAL stubs.

The servicer (official_side.py `serve`, a subprocess on 127.0.0.1:0) answers
every RPC we declare with replies built from `scenario` plans, and logs each
request it parsed with the official classes. Here we call it over real gRPC with
our generated `SglangSchedulerStub` and with `gateway.workers.client.WorkerClient`,
then check every returned field against the same plans built with our classes,
and every request the official side received against what we sent.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc import aio

from gateway.proto import common_pb2, sglang_scheduler_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.client import WorkerClient

from . import scenario
from .official import official_server, read_log
from .populate import Plan, canonical, populate, unknown_fields

CALL_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def official_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(target, request log) of one official-stub servicer shared by this module's tests."""
    log = tmp_path_factory.mktemp("official-peer") / "requests.jsonl"
    with official_server(log) as port:
        yield f"127.0.0.1:{port}", log


def _build(full_name: str, plan: Plan) -> Message:
    cls = message_factory.GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(full_name)
    )
    return populate(cls(), plan)


def _expected_generate(request_id: str, stream: bool) -> list[dict[str, Any]]:
    plans = scenario.STREAM_REPLIES if stream else scenario.UNARY_REPLIES
    replies = []
    for plan in plans:
        reply = _build(f"{scenario.SCHEDULER}.GenerateResponse", plan)
        reply.request_id = request_id  # type: ignore[attr-defined]
        replies.append(canonical(reply))
    return replies


def _expected_reply(method: str) -> dict[str, Any]:
    full_name, plan = scenario.UNARY_REPLY_PLANS[method]
    return canonical(_build(full_name, plan))


def _received(log: Path, method: str) -> list[dict[str, Any]]:
    entries = [entry for entry in read_log(log) if entry["method"] == method]
    for entry in entries:
        assert entry["unknown"] == [], f"official side saw unknown fields in {method}"
    return [entry["canonical"] for entry in entries]


def _generate_request(request_id: str, stream: bool) -> pb.GenerateRequest:
    request = populate(pb.GenerateRequest(), scenario.GENERATE_REQUEST)
    request.request_id = request_id
    request.stream = stream
    return request


def _assert_replies(replies: list[Message], expected: list[dict[str, Any]]) -> None:
    for reply in replies:
        assert unknown_fields(reply) == [], "official servicer sent fields we do not declare"
    assert [canonical(reply) for reply in replies] == expected


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
async def test_raw_stub_generate(official_peer: tuple[str, Path], stream: bool) -> None:
    target, log = official_peer
    request = _generate_request(f"raw-generate-{stream}", stream)
    async with aio.insecure_channel(target) as channel:
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
        replies = [reply async for reply in stub.Generate(request, timeout=CALL_TIMEOUT)]
    _assert_replies(replies, _expected_generate(request.request_id, stream))
    kinds = [reply.WhichOneof("response") for reply in replies]
    assert kinds == (["chunk", "chunk", "complete"] if stream else ["complete"])
    assert canonical(request) in _received(log, "Generate")


UNARY_CALLS = [
    ("HealthCheck", pb.HealthCheckRequest, None),
    ("Abort", pb.AbortRequest, scenario.ABORT_REQUEST),
    ("GetModelInfo", pb.GetModelInfoRequest, None),
    ("GetServerInfo", pb.GetServerInfoRequest, None),
    ("GetLoads", pb.GetLoadsRequest, scenario.GET_LOADS_REQUEST),
    ("Embed", pb.EmbedRequest, scenario.EMBED_REQUEST),
    ("FlushCache", common_pb2.FlushCacheRequest, scenario.FLUSH_REQUEST),
]


@pytest.mark.parametrize(
    ("method", "request_type", "plan"), UNARY_CALLS, ids=[c[0] for c in UNARY_CALLS]
)
async def test_raw_stub_unary_rpcs(
    official_peer: tuple[str, Path], method: str, request_type: type[Message], plan: Plan | None
) -> None:
    target, log = official_peer
    request = populate(request_type(), plan) if plan else request_type()
    async with aio.insecure_channel(target) as channel:
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
        reply = await getattr(stub, method)(request, timeout=CALL_TIMEOUT)
    _assert_replies([reply], [_expected_reply(method)])
    assert canonical(request) in _received(log, method)


async def test_raw_stub_get_loads_keeps_a_zero_dp_rank_present(
    official_peer: tuple[str, Path],
) -> None:
    """proto3 `optional`: rank 0 must reach the worker as 'rank 0', not as 'no rank'."""
    target, log = official_peer
    request = pb.GetLoadsRequest(dp_rank=0, include=["zero-rank-probe"])
    async with aio.insecure_channel(target) as channel:
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
        await stub.GetLoads(request, timeout=CALL_TIMEOUT)
    received = [r for r in _received(log, "GetLoads") if r.get("include") == ["zero-rank-probe"]]
    assert received == [{"dp_rank": 0, "include": ["zero-rank-probe"]}]


async def test_raw_stub_streaming_side_rpcs(official_peer: tuple[str, Path]) -> None:
    target, log = official_peer
    subscribe = populate(common_pb2.SubscribeKvEventsRequest(), scenario.SUBSCRIBE_REQUEST)
    async with aio.insecure_channel(target) as channel:
        stub = sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)
        chunks = [
            chunk
            async for chunk in stub.GetTokenizer(
                common_pb2.GetTokenizerRequest(), timeout=CALL_TIMEOUT
            )
        ]
        batches = [batch async for batch in stub.SubscribeKvEvents(subscribe, timeout=CALL_TIMEOUT)]

    data = scenario.TOKENIZER_ZIP
    assert b"".join(chunk.data for chunk in chunks) == data
    assert len(chunks) == -(-len(data) // scenario.TOKENIZER_PIECE)
    assert [chunk.sha256 for chunk in chunks[:-1]] == [""] * (len(chunks) - 1)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    _assert_replies(
        batches,
        [
            canonical(_build(f"{scenario.COMMON}.KvEventBatch", plan))
            for plan in scenario.KV_EVENT_REPLIES
        ],
    )
    kinds = [event.WhichOneof("data") for batch in batches for event in batch.events]
    assert {"stored", "removed", "cleared"} <= set(kinds)
    assert canonical(subscribe) in _received(log, "SubscribeKvEvents")
    assert _received(log, "GetTokenizer")


async def test_worker_client_against_official_servicer(official_peer: tuple[str, Path]) -> None:
    """The gateway's own WorkerClient, every call it offers, against the official servicer."""
    target, log = official_peer
    client = WorkerClient(f"grpc://{target}")
    try:
        request = _generate_request("worker-client-generate", True)
        replies = [reply async for reply in client.generate(request, timeout=CALL_TIMEOUT)]
        _assert_replies(replies, _expected_generate(request.request_id, True))
        assert canonical(request) in _received(log, "Generate")

        aborted = await client.abort("worker-client-abort", "client went away")
        assert aborted is bool(_expected_reply("Abort").get("success", False))
        assert {"request_id": "worker-client-abort", "reason": "client went away"} in _received(
            log, "Abort"
        )

        _assert_replies([await client.health_check()], [_expected_reply("HealthCheck")])
        _assert_replies([await client.model_info()], [_expected_reply("GetModelInfo")])
        _assert_replies([await client.server_info()], [_expected_reply("GetServerInfo")])
        _assert_replies([await client.loads()], [_expected_reply("GetLoads")])
        assert {"include": ["core"]} in _received(log, "GetLoads")

        embed = populate(pb.EmbedRequest(), scenario.EMBED_REQUEST)
        embed.request_id = "worker-client-embed"  # WorkerClient echoes it as ASCII metadata
        _assert_replies(
            [await client.embed(embed, timeout=CALL_TIMEOUT)], [_expected_reply("Embed")]
        )
        _assert_replies([await client.flush_cache(1.5)], [_expected_reply("FlushCache")])
        assert {"timeout_s": 1.5} in _received(log, "FlushCache")

        data, digest = await client.tokenizer_zip(timeout=CALL_TIMEOUT)
        assert data == scenario.TOKENIZER_ZIP
        assert digest == hashlib.sha256(scenario.TOKENIZER_ZIP).hexdigest()

        async with asyncio.timeout(CALL_TIMEOUT):
            batches = [batch async for batch in client.subscribe_kv_events(5)]
        _assert_replies(
            batches,
            [
                canonical(_build(f"{scenario.COMMON}.KvEventBatch", plan))
                for plan in scenario.KV_EVENT_REPLIES
            ],
        )
        assert {"start_sequence_number": "5", "load_records_before_first_batch": True} in _received(
            log, "SubscribeKvEvents"
        )
    finally:
        await client.close()
