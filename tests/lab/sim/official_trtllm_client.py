"""An official-stub (smg-grpc-proto) client of a simulated TensorRT-LLM worker, run as a script.

A separate process: the official generated modules and token-gateway's register the
same .proto files in protobuf's default descriptor pool.
Usage: ``python official_trtllm_client.py HOST:PORT`` with a JSON request spec on stdin
({"input_ids": [...], "max_tokens": N, "n": K}); prints JSON of every reply, with the
fields the official classes did not know (there must be none).
"""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from smg_grpc_proto.generated import trtllm_service_pb2 as pb
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as pb_grpc


def _unknown(message: Message) -> int:
    """How many fields of ``message`` (nested ones included) the official classes do not know."""
    count = len(UnknownFieldSet(message))
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in value if field.is_repeated else [value]:
            count += _unknown(item)
    return count


def _dict(message: Message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def main() -> int:
    spec = json.load(sys.stdin)
    out: dict = {"unknown": 0}
    with grpc.insecure_channel(sys.argv[1]) as channel:
        stub = pb_grpc.TrtllmServiceStub(channel)
        for stream in (True, False):
            req = pb.GenerateRequest(
                request_id=f"official-{stream}",
                tokenized=pb.TokenizedInput(input_token_ids=spec["input_ids"]),
                sampling_config=pb.SamplingConfig(beam_width=1, num_return_sequences=spec["n"], temperature=0.0),
                output_config=pb.OutputConfig(logprobs=1, prompt_logprobs=1),
                max_tokens=spec["max_tokens"], streaming=stream,
            )
            replies = list(stub.Generate(req, timeout=20))
            out["unknown"] += sum(_unknown(r) for r in replies)
            out["stream" if stream else "unary"] = [_dict(r) for r in replies]
        for name, request in (
            ("GetModelInfo", pb.GetModelInfoRequest()), ("GetServerInfo", pb.GetServerInfoRequest()),
            ("HealthCheck", pb.HealthCheckRequest()), ("Abort", pb.AbortRequest(request_id="nobody")),
        ):
            reply = getattr(stub, name)(request, timeout=10)
            out["unknown"] += _unknown(reply)
            out[name] = _dict(reply)
        try:
            stub.Embed(pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_token_ids=[1])), timeout=10)
            out["Embed"] = "answered"
        except grpc.RpcError as exc:
            out["Embed"] = exc.code().name
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
