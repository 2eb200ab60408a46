"""What token-gateway declares of the wire contract, and what it knowingly leaves out."""

from __future__ import annotations

from google.protobuf.descriptor_pb2 import FileDescriptorProto

from gateway.proto import common_pb2, sglang_scheduler_pb2, trtllm_service_pb2, vllm_engine_pb2

OUR_MODULES = (sglang_scheduler_pb2, common_pb2, vllm_engine_pb2, trtllm_service_pb2)

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
# us as an unknown field, so each entry needs a reason.
ACCEPTED_OMISSIONS: dict[str, frozenset[int]] = {
    # vLLM: the gateway sends text-only token-id prompts, never multimodal inputs
    # (mm_inputs 7, media_refs 10, extra_mm_inputs 11), so the tensor and media
    # messages they need are not declared; a prefill worker's media identity (15)
    # comes back only for media the gateway never sends.
    "vllm.grpc.engine.GenerateRequest": frozenset({7, 10, 11}),
    "vllm.grpc.engine.GenerateComplete": frozenset({15}),
    # TensorRT-LLM: the gateway sends no LoRA adapter (13), prompt-tuning table (14),
    # multimodal input (15), KV retention hint (16), TensorRT-LLM disaggregation of its
    # own kind (17) or lookahead settings (18), so their messages are not declared; it
    # never asks for timings (10) or logits (11, 12), which come back only on request.
    "trtllm.GenerateRequest": frozenset({13, 14, 15, 16, 17, 18}),
    "trtllm.GenerateComplete": frozenset({10, 11, 12}),
}


def our_files() -> list[FileDescriptorProto]:
    files = []
    for module in OUR_MODULES:
        proto = FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto)
    return files
