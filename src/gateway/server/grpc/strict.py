"""Registering gRPC services so a request that is not valid protobuf gets INVALID_ARGUMENT.

grpcio answers a body its deserializer cannot parse with a bare INTERNAL ("Exception
deserializing request!") and logs a traceback: to a client that looks like a gateway
bug. ``register`` wraps each method's deserializer to hand the handler a marker
instead, and the handler's behaviour to answer the marker with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio


class _Unparseable:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


async def _refuse(context: aio.ServicerContext, bad: _Unparseable) -> None:
    context.set_trailing_metadata((("x-error-type", "invalid_request_error"), ("x-http-status", "400")))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid protobuf message: {bad.error}")


def _deserializer(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            return _Unparseable(str(exc)[:200] or type(exc).__name__)

    return deserialize


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: aio.ServicerContext) -> Any:
        if isinstance(request, _Unparseable):
            await _refuse(context, request)
        return await behaviour(request, context)

    return handle


def _streaming(behaviour: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handle(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, _Unparseable):
            await _refuse(context, request)
            return
        async for message in behaviour(request, context):
            yield message

    return handle


def strict_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    if handler.request_streaming or handler.request_deserializer is None:
        return handler  # none of the gateway's methods stream requests
    fields: dict[str, Any] = {"request_deserializer": _deserializer(handler.request_deserializer)}
    if handler.unary_unary is not None:
        fields["unary_unary"] = _unary(handler.unary_unary)
    if handler.unary_stream is not None:
        fields["unary_stream"] = _streaming(handler.unary_stream)
    return handler._replace(**fields)  # type: ignore[attr-defined,no-any-return]


class _Registrar:
    """What a generated ``add_XServicer_to_server`` calls, wrapping each handler."""

    def __init__(self, server: aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # add_registered_method_handlers below registers both ways

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        strict = {name: strict_handler(h) for name, h in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, strict),))
        self._server.add_registered_method_handlers(service, strict)


def register(add: Callable[[Any, Any], None], servicer: Any, server: aio.Server) -> None:
    """``add(servicer, server)`` (a generated function) with every method made strict."""
    add(servicer, _Registrar(server))
