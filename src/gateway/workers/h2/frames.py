"""HTTP/2 frames (RFC 9113) as the Generate transport writes and reads them, HPACK's
literal form for the request's headers (RFC 7541), and gRPC's mapping of HTTP/2
endings to status codes (gRPC's "PROTOCOL-HTTP2" document).

Only what a client of unary-request, server-streaming calls needs: no server push,
no priorities, no header indexing on our side (the worker's responses are decoded by
the ``hpack`` library, which keeps the dynamic table the worker's encoder uses).
"""

from __future__ import annotations

import struct

from gateway.workers.transport import CallCode

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings.
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
FRAME_HEADER = 9

_U32 = struct.Struct(">I")
HEAD = struct.Struct(">IBI")
"""A frame's 9-byte head in one read: (length << 8 | type, flags, R bit | stream id)."""
MESSAGE_PREFIX = struct.Struct(">BI")
"""A gRPC message's 5-byte prefix in one read: (compressed flag, length)."""
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, kind, flags)) + _U32.pack(stream_id) + payload


def settings(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in pairs.items()))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ValueError("SETTINGS payload is not a multiple of 6 bytes")
    return {k: v for k, v in _SETTING.iter_unpack(payload)}


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code))


def ping(payload: bytes, *, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def u32(payload: bytes, offset: int = 0) -> int:
    return int(_U32.unpack_from(payload, offset)[0])


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: an integer in a ``prefix_bits`` prefix, then 7 bits per byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header as "literal without indexing, new name" (RFC 7541 6.2.2), no Huffman:
    stateless, so blocks can be built ahead and joined in any order."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


# Static-table entries (RFC 7541 appendix A) the request uses.
METHOD_POST = b"\x83"
SCHEME_HTTP = b"\x86"
SCHEME_HTTPS = b"\x87"


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A header whose name is static-table entry ``index``, value literal, not indexed."""
    return hpack_int(index, 4) + hpack_int(len(value), 7) + value


PATH_INDEX = 4
AUTHORITY_INDEX = 1


def grpc_timeout(seconds: float) -> bytes:
    """gRPC's ``grpc-timeout`` value: at most 8 digits and a unit, rounded up."""
    for unit, scale in ((b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        amount = -int(-max(seconds, 0.0) * scale // 1)  # ceil
        if amount < 100_000_000:
            return str(max(amount, 1)).encode() + unit
    return b"99999999H"


def status_for_reset(code: int) -> CallCode:
    """gRPC's status for a stream the peer reset (PROTOCOL-HTTP2, "Errors")."""
    if code == REFUSED_STREAM:
        return CallCode.UNAVAILABLE  # never processed: safe to retry
    if code == CANCEL:
        return CallCode.CANCELLED
    if code == ENHANCE_YOUR_CALM:
        return CallCode.RESOURCE_EXHAUSTED
    if code == INADEQUATE_SECURITY:
        return CallCode.PERMISSION_DENIED
    return CallCode.INTERNAL


def status_for_http(status: int) -> CallCode:
    """gRPC's status for a response that is not ``200`` (gRPC's "http-grpc-status-mapping")."""
    if status == 400:
        return CallCode.INTERNAL
    if status == 401:
        return CallCode.UNAUTHENTICATED
    if status == 403:
        return CallCode.PERMISSION_DENIED
    if status == 404:
        return CallCode.UNIMPLEMENTED
    if status in (429, 502, 503, 504):
        return CallCode.UNAVAILABLE
    return CallCode.UNKNOWN


def status_from_number(number: int) -> CallCode:
    return CallCode.from_number(number)
