"""The Conversations calls of the gRPC front door (``CreateConversation``...).

Each call becomes the HTTP API's body and runs through ``server.conversations_entry``,
the path the HTTP routes take, so validation, scoping to the caller's key and storage
are the same through both doors. Items travel as the JSON the HTTP API sends (a
``Struct``); a conversation is typed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.struct_pb2 import Struct
from grpc import aio

from gateway.pipeline.request_context import RequestContext
from gateway.proto import gateway_pb2 as gpb
from gateway.server.conversations_entry import ConversationsEntry
from gateway.server.grpc import convert
from gateway.server.grpc.responses import item_list, page_args

Unary = Callable[[aio.ServicerContext, str, Callable[[RequestContext], Awaitable[Any]]], Awaitable[Any]]


def conversation_message(body: dict[str, Any]) -> gpb.Conversation:
    return gpb.Conversation(id=body["id"], created_at=int(body.get("created_at") or 0), metadata=body.get("metadata") or {})


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


class ConversationsRpcs:
    """The Conversations calls, mixed into ``TokenGatewayService`` (which gives the entry
    and its unary framing)."""

    conversations_entry: ConversationsEntry
    _unary: Unary

    async def CreateConversation(self, request: gpb.CreateConversationRequest, context: aio.ServicerContext) -> gpb.Conversation:
        async def run(ctx: RequestContext) -> gpb.Conversation:
            body: dict[str, Any] = {"metadata": dict(request.metadata)}
            if request.items:
                body["items"] = [convert.struct_dict(i) for i in request.items]
            return conversation_message(await self.conversations_entry.create(ctx, body))

        result: gpb.Conversation = await self._unary(context, "CreateConversation", run)
        return result

    async def GetConversation(self, request: gpb.ConversationRef, context: aio.ServicerContext) -> gpb.Conversation:
        async def run(ctx: RequestContext) -> gpb.Conversation:
            return conversation_message(await self.conversations_entry.retrieve(ctx, request.conversation_id))

        result: gpb.Conversation = await self._unary(context, "GetConversation", run)
        return result

    async def UpdateConversation(self, request: gpb.UpdateConversationRequest, context: aio.ServicerContext) -> gpb.Conversation:
        async def run(ctx: RequestContext) -> gpb.Conversation:
            body = {"metadata": dict(request.metadata)}
            return conversation_message(await self.conversations_entry.update(ctx, request.conversation_id, body))

        result: gpb.Conversation = await self._unary(context, "UpdateConversation", run)
        return result

    async def DeleteConversation(self, request: gpb.ConversationRef, context: aio.ServicerContext) -> gpb.DeleteConversationReply:
        async def run(ctx: RequestContext) -> gpb.DeleteConversationReply:
            out = await self.conversations_entry.delete(ctx, request.conversation_id)
            return gpb.DeleteConversationReply(id=out["id"], deleted=bool(out["deleted"]))

        result: gpb.DeleteConversationReply = await self._unary(context, "DeleteConversation", run)
        return result

    async def AddConversationItems(self, request: gpb.AddConversationItemsRequest, context: aio.ServicerContext) -> gpb.ItemList:
        async def run(ctx: RequestContext) -> gpb.ItemList:
            body = {"items": [convert.struct_dict(i) for i in request.items]}
            return item_list(await self.conversations_entry.add_items(ctx, request.conversation_id, body))

        result: gpb.ItemList = await self._unary(context, "AddConversationItems", run)
        return result

    async def ListConversationItems(self, request: gpb.ListConversationItemsRequest, context: aio.ServicerContext) -> gpb.ItemList:
        async def run(ctx: RequestContext) -> gpb.ItemList:
            page = await self.conversations_entry.list_items(
                ctx, request.conversation_id, **page_args(request)
            )
            return item_list(page)

        result: gpb.ItemList = await self._unary(context, "ListConversationItems", run)
        return result

    async def GetConversationItem(self, request: gpb.ConversationItemRef, context: aio.ServicerContext) -> gpb.ConversationItem:
        async def run(ctx: RequestContext) -> gpb.ConversationItem:
            item = await self.conversations_entry.get_item(ctx, request.conversation_id, request.item_id)
            return gpb.ConversationItem(item=_struct(item))

        result: gpb.ConversationItem = await self._unary(context, "GetConversationItem", run)
        return result

    async def DeleteConversationItem(self, request: gpb.ConversationItemRef, context: aio.ServicerContext) -> gpb.Conversation:
        async def run(ctx: RequestContext) -> gpb.Conversation:
            return conversation_message(await self.conversations_entry.delete_item(ctx, request.conversation_id, request.item_id))

        result: gpb.Conversation = await self._unary(context, "DeleteConversationItem", run)
        return result
