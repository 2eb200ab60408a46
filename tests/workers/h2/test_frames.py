"""HTTP/2 frame and HPACK building (checked with the ``hpack`` and ``h2`` libraries), gRPC's
timeout format and its mapping of HTTP/2 endings to status codes."""

from __future__ import annotations

import hyperframe.frame
from hpack import Decoder
from hypothesis import given
from hypothesis import strategies as st

from gateway.workers.h2 import frames
from gateway.workers.transport import CallCode

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=300)
_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=3000)


@given(st.lists(st.tuples(_names, _values), max_size=8))
def test_literal_headers_decode_as_written(pairs: list[tuple[str, str]]) -> None:
    block = b"".join(frames.literal(k.encode(), v.encode()) for k, v in pairs)
    assert Decoder().decode(block) == pairs


@given(st.integers(1, 61), st.text(alphabet="/._-abcXYZ0123456789:", max_size=500))
def test_static_names_with_literal_values(index: int, value: str) -> None:
    decoded = Decoder().decode(frames.literal_indexed_name(index, value.encode()))
    assert len(decoded) == 1 and decoded[0][1] == value


def test_the_request_prefix_decodes_to_the_pseudo_headers() -> None:
    block = (
        frames.METHOD_POST + frames.SCHEME_HTTP
        + frames.literal_indexed_name(frames.PATH_INDEX, b"/a.B/C")
        + frames.literal_indexed_name(frames.AUTHORITY_INDEX, b"127.0.0.1:5")
    )
    assert Decoder().decode(block) == [(":method", "POST"), (":scheme", "http"), (":path", "/a.B/C"), (":authority", "127.0.0.1:5")]


@given(st.integers(0, 2**40), st.integers(1, 8))
def test_hpack_integers_round_trip(value: int, prefix: int) -> None:
    raw = frames.hpack_int(value, prefix)
    limit = (1 << prefix) - 1
    got, shift = raw[0] & limit, 0
    if got == limit:
        got = limit
        for byte in raw[1:]:
            got += (byte & 0x7F) << shift
            shift += 7
    assert got == value


def test_frames_parse_with_an_independent_parser() -> None:
    for raw, kind in (
        (frames.window_update(3, 1000), hyperframe.frame.WindowUpdateFrame),
        (frames.rst_stream(5, frames.CANCEL), hyperframe.frame.RstStreamFrame),
        (frames.goaway(7, frames.NO_ERROR), hyperframe.frame.GoAwayFrame),
        (frames.ping(b"abcdefgh", ack=True), hyperframe.frame.PingFrame),
        (frames.settings({frames.INITIAL_WINDOW_SIZE: 1 << 20}), hyperframe.frame.SettingsFrame),
    ):
        parsed, length = hyperframe.frame.Frame.parse_frame_header(memoryview(raw[:9]))
        parsed.parse_body(memoryview(raw[9:9 + length]))
        assert isinstance(parsed, kind)
    wu, _ = hyperframe.frame.Frame.parse_frame_header(memoryview(frames.window_update(3, 1000)[:9]))
    wu.parse_body(memoryview(frames.window_update(3, 1000)[9:]))
    assert wu.stream_id == 3 and wu.window_increment == 1000  # type: ignore[attr-defined]
    assert frames.parse_settings(frames.settings({4: 99, 5: 16384})[9:]) == {4: 99, 5: 16384}


def test_grpc_timeouts_fit_eight_digits_and_round_up() -> None:
    assert frames.grpc_timeout(600.0) == b"600000m"
    assert frames.grpc_timeout(0.0001) == b"1m"
    assert frames.grpc_timeout(0.0) == b"1m"
    assert frames.grpc_timeout(1e6) == b"1000000S"
    assert frames.grpc_timeout(1e9) == b"16666667M"
    for value in (0.5, 1.2345, 99_999.9999, 5e7, 1e12):
        raw = frames.grpc_timeout(value)
        assert len(raw) <= 9 and raw[:-1].isdigit()


def test_status_mappings() -> None:
    assert frames.status_for_reset(frames.REFUSED_STREAM) is CallCode.UNAVAILABLE
    assert frames.status_for_reset(frames.CANCEL) is CallCode.CANCELLED
    assert frames.status_for_reset(frames.ENHANCE_YOUR_CALM) is CallCode.RESOURCE_EXHAUSTED
    assert frames.status_for_reset(frames.PROTOCOL_ERROR) is CallCode.INTERNAL
    assert frames.status_for_http(404) is CallCode.UNIMPLEMENTED
    assert frames.status_for_http(503) is CallCode.UNAVAILABLE
    assert frames.status_for_http(401) is CallCode.UNAUTHENTICATED
    assert frames.status_for_http(500) is CallCode.UNKNOWN
    assert frames.status_from_number(3) is CallCode.INVALID_ARGUMENT
    assert frames.status_from_number(99) is CallCode.UNKNOWN
