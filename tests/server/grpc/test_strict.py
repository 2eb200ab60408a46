"""Strict gRPC registration (server/grpc/strict.py): a body that is not valid protobuf gets
INVALID_ARGUMENT with the gateway's error metadata instead of grpcio's bare INTERNAL, on a
real aio server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.server.grpc.strict import MESSAGE_WEIGHT, register, repeated_values, strict_handler

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


@contextlib.asynccontextmanager
async def _serving(servicer: object, max_values: int = 0) -> AsyncIterator[aio.Channel]:
    """A real aio server with ``servicer`` registered strictly, and a channel to it."""
    server = aio.server()
    register(_add, servicer, server, max_values=max_values)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


def test_request_streaming_handlers_are_left_alone() -> None:
    async def handler(requests: object, context: object) -> None:
        return None

    streaming = grpc.stream_unary_rpc_method_handler(handler)
    assert strict_handler(streaming) is streaming


async def test_valid_and_invalid_bodies_on_a_real_server() -> None:
    async with _serving(_Servicer()) as channel:
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


def test_repeated_values_counts_every_depth_and_weighs_messages() -> None:
    chat = gpb.ChatCompletionRequest(messages=[gpb.ChatMessage(role="user", content="hi")] * 3)
    chat.sampling.stop_token_ids.extend([1, 2])
    chat.sampling.logit_bias[7] = 1.0
    chat.messages[0].tool_calls.add(id="a")
    assert repeated_values(chat, 10**6) == 3 * MESSAGE_WEIGHT + 2 + 1 + MESSAGE_WEIGHT
    batch = gpb.TokenIdBatch(prompts=[gpb.TokenIds(ids=[1] * 100)] * 5)
    assert repeated_values(batch, 10**6) == 5 * MESSAGE_WEIGHT + 500
    assert repeated_values(batch, 50) <= 50 + 100 + MESSAGE_WEIGHT * 5  # stops once past the bound
    kwargs = gpb.ChatCompletionRequest()
    kwargs.chat_template_kwargs.update({"a": [1, 2, 3]})  # a Struct: a map of messages
    assert repeated_values(kwargs, 10**6) >= 3


async def test_a_request_of_too_many_values_is_refused_before_its_handler() -> None:
    seen: list[int] = []

    class Counting(_Servicer):
        async def echo(self, request: gpb.TokenIds, context: aio.ServicerContext) -> gpb.TokenIds:
            seen.append(len(request.ids))
            return await super().echo(request, context)

    async with _serving(Counting(), max_values=1000) as channel:
        echo = channel.unary_unary(f"/{SERVICE}/Echo")
        count = channel.unary_stream(f"/{SERVICE}/Count")
        within = gpb.TokenIds(ids=[1] * 1000).SerializeToString()
        assert len(gpb.TokenIds.FromString(await echo(within)).ids) == 1000
        over = gpb.TokenIds(ids=[1] * 1001).SerializeToString()
        for call in (echo(over), count(over).read()):
            try:
                await call
            except aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "more than 1,000 values" in (err.details() or "")
                assert dict(err.trailing_metadata() or ())["x-http-status"] == "413"
            else:
                raise AssertionError("a request past the bound was accepted")
        assert seen == [1000]


class _Kept:
    """Stands for what a failed request made (its converted body): only its frames hold it."""


class _Aborting:
    """Handlers that fail as the gateway's do: an error, turned into an abort inside its
    ``except`` block; each remembers (weakly) what its frame held."""

    def __init__(self) -> None:
        self.made: list[weakref.ref[_Kept]] = []

    async def echo(self, request: gpb.TokenIds, context: aio.ServicerContext) -> gpb.TokenIds:
        kept = _Kept()
        self.made.append(weakref.ref(kept))
        try:
            raise ValueError("the request failed")
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request failed")
        raise AssertionError("abort returned")

    async def count(self, request: gpb.TokenIds, context: aio.ServicerContext) -> AsyncIterator[gpb.TokenIds]:
        kept = _Kept()
        self.made.append(weakref.ref(kept))
        yield gpb.TokenIds(ids=[1])
        try:
            raise ValueError("the request failed")
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request failed")


async def test_an_aborted_call_leaves_nothing_of_its_request_to_the_cycle_collector() -> None:
    # grpcio keeps the abort on the call's state, which the abort's frames hold: without the
    # wrapper's unlinking, what the handler made lives until a full collection.
    servicer = _Aborting()
    gc.disable()
    try:
        async with _serving(servicer) as channel:
            good = gpb.TokenIds(ids=[1, 2, 3]).SerializeToString()
            for _ in range(3):
                try:
                    await channel.unary_unary(f"/{SERVICE}/Echo")(good)
                except aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                try:
                    async for _message in channel.unary_stream(f"/{SERVICE}/Count")(good):
                        pass
                except aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        await asyncio.sleep(0.05)  # the server finishes the calls' states
        assert len(servicer.made) == 6
        assert [ref() for ref in servicer.made] == [None] * 6
    finally:
        gc.enable()
