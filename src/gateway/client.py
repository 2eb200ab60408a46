"""A small typed Python client for the gateway's gRPC API (``token_gateway.v1``).

    async with GatewayClient("127.0.0.1:50051", api_key="KEY") as client:
        reply = await client.chat([user("Say hi")], max_tokens=16)
        print(reply.choices[0].message.content, reply.worker_ids)
        async for chunk in client.stream_chat([user("Count to 5")]):
            print(chunk.choices[0].delta.content, end="")
        first = await client.create_response("Hi", model="m", instructions="Be brief.")
        again = await client.create_response("More?", previous_response_id=first.id)

    with SyncGatewayClient("127.0.0.1:50051") as client:   # the same calls, blocking
        print(client.complete("Once upon a time", max_tokens=8).choices[0].text)

Requests and replies are the generated messages of ``gateway.proto.gateway_pb2``
(typed through their ``.pyi``). The keyword arguments are fields of the request
message, with sampling fields (``max_tokens``, ``temperature``, ``stop``...) put
into its ``sampling`` message for you. Failures raise ``GatewayRpcError`` with the
gRPC status and the OpenAI error type/code the gateway sent along.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from gateway.protocol import headers

R = TypeVar("R")

__all__ = [
    "GatewayClient",
    "GatewayRpcError",
    "SyncGatewayClient",
    "assistant",
    "gpb",
    "response_request",
    "system",
    "tool",
    "user",
]

_SAMPLING_FIELDS = frozenset(gpb.Sampling.DESCRIPTOR.fields_by_name)
_GENERATE_SAMPLING_FIELDS = frozenset(gpb.GenerateSampling.DESCRIPTOR.fields_by_name)


class GatewayRpcError(Exception):
    """A failed call: gRPC ``code`` and ``details`` plus the gateway's error fields."""

    def __init__(self, exc: grpc.RpcError) -> None:
        call = cast("grpc.Call", exc)
        self.code: grpc.StatusCode = call.code()
        self.details: str = call.details() or ""
        trailers = dict(call.trailing_metadata() or ())
        self.type: str | None = trailers.get(headers.ERROR_TYPE)
        self.error_code: str | None = trailers.get(headers.ERROR_CODE)
        self.param: str | None = trailers.get(headers.ERROR_PARAM)
        retry = trailers.get(headers.RETRY_AFTER)
        self.retry_after: float | None = float(retry) if retry else None
        super().__init__(f"{self.code.name}: {self.details}")


def user(content: str) -> gpb.ChatMessage:
    return gpb.ChatMessage(role="user", content=content)


def system(content: str) -> gpb.ChatMessage:
    return gpb.ChatMessage(role="system", content=content)


def assistant(content: str) -> gpb.ChatMessage:
    return gpb.ChatMessage(role="assistant", content=content)


def tool(content: str, tool_call_id: str) -> gpb.ChatMessage:
    return gpb.ChatMessage(role="tool", content=content, tool_call_id=tool_call_id)


def function_tool(name: str, parameters: dict[str, Any], description: str | None = None) -> gpb.Tool:
    """A tool declaration from a JSON-schema dict."""
    fn = gpb.FunctionDefinition(name=name, parameters_json=json.dumps(parameters))
    if description is not None:
        fn.description = description
    return gpb.Tool(type="function", function=fn)


def _split(fields: dict[str, Any], sampling_names: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    sampling = {k: fields.pop(k) for k in list(fields) if k in sampling_names}
    return fields, sampling


def _messages(messages: Iterable[gpb.ChatMessage | dict[str, Any]]) -> list[gpb.ChatMessage]:
    return [m if isinstance(m, gpb.ChatMessage) else gpb.ChatMessage(**m) for m in messages]


def _prompt(prompt: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]]) -> dict[str, Any]:
    """A prompt (text, token ids, or a batch of either) as the request's oneof field."""
    if isinstance(prompt, str):
        return {"text": prompt}
    items = list(prompt)
    if items and all(isinstance(p, str) for p in items):
        return {"texts": gpb.TextBatch(texts=items)}  # type: ignore[arg-type]
    if items and all(isinstance(p, int) for p in items):
        return {"token_ids": gpb.TokenIds(ids=items)}  # type: ignore[arg-type]
    rows = cast("list[Sequence[int]]", items)
    return {"token_id_batch": gpb.TokenIdBatch(prompts=[gpb.TokenIds(ids=list(p)) for p in rows])}


Messages = Iterable[gpb.ChatMessage | dict[str, Any]]
Prompt = str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]]
Metadata = Sequence[tuple[str, str]] | None


# ---------------------------------------------------------------- request builders


