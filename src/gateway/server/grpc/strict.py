"""Registering gRPC services so a request that is not valid protobuf gets INVALID_ARGUMENT,
and one that carries too many values gets RESOURCE_EXHAUSTED, before any handler runs.

grpcio answers a body its deserializer cannot parse with a bare INTERNAL ("Exception
deserializing request!") and logs a traceback: to a client that looks like a gateway
bug. ``register`` wraps each method's deserializer to hand the handler a marker
instead, and the handler's behaviour to answer the marker with its status.

The parse itself is cheap (no Python object per element); turning the request into the
HTTP API's shapes is not (a Python object per token id or message, on the event loop):
past ``max_values`` elements of repeated fields, counted at every depth, the request is
refused as the HTTP door refuses a body of too many JSON values.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio

from gateway.protocol import headers


class _Unparseable:
    """What the handler gets instead of a request it must refuse, and how to refuse it."""

    __slots__ = ("code", "error", "status")

    def __init__(self, error: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT, status: int = 400) -> None:
        self.error = error
        self.code = code
        self.status = status


async def _refuse(context: aio.ServicerContext, bad: _Unparseable) -> None:
    context.set_trailing_metadata(((headers.ERROR_TYPE, "invalid_request_error"), (headers.HTTP_STATUS, str(bad.status))))
    await context.abort(bad.code, bad.error)


MESSAGE_WEIGHT = 16
"""What one element of a repeated message field counts for: turning it into the HTTP API's
shape (``json_format.MessageToDict``) costs about 3 µs, some 20 times what parsing one JSON
value costs, where a token id costs less than one."""


def repeated_values(message: Message, limit: int) -> int:
    """The elements of ``message``'s repeated and map fields at every depth, each message
    (or map entry whose value is a message) weighing ``MESSAGE_WEIGHT``; the count stops
    growing once it passes ``limit`` (the caller only asks whether it does)."""
    total = 0
    for field, value in message.ListFields():
        kind = field.message_type
        if not field.is_repeated:
            if kind is not None:
                total += repeated_values(value, limit - total)
        else:
            items: Any = value
            if kind is not None and kind.GetOptions().map_entry:  # a map: its values, if they are messages
                kind = kind.fields_by_name["value"].message_type
                items = value.values() if kind is not None else ()
            total += len(value) * (MESSAGE_WEIGHT if kind is not None else 1)
            if kind is not None and total <= limit:
                for item in items:
                    total += repeated_values(item, limit - total)
                    if total > limit:
                        break
        if total > limit:
            break
    return total


def _deserializer(parse: Callable[[bytes], Any], max_values: int) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            request = parse(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            return _Unparseable(f"the request is not a valid protobuf message: {str(exc)[:200] or type(exc).__name__}")
        # Every element takes at least a byte (a message element two, and weighs at most
        # MESSAGE_WEIGHT): a message this short is within the bound.
        if max_values and len(data) * MESSAGE_WEIGHT // 2 > max_values and repeated_values(request, max_values) > max_values:
            return _Unparseable(
                f"the request carries more than {max_values:,} values in its repeated fields (token ids, messages...)",
                grpc.StatusCode.RESOURCE_EXHAUSTED, 413,
            )
        return request

    return deserialize


def unlinked(abort: aio.AbortError) -> aio.AbortError:
    """``abort`` without its traceback and the error it was raised from.

    grpcio keeps the abort exception on the call's state, and its traceback's frames hold
    the servicer context, which holds that state: a reference cycle, left to the cyclic
    collector, that also holds every frame of the failed request (its converted body, the
    request message). The serving process collects cycles rarely (``gc_policy``), so a
    client sending large requests that fail would grow memory by their size each time."""
    abort.__context__ = abort.__cause__ = None
    return abort.with_traceback(None)


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: aio.ServicerContext) -> Any:
        try:
            if isinstance(request, _Unparseable):
                await _refuse(context, request)
            return await behaviour(request, context)
        except aio.AbortError as abort:
            del request, context
            raise unlinked(abort) from None

    return handle


def _streaming(behaviour: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handle(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            if isinstance(request, _Unparseable):
                await _refuse(context, request)
                return
            async for message in behaviour(request, context):
                yield message
        except aio.AbortError as abort:
            del request, context
            raise unlinked(abort) from None

    return handle


def strict_handler(handler: grpc.RpcMethodHandler, max_values: int = 0) -> grpc.RpcMethodHandler:
    """``handler`` refusing unparseable requests, and those past ``max_values`` (0: no bound)."""
    if handler.request_streaming or handler.request_deserializer is None:
        return handler  # none of the gateway's methods stream requests
    fields: dict[str, Any] = {"request_deserializer": _deserializer(handler.request_deserializer, max_values)}
    if handler.unary_unary is not None:
        fields["unary_unary"] = _unary(handler.unary_unary)
    if handler.unary_stream is not None:
        fields["unary_stream"] = _streaming(handler.unary_stream)
    return handler._replace(**fields)  # type: ignore[attr-defined,no-any-return]


class _Registrar:
    """What a generated ``add_XServicer_to_server`` calls, wrapping each handler."""

    def __init__(self, server: aio.Server, max_values: int) -> None:
        self._server = server
        self._max_values = max_values

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # add_registered_method_handlers below registers both ways

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        strict = {name: strict_handler(h, self._max_values) for name, h in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, strict),))
        self._server.add_registered_method_handlers(service, strict)


def register(add: Callable[[Any, Any], None], servicer: Any, server: aio.Server, max_values: int = 0) -> None:
    """``add(servicer, server)`` (a generated function) with every method made strict:
    a request past ``max_values`` elements of repeated fields (0: no bound) is refused."""
    add(servicer, _Registrar(server, max_values))
