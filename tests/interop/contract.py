"""What token-gateway declares of the wire contract, and what it knowingly leaves out."""

from __future__ import annotations

from google.protobuf.descriptor_pb2 import FileDescriptorProto

from gateway.proto import common_pb2, sglang_scheduler_pb2

OUR_MODULES = (sglang_scheduler_pb2, common_pb2)

# The RPCs DESIGN.md ("The wire contract with SGLang workers") says the gateway uses.
DESIGN_RPCS = (
    "Generate",
    "Abort",
    "HealthCheck",
    "GetModelInfo",
    "GetServerInfo",
    "GetLoads",
    "GetTokenizer",
    "SubscribeKvEvents",
    "Embed",
    "FlushCache",
)

# Fields the reference has in messages we declare but that we deliberately omit,
# by message full name -> field numbers. Messages we do not declare at all (the
# LoRA adapter and profiler RPCs) are out of scope. An omitted field would reach
# us as an unknown field, so each entry needs a reason; today there are none.
ACCEPTED_OMISSIONS: dict[str, frozenset[int]] = {}


def our_files() -> list[FileDescriptorProto]:
    files = []
    for module in OUR_MODULES:
        proto = FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto)
    return files
