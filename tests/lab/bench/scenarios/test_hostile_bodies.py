"""`bench hostile`'s large-body probes (gateway_lab.bench.scenarios.hostile_bodies): each
body is valid JSON of its route's shape and as large as the bound lets it be, the gRPC
messages fit the message bound, and several copies go at once (the probes themselves run
against a gateway process as ``token-gateway bench hostile --only bodies``)."""

from __future__ import annotations

import asyncio

import orjson
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.protocol import limits
from gateway_lab.bench.scenarios import hostile_bodies as bodies

LIMIT = 256 * 1024


def test_every_http_body_is_valid_json_of_its_route_and_fills_the_bound() -> None:
    made = bodies.http_bodies("m", LIMIT)
    assert {b.path for b in made} == {
        "/v1/completions", "/generate", "/v1/chat/completions", "/v1/responses", "/v1/tokenize", "/v1/detokenize",
        "/v1/embeddings",
    }  # fmt: skip
    at_bounds = [b for b in made if "(the " in b.name]
    assert len(at_bounds) == 3  # the largest bodies the default bounds admit, whatever the byte bound
    for body in made:
        if body in at_bounds:
            continue
        raw = body.build()
        assert LIMIT - 2 * bodies.HEADROOM <= len(raw) <= LIMIT, body.name
        data = orjson.loads(raw)
        assert data["model"] == "m"
    ids = orjson.loads(made[3].build())["prompt"]
    assert len(ids) == bodies.ids_fitting(LIMIT) and set(ids) == {bodies.ID}
    assert f"{len(ids):,} ids" in made[3].name
    bound = orjson.loads(at_bounds[0].build())["prompt"]
    assert len(bound) < limits.DEFAULT_MAX_BODY_VALUES
    assert len(orjson.loads(at_bounds[1].build())["messages"]) == limits.MAX_MESSAGES


async def test_grpc_messages_fit_the_message_bound_and_go_several_at_once() -> None:
    async with aio.insecure_channel("127.0.0.1:1") as channel:
        calls = bodies.grpc_calls(channel, "m", LIMIT)
        assert [name.split(" of ")[0] for name, _ in calls] == [
            "gRPC Completion", "gRPC Completion", "gRPC ChatCompletion", "gRPC Detokenize"]  # fmt: skip
        ids = bodies.ids_fitting(LIMIT, per_id=3)
        message = gpb.CompletionRequest(model="m", token_ids=gpb.TokenIds(ids=[bodies.ID] * ids))
        assert LIMIT - 2 * bodies.HEADROOM <= message.ByteSize() <= LIMIT
        answer = await bodies.at_once(calls[3][1]())  # nothing listens there: every copy says so
        assert answer == f"UNAVAILABLE x{bodies.PARALLEL}"


async def test_at_once_counts_each_answer() -> None:
    answers = iter(["413", "200", "413"])

    async def attempt() -> str:
        await asyncio.sleep(0)
        return next(answers)

    assert await bodies.at_once(attempt, 3) == "200 x1, 413 x2"