def chat_request(messages: Messages | gpb.ChatCompletionRequest, **fields: Any) -> gpb.ChatCompletionRequest:
    if isinstance(messages, gpb.ChatCompletionRequest):
        return messages
    fields, sampling = _split(fields, _SAMPLING_FIELDS)
    return gpb.ChatCompletionRequest(messages=_messages(messages), sampling=gpb.Sampling(**sampling), **fields)


def completion_request(prompt: Prompt | gpb.CompletionRequest, **fields: Any) -> gpb.CompletionRequest:
    if isinstance(prompt, gpb.CompletionRequest):
        return prompt
    fields, sampling = _split(fields, _SAMPLING_FIELDS)
    return gpb.CompletionRequest(**_prompt(prompt), sampling=gpb.Sampling(**sampling), **fields)


def generate_request(
    input_ids: Sequence[int], *, stream: bool = False, return_logprob: bool = False,
    top_logprobs_num: int = 0, rid: str = "", model: str = "", **sampling: Any,
) -> gpb.GenerateRequest:
    """``sampling`` takes SGLang's sampling_params names (``max_new_tokens``, ``n``...)."""
    unknown = set(sampling) - _GENERATE_SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling params: {sorted(unknown)}")
    return gpb.GenerateRequest(
        input_ids=list(input_ids), sampling_params=gpb.GenerateSampling(**sampling), stream=stream,
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, rid=rid, model=model,
    )


def tokenize_request(prompt: str | None = None, *, messages: Messages | None = None, model: str = "", **fields: Any) -> gpb.TokenizeRequest:
    request = gpb.TokenizeRequest(model=model, messages=_messages(messages or ()), **fields)
    if prompt is not None:
        request.prompt = prompt
    return request


def inspect_request(prompt: str | Sequence[int] | None = None, *, messages: Messages | None = None, **fields: Any) -> gpb.InspectPrefixRequest:
    request = gpb.InspectPrefixRequest(**fields)
    if messages is not None:
        request.messages.messages.extend(_messages(messages))
    elif isinstance(prompt, str):
        request.text = prompt
    elif prompt is not None:
        request.token_ids.ids.extend(prompt)
    return request


