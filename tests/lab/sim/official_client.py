"""An official-stub (smg-grpc-proto) client of a simulated worker, run as a script.

A separate process because the official generated modules and token-gateway's
register the same .proto files in protobuf's default descriptor pool.
Usage: ``python official_client.py HOST:PORT`` with a JSON request spec on
stdin ({"input_ids": [...], "max_new_tokens": N, "n": K}); prints JSON.
"""

from __future__ import annotations

import json
import sys

import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc


def generate(stub: pb_grpc.SglangSchedulerStub, spec: dict, stream: bool) -> list[dict]:
    req = pb.GenerateRequest(
        request_id=f"official-{stream}",
        tokenized=pb.TokenizedInput(input_ids=spec["input_ids"]),
        sampling_params=pb.SamplingParams(
            temperature=1.0, n=spec["n"], max_new_tokens=spec["max_new_tokens"]
        ),
        stream=stream,
    )
    out = []
    for r in stub.Generate(req, timeout=20):
        kind = r.WhichOneof("response")
        if kind == "chunk":
            c = r.chunk
            out.append(
                {
                    "kind": kind,
                    "index": c.index,
                    "token_ids": list(c.token_ids),
                    "completion_tokens": c.completion_tokens,
                    "prompt_tokens": c.prompt_tokens,
                }
            )
        else:
            c = r.complete
            out.append(
                {
                    "kind": kind,
                    "index": c.index,
                    "output_ids": list(c.output_ids),
                    "finish_reason": c.finish_reason,
                    "completion_tokens": c.completion_tokens,
                    "cached_tokens": c.cached_tokens,
                }
            )
    return out


def main() -> int:
    spec = json.load(sys.stdin)
    with grpc.insecure_channel(sys.argv[1]) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        result = {
            "model_path": info.model_path,
            "eos_token_ids": list(info.eos_token_ids),
            "stream": generate(stub, spec, True),
            "unary": generate(stub, spec, False),
        }
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
