"""Compare token-gateway's .proto declarations with the reference's, descriptor by descriptor.

Works on `FileDescriptorProto`s (google's own descriptor messages, which both
processes share without a pool clash): ours come from our generated modules,
the reference's arrive as JSON from the official-side subprocess.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
    ServiceDescriptorProto,
)


def messages(file: FileDescriptorProto) -> dict[str, DescriptorProto]:
    """Every message of a file by full name, nested ones (map entries) included."""
    found: dict[str, DescriptorProto] = {}

    def walk(prefix: str, declared: Iterable[DescriptorProto]) -> None:
        for message in declared:
            name = f"{prefix}.{message.name}"
            found[name] = message
            walk(name, message.nested_type)

    walk(file.package, file.message_type)
    return found


def enums(file: FileDescriptorProto) -> dict[str, EnumDescriptorProto]:
    found = {f"{file.package}.{enum.name}": enum for enum in file.enum_type}
    for name, message in messages(file).items():
        found.update({f"{name}.{enum.name}": enum for enum in message.enum_type})
    return found


def services(file: FileDescriptorProto) -> dict[str, ServiceDescriptorProto]:
    return {f"{file.package}.{service.name}": service for service in file.service}


def field_signature(message: DescriptorProto, field: FieldDescriptorProto) -> dict[str, Any]:
    """Everything about a field that the wire (or the JSON mapping) depends on."""
    in_oneof = field.HasField("oneof_index")
    return {
        "name": field.name,
        "type": FieldDescriptorProto.Type.Name(field.type),
        "label": FieldDescriptorProto.Label.Name(field.label),
        "type_name": field.type_name or None,
        "oneof": message.oneof_decl[field.oneof_index].name if in_oneof else None,
        "proto3_optional": field.proto3_optional,
        "json_name": field.json_name or None,
    }


def method_signature(service: ServiceDescriptorProto) -> dict[str, tuple[str, str, bool, bool]]:
    return {
        method.name: (
            method.input_type,
            method.output_type,
            method.client_streaming,
            method.server_streaming,
        )
        for method in service.method
    }


def _all(files: Iterable[FileDescriptorProto], index: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for file in files:
        merged.update(index(file))
    return merged


def differences(
    ours: Iterable[FileDescriptorProto], reference: Iterable[FileDescriptorProto]
) -> list[str]:
    """Each way a message, field, enum or method we declare differs from the reference."""
    ours, reference = list(ours), list(reference)
    problems: list[str] = []
    their_messages = _all(reference, messages)
    for name, message in _all(ours, messages).items():
        theirs = their_messages.get(name)
        if theirs is None:
            problems.append(f"message {name}: not in the reference")
            continue
        if message.options.map_entry != theirs.options.map_entry:
            problems.append(f"message {name}: map entry {message.options.map_entry} vs reference")
        their_fields = {field.number: field for field in theirs.field}
        for field in message.field:
            ours_sig = field_signature(message, field)
            if field.number not in their_fields:
                problems.append(
                    f"{name}.{field.name} (#{field.number}): no such field number in the reference"
                )
                continue
            their_sig = field_signature(theirs, their_fields[field.number])
            for key in ours_sig:
                if ours_sig[key] != their_sig[key]:
                    problems.append(
                        f"{name}.{field.name} (#{field.number}): {key} is {ours_sig[key]!r}, "
                        f"reference has {their_sig[key]!r}"
                    )
    their_enums = _all(reference, enums)
    for name, enum in _all(ours, enums).items():
        if name not in their_enums:
            problems.append(f"enum {name}: not in the reference")
            continue
        ours_values = {value.number: value.name for value in enum.value}
        their_values = {value.number: value.name for value in their_enums[name].value}
        if ours_values != their_values:
            problems.append(f"enum {name}: values {ours_values} vs reference {their_values}")
    their_services = _all(reference, services)
    for name, service in _all(ours, services).items():
        if name not in their_services:
            problems.append(f"service {name}: not in the reference")
            continue
        their_methods = method_signature(their_services[name])
        for method, signature in method_signature(service).items():
            if method not in their_methods:
                problems.append(f"rpc {name}.{method}: not in the reference")
            elif signature != their_methods[method]:
                problems.append(
                    f"rpc {name}.{method}: (input, output, client stream, server stream) is "
                    f"{signature}, reference has {their_methods[method]}"
                )
    return problems


def reference_only_fields(
    ours: Iterable[FileDescriptorProto], reference: Iterable[FileDescriptorProto]
) -> dict[str, set[int]]:
    """Field numbers the reference has in messages we declare but that we leave out."""
    their_messages = _all(reference, messages)
    omitted: dict[str, set[int]] = {}
    for name, message in _all(ours, messages).items():
        theirs: DescriptorProto | None = their_messages.get(name)
        if theirs is None:
            continue
        ours_numbers = {field.number for field in message.field}
        extra = {field.number for field in theirs.field} - ours_numbers
        if extra:
            omitted[name] = extra
    return omitted