def _struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def response_request(input: str | Sequence[dict[str, Any]] | gpb.CreateResponseRequest, **fields: Any) -> gpb.CreateResponseRequest:
    """A Responses request: ``input`` a string or the HTTP API's item dicts; ``tools`` and
    ``text`` as the HTTP API's dicts, ``tool_choice`` a mode string or ``{"name": ...}``,
    the rest the message's own fields (``model``, ``previous_response_id``, ``include``...)."""
    if isinstance(input, gpb.CreateResponseRequest):
        return input
    request = gpb.CreateResponseRequest()
    if isinstance(input, str):
        request.input_text = input
    else:
        request.input_items.items.extend(_struct(dict(item)) for item in input)
    request.tools.extend(_struct(dict(t)) for t in fields.pop("tools", None) or ())
    if (text := fields.pop("text", None)) is not None:
        request.text.CopyFrom(_struct(dict(text)))
    choice = fields.pop("tool_choice", None)
    if isinstance(choice, str):
        request.tool_choice.mode = choice
    elif isinstance(choice, dict):
        request.tool_choice.function_name = choice["name"]
    request.metadata.update(fields.pop("metadata", None) or {})
    request.include.extend(fields.pop("include", None) or ())
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def _fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A client method's keywords as ``response_request``'s (``response_metadata`` is the
    response's ``metadata``: the methods' own ``metadata`` is the call's)."""
    out = dict(fields)
    if "response_metadata" in out:
        out["metadata"] = out.pop("response_metadata")
    return out


def _auth(api_key: str | None, metadata: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(metadata) + ((headers.bearer(api_key),) if api_key else ())


# ---------------------------------------------------------------- clients


class GatewayClient:
    """Async client over one channel. ``metadata`` adds routing keys and the like
    (``x-smg-routing-key``, ``x-smg-target-worker``, ``x-request-id``) to every call."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None = 60.0,
        channel: aio.Channel | None = None,
    ) -> None:
        self._own_channel = channel is None
        self.channel = channel or aio.insecure_channel(target)
        self.stub = gpb_grpc.TokenGatewayStub(self.channel)
        self._metadata = _auth(api_key, metadata)
        self.timeout = timeout

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_channel:
            await self.channel.close()

    def _md(self, metadata: Metadata) -> tuple[tuple[str, str], ...]:
        return self._metadata + tuple(metadata or ())

    async def _unary(self, method: Any, request: Any, metadata: Metadata = None, timeout: float | None = None) -> Any:
        try:
            return await method(request, metadata=self._md(metadata), timeout=timeout if timeout is not None else self.timeout)
        except aio.AioRpcError as exc:
            raise GatewayRpcError(exc) from None

    async def _stream(self, method: Any, request: Any, metadata: Metadata, timeout: float | None) -> AsyncIterator[Any]:
        call = method(request, metadata=self._md(metadata), timeout=timeout if timeout is not None else self.timeout)
        try:
            async for message in call:
                yield message
        except aio.AioRpcError as exc:
            raise GatewayRpcError(exc) from None
        finally:
            call.cancel()  # no-op when finished; stops the gateway's work when the caller leaves early

    chat_request = staticmethod(chat_request)
    completion_request = staticmethod(completion_request)

    async def chat(self, messages: Messages | gpb.ChatCompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> gpb.ChatCompletionResponse:
        reply: gpb.ChatCompletionResponse = await self._unary(self.stub.ChatCompletion, chat_request(messages, **fields), metadata, timeout)
        return reply

    def stream_chat(self, messages: Messages | gpb.ChatCompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> AsyncIterator[gpb.ChatCompletionChunk]:
        return self._stream(self.stub.StreamChatCompletion, chat_request(messages, **fields), metadata, timeout)

    async def complete(self, prompt: Prompt | gpb.CompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> gpb.CompletionResponse:
        reply: gpb.CompletionResponse = await self._unary(self.stub.Completion, completion_request(prompt, **fields), metadata, timeout)
        return reply

    def stream_complete(self, prompt: Prompt | gpb.CompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> AsyncIterator[gpb.CompletionChunk]:
        return self._stream(self.stub.StreamCompletion, completion_request(prompt, **fields), metadata, timeout)

    def generate(self, input_ids: Sequence[int], *, metadata: Metadata = None, timeout: float | None = None, **options: Any) -> AsyncIterator[gpb.GenerateResponse]:
        """Raw token ids in; one message per sample (or deltas with ``stream=True``) out."""
        return self._stream(self.stub.Generate, generate_request(input_ids, **options), metadata, timeout)

    async def tokenize(self, prompt: str | None = None, *, messages: Messages | None = None, model: str = "", **fields: Any) -> gpb.TokenizeResponse:
        reply: gpb.TokenizeResponse = await self._unary(self.stub.Tokenize, tokenize_request(prompt, messages=messages, model=model, **fields))
        return reply

    async def detokenize(self, tokens: Sequence[int], *, model: str = "") -> str:
        reply = await self._unary(self.stub.Detokenize, gpb.DetokenizeRequest(model=model, tokens=list(tokens)))
        return str(reply.text)

    async def embed(self, inputs: Prompt, *, model: str = "", metadata: Metadata = None) -> gpb.EmbedResponse:
        reply: gpb.EmbedResponse = await self._unary(self.stub.Embed, gpb.EmbedRequest(model=model, **_prompt(inputs)), metadata)
        return reply

    async def list_models(self) -> list[gpb.ModelCard]:
        reply = await self._unary(self.stub.ListModels, gpb.ListModelsRequest())
        return list(reply.models)

    async def list_workers(self) -> list[gpb.WorkerStatus]:
        reply = await self._unary(self.stub.ListWorkers, gpb.ListWorkersRequest())
        return list(reply.workers)

    async def inspect_prefix(self, prompt: str | Sequence[int] | None = None, *, messages: Messages | None = None, **fields: Any) -> gpb.InspectPrefixResponse:
        """What the router sees for a prompt (text, token ids, or chat messages)."""
        reply: gpb.InspectPrefixResponse = await self._unary(self.stub.InspectPrefix, inspect_request(prompt, messages=messages, **fields))
        return reply

    # ---------------------------------------------------------------- responses
    async def create_response(self, input: str | Sequence[dict[str, Any]] | gpb.CreateResponseRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> gpb.Response:
        """A whole response (``background=True``: at once, in progress); the whole
        Responses object is in ``.body``, the common fields typed. ``metadata`` is the
        call's gRPC metadata, as everywhere here; the response's own is ``response_metadata``."""
        reply: gpb.Response = await self._unary(self.stub.CreateResponse, response_request(input, **_fields(fields)), metadata, timeout)
        return reply

    def stream_response(self, input: str | Sequence[dict[str, Any]] | gpb.CreateResponseRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> AsyncIterator[gpb.ResponseEvent]:
        """The response's stream events; leaving early cancels the response."""
        return self._stream(self.stub.StreamResponse, response_request(input, **_fields(fields)), metadata, timeout)

    async def get_response(self, response_id: str) -> gpb.Response:
        reply: gpb.Response = await self._unary(self.stub.GetResponse, gpb.ResponseRef(response_id=response_id))
        return reply

    def stream_stored_response(self, response_id: str, starting_after: int | None = None, *, timeout: float | None = None) -> AsyncIterator[gpb.ResponseEvent]:
        """A background response's events after ``starting_after``, then the rest as it runs."""
        request = gpb.StreamStoredResponseRequest(response_id=response_id)
        if starting_after is not None:
            request.starting_after = starting_after
        return self._stream(self.stub.StreamStoredResponse, request, None, timeout)

    async def delete_response(self, response_id: str) -> bool:
        reply = await self._unary(self.stub.DeleteResponse, gpb.ResponseRef(response_id=response_id))
        return bool(reply.deleted)

    async def cancel_response(self, response_id: str) -> gpb.Response:
        reply: gpb.Response = await self._unary(self.stub.CancelResponse, gpb.ResponseRef(response_id=response_id))
        return reply

    async def list_response_input_items(self, response_id: str, **paging: Any) -> gpb.ItemList:
        """``after``, ``limit`` (1-100), ``order`` (``asc`` / ``desc``) as keywords."""
        reply: gpb.ItemList = await self._unary(self.stub.ListResponseInputItems, gpb.ListInputItemsRequest(response_id=response_id, **paging))
        return reply


class SyncGatewayClient:
    """The same calls as ``GatewayClient``, blocking, over a synchronous channel."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float | None = 60.0,
    ) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = gpb_grpc.TokenGatewayStub(self.channel)
        self._metadata = _auth(api_key, metadata)
        self.timeout = timeout

    def __enter__(self) -> SyncGatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _unary(self, method: Any, request: Any, metadata: Metadata = None, timeout: float | None = None) -> Any:
        try:
            return method(request, metadata=self._metadata + tuple(metadata or ()), timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as exc:
            raise GatewayRpcError(exc) from None

    def _stream(self, method: Any, request: Any, metadata: Metadata, timeout: float | None) -> Iterator[Any]:
        call = method(request, metadata=self._metadata + tuple(metadata or ()), timeout=timeout if timeout is not None else self.timeout)
        try:
            yield from call
        except grpc.RpcError as exc:
            raise GatewayRpcError(exc) from None
        finally:
            call.cancel()

    def chat(self, messages: Messages | gpb.ChatCompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> gpb.ChatCompletionResponse:
        reply: gpb.ChatCompletionResponse = self._unary(self.stub.ChatCompletion, chat_request(messages, **fields), metadata, timeout)
        return reply

    def stream_chat(self, messages: Messages | gpb.ChatCompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> Iterator[gpb.ChatCompletionChunk]:
        return self._stream(self.stub.StreamChatCompletion, chat_request(messages, **fields), metadata, timeout)

    def complete(self, prompt: Prompt | gpb.CompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> gpb.CompletionResponse:
        reply: gpb.CompletionResponse = self._unary(self.stub.Completion, completion_request(prompt, **fields), metadata, timeout)
        return reply

    def stream_complete(self, prompt: Prompt | gpb.CompletionRequest, *, metadata: Metadata = None, timeout: float | None = None, **fields: Any) -> Iterator[gpb.CompletionChunk]:
        return self._stream(self.stub.StreamCompletion, completion_request(prompt, **fields), metadata, timeout)

    def generate(self, input_ids: Sequence[int], *, metadata: Metadata = None, timeout: float | None = None, **options: Any) -> Iterator[gpb.GenerateResponse]:
        return self._stream(self.stub.Generate, generate_request(input_ids, **options), metadata, timeout)

    def tokenize(self, prompt: str | None = None, *, messages: Messages | None = None, model: str = "", **fields: Any) -> gpb.TokenizeResponse:
        reply: gpb.TokenizeResponse = self._unary(self.stub.Tokenize, tokenize_request(prompt, messages=messages, model=model, **fields))
        return reply

    def detokenize(self, tokens: Sequence[int], *, model: str = "") -> str:
        return str(self._unary(self.stub.Detokenize, gpb.DetokenizeRequest(model=model, tokens=list(tokens))).text)

    def embed(self, inputs: Prompt, *, model: str = "", metadata: Metadata = None) -> gpb.EmbedResponse:
        reply: gpb.EmbedResponse = self._unary(self.stub.Embed, gpb.EmbedRequest(model=model, **_prompt(inputs)), metadata)
        return reply

    def list_models(self) -> list[gpb.ModelCard]:
        return list(self._unary(self.stub.ListModels, gpb.ListModelsRequest()).models)

    def list_workers(self) -> list[gpb.WorkerStatus]:
        return list(self._unary(self.stub.ListWorkers, gpb.ListWorkersRequest()).workers)

    def inspect_prefix(self, prompt: str | Sequence[int] | None = None, *, messages: Messages | None = None, **fields: Any) -> gpb.InspectPrefixResponse:
        reply: gpb.InspectPrefixResponse = self._unary(self.stub.InspectPrefix, inspect_request(prompt, messages=messages, **fields))
        return reply
