"""Schema-level agreement between our proto/ and the reference smg-grpc-proto.

Every message, field, enum and RPC we declare must exist in the reference with
the same number, type, label, oneof membership and type name; the reference may
have more messages and RPCs (we only declare what the gateway uses), but no more
fields in a message we declare, unless listed in ACCEPTED_OMISSIONS.
"""

from __future__ import annotations

import copy

from google.protobuf.descriptor_pb2 import FieldDescriptorProto, FileDescriptorProto

from gateway.proto import sglang_scheduler_pb2

from .contract import ACCEPTED_OMISSIONS, DESIGN_RPCS, our_files
from .schema import differences, messages, reference_only_fields, services


def _reference(reference_files: dict[str, FileDescriptorProto]) -> list[FileDescriptorProto]:
    return [reference_files[file.name] for file in our_files()]


def test_our_files_are_the_reference_files_and_packages(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    for file in our_files():
        assert file.name in reference_files, f"{file.name} is not a reference file"
        assert file.package == reference_files[file.name].package
        assert file.syntax == reference_files[file.name].syntax


def test_every_declaration_matches_the_reference(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    problems = differences(our_files(), _reference(reference_files))
    assert not problems, "our proto/ differs from smg-grpc-proto:\n" + "\n".join(problems)


def test_we_omit_no_reference_field_of_a_message_we_declare(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    omitted = reference_only_fields(our_files(), _reference(reference_files))
    unexplained = {
        name: sorted(numbers - ACCEPTED_OMISSIONS.get(name, frozenset()))
        for name, numbers in omitted.items()
        if numbers - ACCEPTED_OMISSIONS.get(name, frozenset())
    }
    assert not unexplained, f"reference fields missing from our messages: {unexplained}"
    stale = {
        name: sorted(numbers - omitted.get(name, set()))
        for name, numbers in ACCEPTED_OMISSIONS.items()
        if numbers - omitted.get(name, set())
    }
    assert not stale, (
        f"ACCEPTED_OMISSIONS lists fields we do declare (or the reference lacks): {stale}"
    )


def test_every_message_and_rpc_we_declare_was_compared(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    """Guard against a vacuous pass: the comparison saw all our messages and methods."""
    ours = our_files()
    reference = _reference(reference_files)
    our_messages = {name for file in ours for name in messages(file)}
    their_messages = {name for file in reference for name in messages(file)}
    assert len(our_messages) >= 50
    assert our_messages <= their_messages
    (service,) = services(ours[0]).values()
    (theirs,) = services(reference[0]).values()
    assert {m.name for m in service.method} <= {m.name for m in theirs.method}


def test_we_declare_every_rpc_the_design_lists() -> None:
    declared = set(
        sglang_scheduler_pb2.DESCRIPTOR.services_by_name["SglangScheduler"].methods_by_name
    )
    assert set(DESIGN_RPCS) <= declared, f"missing RPCs: {set(DESIGN_RPCS) - declared}"
    service = sglang_scheduler_pb2.DESCRIPTOR.services_by_name["SglangScheduler"]
    assert service.full_name == "sglang.grpc.scheduler.SglangScheduler"


def test_the_comparison_catches_each_kind_of_drift(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    """The checker itself: a wrong number, type, label, oneof, type name or method is reported."""
    reference = _reference(reference_files)

    def drift(mutate: object) -> list[str]:
        ours = copy.deepcopy(our_files())
        mutate(ours)  # type: ignore[operator]
        return differences(ours, reference)

    def field(ours: list[FileDescriptorProto], message: str, name: str) -> FieldDescriptorProto:
        (found,) = [f for f in messages(ours[0])[message].field if f.name == name]
        return found

    base = "sglang.grpc.scheduler"
    mutations = {
        "number": lambda o: setattr(field(o, f"{base}.GenerateRequest", "stream"), "number", 99),
        "type": lambda o: setattr(
            field(o, f"{base}.SamplingParams", "top_k"), "type", FieldDescriptorProto.TYPE_UINT32
        ),
        "label": lambda o: setattr(
            field(o, f"{base}.TokenizedInput", "input_ids"),
            "label",
            FieldDescriptorProto.LABEL_OPTIONAL,
        ),
        "oneof": lambda o: field(o, f"{base}.SamplingParams", "regex").ClearField("oneof_index"),
        "type_name": lambda o: setattr(
            field(o, f"{base}.GenerateRequest", "tokenized"), "type_name", f".{base}.TensorData"
        ),
        "method": lambda o: setattr(o[0].service[0].method[0], "server_streaming", False),
    }
    assert not differences(our_files(), reference)
    for kind, mutate in mutations.items():
        assert drift(mutate), f"a changed {kind} went unnoticed"


# The RPCs the gateway makes on a vLLM gRPC worker (workers/vllm_grpc.py).
VLLM_RPCS = frozenset({
    "Generate", "Embed", "HealthCheck", "FlushCache", "Abort", "GetModelInfo", "GetServerInfo",
    "GetLoads", "GetTokenizer", "SubscribeKvEvents",
})


def test_the_vllm_engine_file_was_compared_message_by_message(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    """vllm_engine.proto: every message and the service were seen by the comparison, the
    service is vLLM's by its full name, and it declares exactly the RPCs the client makes."""
    (ours,) = [f for f in our_files() if f.name == "vllm_engine.proto"]
    theirs = reference_files["vllm_engine.proto"]
    assert ours.package == theirs.package == "vllm.grpc.engine"
    assert not differences([ours], [theirs])
    our_messages, their_messages = messages(ours), messages(theirs)
    assert len(our_messages) >= 25
    assert set(our_messages) <= set(their_messages)
    (service,) = services(ours).values()
    assert f"{ours.package}.{service.name}" == "vllm.grpc.engine.VllmEngine"
    assert {m.name for m in service.method} == VLLM_RPCS
    (their_service,) = services(theirs).values()
    assert VLLM_RPCS <= {m.name for m in their_service.method}
    field = next(f for f in our_messages["vllm.grpc.engine.SamplingParams"].field if f.name == "top_k")
    assert field.type == FieldDescriptorProto.TYPE_UINT32  # vLLM's top_k is unsigned, SGLang's is not


# The RPCs the gateway makes on a TensorRT-LLM gRPC worker (workers/trtllm_grpc.py): all
# the service has (it has no GetLoads and no FlushCache).
TRTLLM_RPCS = frozenset({
    "Generate", "Embed", "HealthCheck", "Abort", "GetModelInfo", "GetServerInfo", "GetTokenizer", "SubscribeKvEvents",
})


def test_the_trtllm_service_file_was_compared_message_by_message(
    reference_files: dict[str, FileDescriptorProto],
) -> None:
    """trtllm_service.proto: every message and the service were seen by the comparison, the
    service is TensorRT-LLM's by its full name and declares every RPC the reference has."""
    (ours,) = [f for f in our_files() if f.name == "trtllm_service.proto"]
    theirs = reference_files["trtllm_service.proto"]
    assert ours.package == theirs.package == "trtllm"
    assert not differences([ours], [theirs])
    our_messages, their_messages = messages(ours), messages(theirs)
    assert len(our_messages) >= 20
    assert set(our_messages) <= set(their_messages)
    (service,) = services(ours).values()
    assert f"{ours.package}.{service.name}" == "trtllm.TrtllmService"
    (their_service,) = services(theirs).values()
    assert {m.name for m in service.method} == TRTLLM_RPCS == {m.name for m in their_service.method}
    field = next(f for f in our_messages["trtllm.GenerateRequest"].field if f.name == "max_tokens")
    assert field.type == FieldDescriptorProto.TYPE_UINT32 and field.number == 5
