"""A burst of concurrent non-streaming Generate calls from official-stub (smg-grpc-proto)
grpc.aio clients, one channel per worker, as a router in front of the fleet sends them.

Run as a script (the official generated modules and token-gateway's register the same
.proto files in protobuf's default descriptor pool): ``python official_burst.py
HOST:PORT [HOST:PORT ...]`` with {"requests": N, "concurrency": C} on stdin; prints the
per-request latencies in seconds and each worker's model facts as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

PROMPT = [151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198]


async def burst(targets: list[str], requests: int, concurrency: int) -> dict[str, object]:
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    stubs = [pb_grpc.SglangSchedulerStub(c) for c in channels]
    facts = []
    for stub in stubs:
        info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        facts.append({"tokenizer_path": info.tokenizer_path, "max_context_length": info.max_context_length})
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            started = time.perf_counter()
            req = pb.GenerateRequest(
                request_id=f"burst-{i}",
                tokenized=pb.TokenizedInput(input_ids=[*PROMPT, 16 + i % 64]),
                sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=16),
                stream=False,
            )
            replies = [r async for r in stubs[i % len(stubs)].Generate(req, timeout=30)]
            assert [r.WhichOneof("response") for r in replies] == ["complete"]
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(i) for i in range(requests)))
    for channel in channels:
        await channel.close()
    return {"latencies": latencies, "facts": facts}


def main() -> int:
    spec = json.load(sys.stdin)
    result = asyncio.run(burst(sys.argv[1:], int(spec["requests"]), int(spec["concurrency"])))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
