"""Same token ids, same worker, whichever front door they came through.

Prompts from a few shared-prefix groups go through four doors in turn: HTTP
/v1/completions (x-worker-id header), gRPC Completion and Generate (the reply's
worker), and the SglangScheduler pass-through (x-worker-id metadata). Before each
request, /admin/inspect asks the live policy what it would choose; every door
must land exactly there, and a group's later prompts must follow its prefix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from grpc import aio

from gateway.client import user
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from tests.e2e.grpc.conftest import GrpcStack, start_grpc_stack
from tests.e2e.http.conftest import StackOptions

Door = Callable[[list[int]], Awaitable[str]]


def _doors(gstack: GrpcStack, stub: pb_grpc.SglangSchedulerStub) -> dict[str, Door]:
    async def http(ids: list[int]) -> str:
        r = await gstack.http.http.post("/v1/completions", json={"prompt": ids, "max_tokens": 2})
        assert r.status_code == 200, r.text
        return r.headers["x-worker-id"]

    async def grpc_completion(ids: list[int]) -> str:
        reply = await gstack.client.complete(ids, max_tokens=2)
        return reply.worker_ids[0]

    async def grpc_generate(ids: list[int]) -> str:
        replies = [m async for m in gstack.client.generate(ids, max_new_tokens=2)]
        return replies[0].worker_id

    async def passthrough(ids: list[int]) -> str:
        call = stub.Generate(pb.GenerateRequest(
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=2),
        ))
        assert [m async for m in call][-1].HasField("complete")
        return dict(await call.initial_metadata())["x-worker-id"]

    return {"http": http, "grpc_completion": grpc_completion, "grpc_generate": grpc_generate, "passthrough": passthrough}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["cache_aware", "prefix_hash"])
async def test_every_door_routes_like_the_policy_says(policy: str, tmp_path: object) -> None:
    opts = StackOptions(workers=3, policy=policy)
    async with start_grpc_stack(opts, tmp_path) as gstack:
        async with aio.insecure_channel(gstack.target) as channel:
            doors = _doors(gstack, pb_grpc.SglangSchedulerStub(channel))
            names = list(doors)
            seen: dict[str, list[tuple[str, str]]] = {}
            why: dict[str, list[dict[str, object]]] = {}  # each turn's plan, for a failure's message
            for group in range(6):
                prefix = [3000 + 97 * group + i for i in range(64)]
                for turn in range(len(names)):
                    door = names[(group + turn) % len(names)]
                    ids = prefix + [5000 + 10 * group + turn] * 4
                    plan = (await gstack.http.http.post("/admin/inspect", json={"input_ids": ids})).json()
                    chosen = plan["decision"]["choice"]
                    got = await doors[door](ids)
                    assert got == chosen, f"group {group}: {door} went to {got}, the policy chose {chosen}: {plan}"
                    seen.setdefault(str(group), []).append((door, got))
                    why.setdefault(str(group), []).append(plan["decision"])
            for group, hits in seen.items():
                assert len({w for _, w in hits}) == 1, f"group {group} split across workers: {hits}, plans {why[group]}"
                assert {d for d, _ in hits} == set(names)
            assert len({hits[0][1] for hits in seen.values()}) > 1  # groups spread over the fleet


@pytest.mark.stack(workers=3, policy="prefix_hash")
async def test_chat_over_grpc_and_http_tokenizes_and_routes_alike(gstack: GrpcStack) -> None:
    for i in range(4):
        text = f"Conversation {i}: " + "shared system context. " * 20
        grpc_reply = await gstack.client.chat([user(text)], max_tokens=2)
        http = await gstack.http.http.post(
            "/v1/chat/completions", json={"model": gstack.model, "messages": [{"role": "user", "content": text}], "max_tokens": 2},
        )
        assert http.status_code == 200
        assert list(grpc_reply.worker_ids) == [http.headers["x-worker-id"]]
        assert grpc_reply.usage.prompt_tokens == http.json()["usage"]["prompt_tokens"]
