"""Fill any protobuf message from its descriptor alone, deterministically.

The interop tests build "the same" message twice: once with token-gateway's
generated classes and once with the official ones, in another process (both
register the same .proto file names, so they cannot share one). This module
only reads descriptors, so both sides run this very code and, for one `Plan`,
produce identical content whenever the two schemas agree.

Every value comes from a hash of (seed, field path), never from the order the
fields are visited, so a field only one side knows does not shift the values
of the others.

This file must import nothing from `gateway` (the official side imports it).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor, OneofDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

# What to do with fields that track presence (proto3 `optional`, oneof members,
# singular messages): give them a non-default value, mark them present with the
# default value (the case proto3 presence exists for: a rank 0 is not "no rank"),
# or leave them absent.
SET = "set"
ZERO = "zero"
UNSET = "unset"
PRESENCE_POLICIES = (SET, ZERO, UNSET)

# Repeated message fields get one element per policy, so every list holds an
# absent-optional element, a present-but-zero one and a fully set one.
_ELEMENT_POLICIES = (UNSET, ZERO, SET)
_REPEATED_SCALARS = 3
_MAP_ENTRIES = 3
_MAX_DEPTH = 8
_TIMESTAMP = "google.protobuf.Timestamp"
_STRUCT = "google.protobuf.Struct"
_SIGNED_32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
}
_SIGNED_64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
}
_UNSIGNED_32 = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32}
_UNSIGNED_64 = {FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64}
_REALS = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}


@dataclass(frozen=True)
class Plan:
    """How to fill one message: a seed, a presence policy and one member per oneof.

    `choices` maps a oneof's full name to the field name to set; a oneof not
    listed gets its first member. `skip` names field numbers, by message full name,
    to leave unset: fields one side knowingly does not declare. JSON-friendly so it
    can cross the process line.
    """

    seed: int
    presence: str = SET
    choices: Mapping[str, str] = field(default_factory=dict)
    skip: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "presence": self.presence, "choices": dict(self.choices),
            "skip": {name: sorted(numbers) for name, numbers in self.skip.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        skip = {name: frozenset(numbers) for name, numbers in data.get("skip", {}).items()}
        return cls(int(data["seed"]), str(data["presence"]), dict(data["choices"]), skip)


def populate(message: Message, plan: Plan) -> Message:
    """Set every field of `message` (recursively) following `plan`; returns `message`."""
    _fill(message, plan, plan.presence, message.DESCRIPTOR.full_name, 0)
    return message


def canonical(message: Message) -> dict[str, Any]:
    """A comparable view of a message: JSON mapping with proto field names and enum numbers."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, use_integers_for_enums=True
    )


def unknown_fields(message: Message, path: str = "") -> list[str]:
    """Every field the parsing side did not know, through the whole message tree.

    Each entry reads "<message type>#<field number> at <path>".
    """
    here = path or message.DESCRIPTOR.full_name
    kind = message.DESCRIPTOR.full_name
    found = [f"{kind}#{item.field_number} at {here}" for item in UnknownFieldSet(message)]
    for fd, value in message.ListFields():
        if fd.message_type is None:
            continue
        if _is_map(fd):
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    found += unknown_fields(item, f"{here}.{fd.name}[{key!r}]")
        elif fd.is_repeated:
            for index, item in enumerate(value):
                found += unknown_fields(item, f"{here}.{fd.name}[{index}]")
        else:
            found += unknown_fields(value, f"{here}.{fd.name}")
    return found


def real_oneofs(descriptor: Descriptor) -> list[OneofDescriptor]:
    """The message's written oneofs, leaving out those protoc makes for proto3 `optional`."""
    synthetic = _proto3_optional_names(descriptor)
    return [
        oneof
        for oneof in descriptor.oneofs
        if not (len(oneof.fields) == 1 and oneof.fields[0].name in synthetic)
    ]


def reachable_oneofs(descriptor: Descriptor) -> list[OneofDescriptor]:
    """Every real oneof in `descriptor` and the message types under it, by full name."""
    seen: dict[str, OneofDescriptor] = {}
    visited: set[str] = set()

    def walk(current: Descriptor) -> None:
        if current.full_name in visited or current.full_name.startswith("google.protobuf."):
            return
        visited.add(current.full_name)
        for oneof in real_oneofs(current):
            seen.setdefault(oneof.full_name, oneof)
        for fd in current.fields:
            if fd.message_type is not None:
                walk(fd.message_type)

    walk(descriptor)
    return [seen[name] for name in sorted(seen)]


def oneof_choices(descriptor: Descriptor) -> Iterator[dict[str, str]]:
    """Every combination of oneof members reachable from `descriptor` (one empty dict if none)."""
    oneofs = reachable_oneofs(descriptor)
    members = [[(oneof.full_name, fd.name) for fd in oneof.fields] for oneof in oneofs]
    for combination in itertools.product(*members):
        yield dict(combination)


_OPTIONAL_NAMES: dict[str, frozenset[str]] = {}


def _proto3_optional_names(descriptor: Descriptor) -> frozenset[str]:
    """Fields declared `optional` in proto3 (the descriptor API only exposes this via the proto)."""
    names = _OPTIONAL_NAMES.get(descriptor.full_name)
    if names is None:
        proto = descriptor_pb2.DescriptorProto()
        descriptor.CopyToProto(proto)
        names = frozenset(fd.name for fd in proto.field if fd.proto3_optional)
        _OPTIONAL_NAMES[descriptor.full_name] = names
    return names


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.is_repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _digest(seed: int, path: str) -> int:
    raw = hashlib.blake2b(f"{seed}/{path}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little")


