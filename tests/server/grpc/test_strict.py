"""Strict gRPC registration (server/grpc/strict.py): a body that is not valid protobuf gets
INVALID_ARGUMENT with the gateway's error metadata instead of grpcio's bare INTERNAL, on a
real aio server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.server.grpc.strict import register, strict_handler

SERVICE = "test.Strict"


def _add(servicer: object, server: object) -> None:
    """What a generated ``add_XServicer_to_server`` does, for one unary and one streaming method."""
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(
            servicer.echo, request_deserializer=gpb.TokenIds.FromString, response_serializer=gpb.TokenIds.SerializeToString),  # type: ignore[attr-defined]
        "Count": grpc.unary_stream_rpc_method_handler(
            servicer.count, request_deserializer=gpb.TokenIds.FromString, response_serializer=gpb.TokenIds.SerializeToString),  # type: ignore[attr-defined]
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))  # type: ignore[attr-defined]
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]


class _Servicer:
    async def echo(self, request: gpb.TokenIds, context: aio.ServicerContext) -> gpb.TokenIds:
        return gpb.TokenIds(ids=list(request.ids)[::-1])

    async def count(self, request: gpb.TokenIds, context: aio.ServicerContext) -> AsyncIterator[gpb.TokenIds]:
        for i in request.ids:
            yield gpb.TokenIds(ids=[i])


def test_request_streaming_handlers_are_left_alone() -> None:
    async def handler(requests: object, context: object) -> None:
        return None

    streaming = grpc.stream_unary_rpc_method_handler(handler)
    assert strict_handler(streaming) is streaming


async def test_valid_and_invalid_bodies_on_a_real_server() -> None:
    server = aio.server()
    register(_add, _Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(f"/{SERVICE}/Echo")
            count = channel.unary_stream(f"/{SERVICE}/Count")
            good = gpb.TokenIds(ids=[1, 2, 3]).SerializeToString()
            assert gpb.TokenIds.FromString(await echo(good)).ids == [3, 2, 1]
            assert [gpb.TokenIds.FromString(m).ids[0] async for m in count(good)] == [1, 2, 3]
            bad = b"\xff\xff\xff"
            for call in (echo(bad), count(bad).read()):
                try:
                    await call
                except aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "not a valid protobuf message" in (err.details() or "")
                    trailing = dict(err.trailing_metadata() or ())
                    assert trailing["x-http-status"] == "400" and trailing["x-error-type"] == "invalid_request_error"
                else:
                    raise AssertionError("a bad body was accepted")
    finally:
        await server.stop(None)
