"""The Responses calls of the gRPC front door (``CreateResponse``, ``StreamResponse``...).

Each call becomes the HTTP API's request (``ResponsesRequest``, a response id, a page)
and runs through ``server.responses_entry``, the path the HTTP door takes too, so
admission, storage, background runs and errors are the same through both doors. Only
the framing is this module's: a response, an event and an item travel as the JSON the
HTTP API sends (a ``Struct``), with the fields a client reads most also typed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf.struct_pb2 import Struct
from grpc import aio

from gateway.endpoints.events import Events
from gateway.pipeline.request_context import RequestContext
from gateway.proto import gateway_pb2 as gpb
from gateway.protocol.errors import GatewayError, InvalidRequestError
from gateway.protocol.limits import MAX_INPUT_ITEMS
from gateway.protocol.responses_api import ResponsesRequest
from gateway.server.grpc import convert
from gateway.server.grpc.util import abort_with, client_deadline, reply_metadata
from gateway.server.http.util import parse_model
from gateway.server.responses_entry import ResponsesEntry

log = logging.getLogger(__name__)

_DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta"})


def response_request(request: gpb.CreateResponseRequest, *, stream: bool) -> dict[str, Any]:
    """The ``POST /v1/responses`` body a ``CreateResponseRequest`` stands for."""
    body: dict[str, Any] = {"stream": stream, "background": request.background}
    if request.model:
        body["model"] = request.model
    kind = request.WhichOneof("input")
    if kind == "input_text":
        body["input"] = request.input_text
    elif kind == "input_items":
        items = request.input_items.items
        if len(items) > MAX_INPUT_ITEMS:  # counted before each costs its conversion
            raise InvalidRequestError(f"input may hold at most {MAX_INPUT_ITEMS} items, not {len(items)}", param="input")
        body["input"] = [convert.struct_dict(item) for item in items]
    for name in ("instructions", "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "store",
                 "previous_response_id", "conversation", "user", "top_logprobs", "truncation", "seed"):
        if request.HasField(name):
            body[name] = getattr(request, name)
    if request.tools:
        body["tools"] = [convert.struct_dict(t) for t in request.tools]
    if request.HasField("tool_choice"):
        choice = request.tool_choice
        which = choice.WhichOneof("choice")
        if which == "mode":
            body["tool_choice"] = choice.mode
        elif which == "function_name":
            body["tool_choice"] = {"type": "function", "name": choice.function_name}
    if request.HasField("reasoning_effort"):
        body["reasoning"] = {"effort": request.reasoning_effort}
    if request.metadata:
        body["metadata"] = dict(request.metadata)
    if request.HasField("text"):
        body["text"] = convert.struct_dict(request.text)
    if request.include:
        body["include"] = list(request.include)
    return body


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def response_message(body: dict[str, Any], worker_ids: list[str] | None = None) -> gpb.Response:
    """A Responses object as a ``Response``: typed head, the whole object as ``body``."""
    out = gpb.Response(
        id=body.get("id") or "", status=body.get("status") or "", model=body.get("model") or "",
        created_at=int(body.get("created_at") or 0), body=_struct(body), worker_ids=worker_ids or [],
    )
    out.output_text = "".join(
        part.get("text", "")
        for item in body.get("output") or () if item.get("type") == "message"
        for part in item.get("content") or () if part.get("type") == "output_text"
    )
    usage = body.get("usage")
    if usage:
        out.usage.input_tokens = usage.get("input_tokens") or 0
        out.usage.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        out.usage.output_tokens = usage.get("output_tokens") or 0
        out.usage.reasoning_tokens = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
        out.usage.total_tokens = usage.get("total_tokens") or 0
    return out


def event_message(event: dict[str, Any]) -> gpb.ResponseEvent:
    kind = str(event.get("type", ""))
    delta = event.get("delta") if kind in _DELTAS else None
    return gpb.ResponseEvent(
        type=kind, sequence_number=int(event.get("sequence_number", 0)), delta=delta or "", event=_struct(event),
    )


def page_args(request: Any) -> dict[str, Any]:
    """A list request's optional paging fields, unset ones as None (the entries' defaults)."""
    return {name: getattr(request, name) if request.HasField(name) else None for name in ("after", "limit", "order")}


def item_list(page: dict[str, Any]) -> gpb.ItemList:
    return gpb.ItemList(
        data=[_struct(item) for item in page.get("data") or ()], first_id=page.get("first_id") or "",
        last_id=page.get("last_id") or "", has_more=bool(page.get("has_more")),
    )


Unary = Callable[[aio.ServicerContext, str, Callable[[RequestContext], Awaitable[Any]]], Awaitable[Any]]
Scope = Callable[[RequestContext, str], Any]  # the service's ``admitted``: an async context manager


class ResponsesRpcs:
    """The Responses calls, mixed into ``TokenGatewayService`` (which gives the entry,
    the call's context reader, its unary framing and its admission scope)."""

    responses_entry: ResponsesEntry
    auth: Any
    _unary: Unary
    admitted: Scope

    async def CreateResponse(self, request: gpb.CreateResponseRequest, context: aio.ServicerContext) -> gpb.Response:
        async def run(ctx: RequestContext) -> gpb.Response:
            req = parse_model(ResponsesRequest, response_request(request, stream=False))
            body = await self.responses_entry.create(req, ctx, sse=False)
            assert isinstance(body, dict)
            return response_message(body, list(dict.fromkeys(ctx.worker_ids)))

        result: gpb.Response = await self._unary(context, "CreateResponse", run)
        return result

    async def GetResponse(self, request: gpb.ResponseRef, context: aio.ServicerContext) -> gpb.Response:
        async def run(ctx: RequestContext) -> gpb.Response:
            return response_message(await self.responses_entry.retrieve(ctx, request.response_id))

        result: gpb.Response = await self._unary(context, "GetResponse", run)
        return result

    async def DeleteResponse(self, request: gpb.ResponseRef, context: aio.ServicerContext) -> gpb.DeleteResponseReply:
        async def run(ctx: RequestContext) -> gpb.DeleteResponseReply:
            out = await self.responses_entry.delete(ctx, request.response_id)
            return gpb.DeleteResponseReply(id=out["id"], deleted=bool(out["deleted"]))

        result: gpb.DeleteResponseReply = await self._unary(context, "DeleteResponse", run)
        return result

    async def CancelResponse(self, request: gpb.ResponseRef, context: aio.ServicerContext) -> gpb.Response:
        async def run(ctx: RequestContext) -> gpb.Response:
            return response_message(await self.responses_entry.cancel(ctx, request.response_id))

        result: gpb.Response = await self._unary(context, "CancelResponse", run)
        return result

    async def ListResponseInputItems(self, request: gpb.ListInputItemsRequest, context: aio.ServicerContext) -> gpb.ItemList:
        async def run(ctx: RequestContext) -> gpb.ItemList:
            page = await self.responses_entry.input_items(
                ctx, request.response_id, **page_args(request)
            )
            return item_list(page)

        result: gpb.ItemList = await self._unary(context, "ListResponseInputItems", run)
        return result

    async def StreamResponse(self, request: gpb.CreateResponseRequest, context: aio.ServicerContext) -> AsyncGenerator[gpb.ResponseEvent, None]:
        async def start(ctx: RequestContext) -> AsyncIterator[dict[str, Any]]:
            req = parse_model(ResponsesRequest, response_request(request, stream=True))
            events = await self.responses_entry.create(req, ctx, sse=False)
            if not isinstance(events, Events):
                raise TypeError("a streamed response returned a whole answer")
            return events  # type: ignore[return-value]

        async for message in self._relay(context, "StreamResponse", start):
            yield message

    async def StreamStoredResponse(
        self, request: gpb.StreamStoredResponseRequest, context: aio.ServicerContext,
    ) -> AsyncGenerator[gpb.ResponseEvent, None]:
        after = request.starting_after if request.HasField("starting_after") else -1

        async def start(ctx: RequestContext) -> AsyncIterator[dict[str, Any]]:
            return await self.responses_entry.replay(ctx, request.response_id, after)

        async for message in self._relay(context, "StreamStoredResponse", start):
            yield message

    async def _relay(
        self, context: aio.ServicerContext, method: str, start: Callable[[RequestContext], Awaitable[AsyncIterator[dict[str, Any]]]],
    ) -> AsyncGenerator[gpb.ResponseEvent, None]:
        """Start the events (errors before the first become the call's status), then send
        each as a message. However the call ends (the last event, an error, the client's
        cancel or deadline), the events are closed: a run the client left is cancelled
        and its worker request stopped, as on the HTTP door."""
        try:
            ctx = self.auth.context(context)
            with client_deadline(context):
                async with self.admitted(ctx, method):
                    events = await start(ctx)
                    try:
                        await context.send_initial_metadata(reply_metadata(ctx))
                        async for event in events:
                            yield event_message(event)
                    finally:
                        if isinstance(events, Events):
                            await events.aclose()
                        else:
                            aclose = getattr(events, "aclose", None)
                            if aclose is not None:
                                await aclose()
        except GatewayError as exc:
            log.info("gRPC %s failed: %s", method, exc.message)
            await abort_with(context, exc)
