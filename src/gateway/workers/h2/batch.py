"""Parse the messages that came off one socket read with one protobuf parse.

Why: protobuf's upb runtime gives every parsed message its own arena, and its Python
module calls glibc's ``malloc_trim(0)`` after every 10,000 arena frees. ``malloc_trim``
consolidates and walks the whole heap (hundreds of MB in a serving gateway), so at one
arena per streamed token it was a visible share of the gsp burst's CPU (perf: glibc's
``malloc_consolidate`` and ``unlink_chunk`` under ``upb_Arena_Free``). Parsed as the elements of one wrapper message
(``repeated <Message> messages = 1``), the messages of one socket read, all its calls',
share one arena: the same objects, a fraction of the arena frees and trims. A lone
message in a read is parsed on its own, as before (the wrapper only pays from two).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.message import Message

_FIELD_TAG = b"\x0a"  # field 1, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# The tag and length of every payload under 128 bytes (a streamed token's message is one):
# looked up, not built by a call per message.
_SHORT = [_FIELD_TAG + bytes((n,)) for n in range(0x80)]


def _wrapper_class(message: type[Message]) -> type[Message]:
    """``message Batch { repeated <message> messages = 1; }``, added to ``message``'s pool
    under a name of its own (once per message type)."""
    desc = message.DESCRIPTOR
    pool = desc.file.pool
    name = "gateway.h2batch." + desc.full_name.replace(".", "_")
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"gateway/h2batch/{desc.full_name}.proto",
        package="gateway.h2batch",
        syntax="proto3",
        dependency=[desc.file.name],
    )
    wrapper = proto.message_type.add(name=desc.full_name.replace(".", "_"))
    wrapper.field.add(
        name="messages",
        number=1,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name="." + desc.full_name,
    )
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


class BatchParser:
    """A deserializer for one message type that can also parse many payloads at once.

    Called with one payload it is ``Message.FromString``; ``many`` returns the same
    messages (equal field by field) for a list of payloads, from one parse."""

    __slots__ = ("_wrapper", "one")

    def __init__(self, message: type[Message]) -> None:
        self.one: Callable[[bytes], Any] = message.FromString
        self._wrapper = _wrapper_class(message).FromString

    def __call__(self, payload: bytes) -> Any:
        return self.one(payload)

    def many(self, payloads: list[bytes]) -> list[Any]:
        """The messages of ``payloads``, in order; raises as ``FromString`` would when one
        of them is malformed (the caller then parses them one by one to find it)."""
        if len(payloads) == 1:
            return [self.one(payloads[0])]
        parts: list[bytes] = []
        short = _SHORT
        for payload in payloads:
            size = len(payload)
            parts += (short[size] if size < 0x80 else _FIELD_TAG + _varint(size), payload)
        return list(self._wrapper(b"".join(parts)).messages)  # type: ignore[attr-defined]