def _scalar(fd: FieldDescriptor, seed: int, path: str) -> Any:
    """A non-default value for a scalar field, exactly representable on the wire."""
    h = _digest(seed, path)
    kind = fd.type
    if kind in _REALS:
        # Multiples of 1/64 below 2**14 survive float32 unchanged.
        value = ((h % 2_000_000) - 1_000_000) / 64
        return value or 0.25
    if kind in _SIGNED_32:
        return ((h % 2**32) - 2**31) or 1
    if kind in _SIGNED_64:
        return ((h % 2**64) - 2**63) or 1
    if kind in _UNSIGNED_32:
        return (h % 2**32) or 1
    if kind in _UNSIGNED_64:
        return h or 1
    if kind == FieldDescriptor.TYPE_BOOL:
        return True
    if kind == FieldDescriptor.TYPE_STRING:
        return f"{fd.name}-{h:x}-\u00e9\u2713"
    if kind == FieldDescriptor.TYPE_BYTES:
        return h.to_bytes(8, "little") + b"\x00\xff"
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = sorted({value.number for value in fd.enum_type.values if value.number != 0})
        return numbers[h % len(numbers)] if numbers else 0
    raise ValueError(f"no value rule for field type {kind} ({fd.full_name})")


def _zero(fd: FieldDescriptor) -> Any:
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return 0
    return fd.default_value


def _fill(message: Message, plan: Plan, presence: str, path: str, depth: int) -> None:
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == _TIMESTAMP:
        _fill_timestamp(message, plan.seed, path)
        return
    if descriptor.full_name == _STRUCT:
        _fill_struct(message, plan.seed, path)
        return
    if descriptor.full_name.startswith("google.protobuf."):
        raise ValueError(f"no fill rule for well-known type {descriptor.full_name}")

    optional_names = _proto3_optional_names(descriptor)
    chosen = {
        oneof.full_name: plan.choices.get(oneof.full_name, oneof.fields[0].name)
        for oneof in real_oneofs(descriptor)
    }
    skipped = plan.skip.get(descriptor.full_name, frozenset())
    for fd in sorted(descriptor.fields, key=lambda item: item.number):
        if fd.number in skipped:
            continue
        field_path = f"{path}.{fd.name}"
        oneof = fd.containing_oneof
        in_real_oneof = oneof is not None and fd.name not in optional_names
        if in_real_oneof and chosen[oneof.full_name] != fd.name:
            continue
        if fd.is_repeated:
            _fill_repeated(message, fd, plan, field_path, depth)
        elif fd.message_type is not None:
            if presence == UNSET or depth >= _MAX_DEPTH:
                continue
            child = getattr(message, fd.name)
            if presence == ZERO and in_real_oneof:
                child.SetInParent()
            else:
                _fill(child, plan, presence, field_path, depth + 1)
                child.SetInParent()
        elif fd.has_presence:
            if presence == SET:
                setattr(message, fd.name, _scalar(fd, plan.seed, field_path))
            elif presence == ZERO:
                setattr(message, fd.name, _zero(fd))
        else:
            setattr(message, fd.name, _scalar(fd, plan.seed, field_path))


def _fill_repeated(
    message: Message, fd: FieldDescriptor, plan: Plan, path: str, depth: int
) -> None:
    container = getattr(message, fd.name)
    if _is_map(fd):
        key_fd = fd.message_type.fields_by_name["key"]
        value_fd = fd.message_type.fields_by_name["value"]
        for index in range(_MAP_ENTRIES):
            key = _map_key(key_fd, plan.seed, f"{path}{{{index}}}", index)
            entry_path = f"{path}[{index}]"
            if value_fd.message_type is None:
                container[key] = _scalar(value_fd, plan.seed, entry_path)
            elif depth < _MAX_DEPTH:
                element_policy = _ELEMENT_POLICIES[index % len(_ELEMENT_POLICIES)]
                _fill(container[key], plan, element_policy, entry_path, depth + 1)
        return
    if fd.message_type is None:
        for index in range(_REPEATED_SCALARS):
            value = _scalar(fd, plan.seed, f"{path}[{index}]")
            if fd.type == FieldDescriptor.TYPE_BOOL:
                value = index % 2 == 0
            container.append(value)
        return
    if depth >= _MAX_DEPTH:
        return
    for index, element_policy in enumerate(_ELEMENT_POLICIES):
        _fill(container.add(), plan, element_policy, f"{path}[{index}]", depth + 1)


def _map_key(key_fd: FieldDescriptor, seed: int, path: str, index: int) -> Any:
    if key_fd.type == FieldDescriptor.TYPE_BOOL:
        return index % 2 == 0
    if key_fd.type == FieldDescriptor.TYPE_STRING:
        return f"key{index}-{_digest(seed, path):x}"
    return _scalar(key_fd, seed, path)


def _fill_timestamp(message: Message, seed: int, path: str) -> None:
    h = _digest(seed, path)
    message.seconds = 1_600_000_000 + h % 100_000_000
    message.nanos = (h >> 32) % 1_000_000_000


def _fill_struct(message: Message, seed: int, path: str) -> None:
    """A Struct holding every Value kind: number, string, bool, null, nested struct and list."""
    h = _digest(seed, path)
    message.update(
        {
            "number": (h % 100_000) / 8,
            "text": f"s-{h:x}-\u00e9",
            "flag": True,
            "nothing": None,
            "nested": {"inner": [1.5, "two", False, None, {"deep": h % 1000}]},
            "empty_list": [],
            "empty_struct": {},
        }
    )
