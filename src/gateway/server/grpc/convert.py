"""Translate between the gateway's gRPC messages and the HTTP path's shapes.

Requests become the same JSON-shaped dicts the HTTP API parses into its request
models, so both front doors share one set of validation rules and defaults.
Whole responses come back from the pipeline as OpenAI-shaped dicts and are copied
into typed messages here; stream events are typed objects (``protocol.stream``) whose
fields map straight onto the proto, once per token batch, field by field.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from gateway.proto import gateway_pb2 as gpb
from gateway.protocol import limits
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.responses import ChoiceLogprobs, CompletionLogprobs
from gateway.protocol.stream import (
    ChatDelta,
    CompletionDelta,
    StreamChunk,
    StreamUsage,
    ToolCallFragment,
)

# --------------------------------------------------------------------- requests


def _dict(message: Message) -> dict[str, Any]:
    """A message as JSON with proto field names; unset optional fields are left out."""
    return MessageToDict(message, preserving_proto_field_name=True)


def _int64s(d: dict[str, Any], *names: str) -> None:
    """``MessageToDict`` writes 64-bit integers as strings (JSON's rule); undo that."""
    for name in names:
        if name in d:
            d[name] = int(d[name])


def _json_field(text: str, param: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(f"{param} is not valid JSON: {exc}", param=param) from None


def _sampling(request: Message, field: str = "sampling") -> dict[str, Any]:
    if not request.HasField(field):
        return {}
    out = _dict(getattr(request, field))
    _int64s(out, "seed", "sampling_seed")
    return out


def message_dicts(messages: Any, what: str = "messages") -> list[dict[str, Any]]:
    """The messages as the HTTP API's dicts, counted first (each costs a few µs here)."""
    if len(messages) > limits.MAX_MESSAGES:
        raise InvalidRequestError(
            f"{what} may hold at most {limits.MAX_MESSAGES} messages, not {len(messages)}", param=what
        )
    return [_dict(m) for m in messages]


def _whole_numbers(value: Any) -> Any:
    """A Struct's numbers are doubles; give whole ones back their int form, as JSON
    text would (so a template renders ``3``, not ``3.0``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def struct_dict(struct: Message) -> dict[str, Any]:
    """A ``google.protobuf.Struct`` as the JSON object it stands for."""
    out: dict[str, Any] = _whole_numbers(_dict(struct))
    return out


def _tools(request: gpb.ChatCompletionRequest) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(request.tools):
        fn = _dict(tool.function)
        text = fn.pop("parameters_json", None)
        if text:
            fn["parameters"] = _json_field(text, f"tools.[{i}].function.parameters_json")
        tools.append({"type": tool.type or "function", "function": fn})
    return tools


def _tool_choice(choice: gpb.ToolChoice) -> Any:
    kind = choice.WhichOneof("choice")
    if kind == "mode":
        return choice.mode
    if kind == "function_name":
        return {"type": "function", "function": {"name": choice.function_name}}
    return None


def _response_format(fmt: gpb.ResponseFormat) -> dict[str, Any]:
    out: dict[str, Any] = {"type": fmt.type}
    if fmt.HasField("json_schema"):
        schema = _dict(fmt.json_schema)
        text = schema.pop("schema_json", None)
        if text:
            schema["schema"] = _json_field(text, "response_format.json_schema.schema_json")
        out["json_schema"] = schema
    return out


def chat_request(request: gpb.ChatCompletionRequest, *, stream: bool) -> dict[str, Any]:
    """A ``ChatCompletionRequest`` message as the HTTP API's JSON body."""
    body: dict[str, Any] = _sampling(request)
    body["messages"] = message_dicts(request.messages)
    body["stream"] = stream
    if request.model:
        body["model"] = request.model
    for name in ("max_completion_tokens", "top_logprobs", "parallel_tool_calls", "separate_reasoning", "stream_reasoning"):
        if request.HasField(name):
            body[name] = getattr(request, name)
    if request.logprobs:
        body["logprobs"] = True
    if request.user:
        body["user"] = request.user
    if request.tools:
        body["tools"] = _tools(request)
    if request.HasField("tool_choice"):
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.HasField("response_format"):
        body["response_format"] = _response_format(request.response_format)
    if request.HasField("chat_template_kwargs"):
        body["chat_template_kwargs"] = struct_dict(request.chat_template_kwargs)
    if stream and request.HasField("stream_options"):
        body["stream_options"] = _dict(request.stream_options)
    return body


def _prompt(request: Message, field: str) -> Any:
    kind = request.WhichOneof(field)
    if kind is None:
        return None
    value = getattr(request, kind)
    if kind == "text":
        return value
    if kind == "token_ids":
        return list(value.ids)
    if kind == "texts":
        return list(value.texts)
    return [list(p.ids) for p in value.prompts]


def token_prompt_lengths(request: Message, field: str = "prompt") -> list[int]:
    """The lengths of a request's token-id prompts (none for text), read from the message
    without turning its ids into Python objects."""
    kind = request.WhichOneof(field)
    if kind == "token_ids":
        return [len(getattr(request, kind).ids)]
    if kind == "token_id_batch":
        return [len(p.ids) for p in getattr(request, kind).prompts]
    return []


def completion_request(request: gpb.CompletionRequest, *, stream: bool) -> dict[str, Any]:
    """A ``CompletionRequest`` message as the HTTP API's JSON body."""
    body: dict[str, Any] = _sampling(request)
    body["prompt"] = _prompt(request, "prompt")
    body["stream"] = stream
    if request.model:
        body["model"] = request.model
    if request.echo:
        body["echo"] = True
    if request.HasField("logprobs"):
        body["logprobs"] = request.logprobs
    if request.HasField("json_schema"):
        body["json_schema"] = request.json_schema
    if request.user:
        body["user"] = request.user
    if stream and request.HasField("stream_options"):
        body["stream_options"] = _dict(request.stream_options)
    return body


def generate_request(request: gpb.GenerateRequest) -> dict[str, Any]:
    """A ``GenerateRequest`` message as SGLang's /generate JSON body (token ids only)."""
    body: dict[str, Any] = {
        "input_ids": list(request.input_ids),
        "sampling_params": _sampling(request, "sampling_params"),
        "stream": request.stream,
        "return_logprob": request.return_logprob,
        "top_logprobs_num": request.top_logprobs_num,
    }
    if request.rid:
        body["rid"] = request.rid
    if request.model:
        body["model"] = request.model
    return body


def tokenize_request(request: gpb.TokenizeRequest) -> dict[str, Any]:
    body = _dict(request)
    body.pop("messages", None)
    if request.messages:
        body["messages"] = message_dicts(request.messages)
    if request.HasField("chat_template_kwargs"):
        body["chat_template_kwargs"] = struct_dict(request.chat_template_kwargs)
    return body


def detokenize_request(request: gpb.DetokenizeRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"tokens": list(request.tokens)}
    if request.model:
        body["model"] = request.model
    return body


def embed_request(request: gpb.EmbedRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"input": _prompt(request, "input")}
    if request.model:
        body["model"] = request.model
    if request.HasField("dimensions"):
        body["dimensions"] = request.dimensions
    return body


# --------------------------------------------------------------------- responses


def matched_stop(target: gpb.MatchedStop, value: Any) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        target.token_id = value
    else:
        target.text = str(value)


def usage(target: gpb.Usage, u: dict[str, Any]) -> None:
    target.prompt_tokens = u.get("prompt_tokens", 0)
    target.completion_tokens = u.get("completion_tokens", 0)
    target.total_tokens = u.get("total_tokens", 0)
    details = u.get("prompt_tokens_details") or {}
    target.cached_tokens = details.get("cached_tokens", 0) or 0
    reasoning = u.get("completion_tokens_details")
    if reasoning is not None:
        target.reasoning_tokens = reasoning.get("reasoning_tokens", 0) or 0


def _tool_calls(target: Any, calls: list[dict[str, Any]] | None) -> None:
    for i, call in enumerate(calls or []):
        out = target.add()
        out.index = call.get("index", i)
        if call.get("id"):
            out.id = call["id"]
        if call.get("type"):
            out.type = call["type"]
        fn = call.get("function") or {}
        if fn.get("name"):
            out.function.name = fn["name"]
        out.function.arguments = fn.get("arguments") or ""


def _byte_string(values: list[int] | None) -> bytes:
    return bytes(values) if values else b""


def chat_logprobs(target: gpb.ChatLogprobs, lp: dict[str, Any]) -> None:
    for item in lp.get("content") or []:
        out = target.content.add(token=item["token"], logprob=item["logprob"], bytes=_byte_string(item.get("bytes")))
        for top in item.get("top_logprobs") or []:
            out.top_logprobs.add(token=top["token"], logprob=top["logprob"], bytes=_byte_string(top.get("bytes")))


def completion_logprobs(target: gpb.CompletionLogprobs, lp: dict[str, Any]) -> None:
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    offsets = lp.get("text_offset") or []
    for i, token in enumerate(tokens):
        out = target.tokens.add(token=token)
        if i < len(values) and values[i] is not None:
            out.logprob = values[i]
        if i < len(tops) and tops[i]:
            out.top_logprobs.update(tops[i])
        if i < len(offsets):
            out.text_offset = offsets[i]


def chat_response(d: dict[str, Any], worker_ids: list[str]) -> gpb.ChatCompletionResponse:
    out = gpb.ChatCompletionResponse(id=d["id"], created=d["created"], model=d["model"], worker_ids=worker_ids)
    for c in d["choices"]:
        choice = out.choices.add(index=c["index"], finish_reason=c.get("finish_reason") or "")
        message = c["message"]
        choice.message.role = message.get("role") or "assistant"
        if message.get("content") is not None:
            choice.message.content = message["content"]
        if message.get("reasoning_content") is not None:
            choice.message.reasoning_content = message["reasoning_content"]
        _tool_calls(choice.message.tool_calls, message.get("tool_calls"))
        if c.get("logprobs"):
            chat_logprobs(choice.logprobs, c["logprobs"])
        if c.get("matched_stop") is not None:
            matched_stop(choice.matched_stop, c["matched_stop"])
    if d.get("usage"):
        usage(out.usage, d["usage"])
    return out


def stream_usage(target: gpb.Usage, u: StreamUsage) -> None:
    target.prompt_tokens = u.prompt_tokens
    target.completion_tokens = u.completion_tokens
    target.total_tokens = u.prompt_tokens + u.completion_tokens
    target.cached_tokens = u.cached_tokens
    if u.reasoning_tokens is not None:
        target.reasoning_tokens = u.reasoning_tokens


def _fragments(target: Any, calls: list[ToolCallFragment]) -> None:
    for call in calls:
        out = target.add(index=call.index)
        if call.id is not None:
            out.id = call.id
            out.type = "function"
        if call.name:
            out.function.name = call.name
        out.function.arguments = call.arguments


def _chat_logprobs_model(target: gpb.ChatLogprobs, lp: ChoiceLogprobs) -> None:
    for item in lp.content or []:
        out = target.content.add(token=item.token, logprob=item.logprob, bytes=_byte_string(item.bytes))
        for top in item.top_logprobs:
            out.top_logprobs.add(token=top.token, logprob=top.logprob, bytes=_byte_string(top.bytes))


def chat_chunk(event: StreamChunk) -> gpb.ChatCompletionChunk:
    """A typed chat stream event as its proto message, field by field."""
    head = event.head
    out = gpb.ChatCompletionChunk(id=head.id, created=head.created, model=head.model)
    for c in event.choices:
        assert isinstance(c, ChatDelta)
        choice = out.choices.add(index=c.index)
        delta = choice.delta
        if c.role is not None:
            delta.role = c.role
        if c.content is not None:
            delta.content = c.content
        if c.reasoning_content is not None:
            delta.reasoning_content = c.reasoning_content
        if c.tool_calls:
            _fragments(delta.tool_calls, c.tool_calls)
        if c.logprobs is not None:
            _chat_logprobs_model(choice.logprobs, c.logprobs)
        if c.finish_reason:
            choice.finish_reason = c.finish_reason
        if c.final:
            matched_stop(choice.matched_stop, c.matched_stop)
    if event.usage is not None:
        stream_usage(out.usage, event.usage)
    return out


def _completion_logprobs_model(target: gpb.CompletionLogprobs, lp: CompletionLogprobs) -> None:
    tops = lp.top_logprobs or []
    for i, token in enumerate(lp.tokens):
        out = target.tokens.add(token=token)
        if i < len(lp.token_logprobs) and lp.token_logprobs[i] is not None:
            out.logprob = lp.token_logprobs[i]  # type: ignore[assignment]
        if i < len(tops) and tops[i]:
            out.top_logprobs.update(tops[i])
        if i < len(lp.text_offset):
            out.text_offset = lp.text_offset[i]


def _completion_choice(target: gpb.CompletionChoice, c: dict[str, Any]) -> None:
    target.index = c["index"]
    target.text = c.get("text") or ""
    if c.get("logprobs"):
        completion_logprobs(target.logprobs, c["logprobs"])
    if c.get("finish_reason"):
        target.finish_reason = c["finish_reason"]
    if c.get("matched_stop") is not None:
        matched_stop(target.matched_stop, c["matched_stop"])


def completion_response(d: dict[str, Any], worker_ids: list[str]) -> gpb.CompletionResponse:
    out = gpb.CompletionResponse(id=d["id"], created=d["created"], model=d["model"], worker_ids=worker_ids)
    for c in d["choices"]:
        _completion_choice(out.choices.add(), c)
    if d.get("usage"):
        usage(out.usage, d["usage"])
    return out


def completion_chunk(event: StreamChunk) -> gpb.CompletionChunk:
    """A typed completion stream event as its proto message, field by field."""
    head = event.head
    out = gpb.CompletionChunk(id=head.id, created=head.created, model=head.model)
    for c in event.choices:
        assert isinstance(c, CompletionDelta)
        choice = out.choices.add(index=c.index, text=c.text)
        if c.logprobs is not None:
            _completion_logprobs_model(choice.logprobs, c.logprobs)
        if c.finish_reason:
            choice.finish_reason = c.finish_reason
        if c.finish_reason is not None:
            matched_stop(choice.matched_stop, c.matched_stop)
    if event.usage is not None:
        stream_usage(out.usage, event.usage)
    return out


def tokenize_response(d: dict[str, Any]) -> gpb.TokenizeResponse:
    return gpb.TokenizeResponse(tokens=d["tokens"], count=d["count"], max_model_len=d.get("max_model_len") or 0)


def embed_response(d: dict[str, Any], worker_ids: list[str]) -> gpb.EmbedResponse:
    out = gpb.EmbedResponse(model=d["model"], prompt_tokens=d["usage"]["prompt_tokens"], worker_ids=worker_ids)
    for item in d["data"]:
        out.data.add(index=item["index"], values=item["embedding"])
    return out


def worker_status(d: dict[str, Any]) -> gpb.WorkerStatus:
    out = gpb.WorkerStatus()
    for key, value in d.items():
        if value is None or not hasattr(out, key):
            continue
        setattr(out, key, value)
    return out
