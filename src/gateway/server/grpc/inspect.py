"""InspectPrefix: ``endpoints.inspect.Inspector`` (the core behind POST /admin/inspect) over gRPC."""

from __future__ import annotations

import json
from typing import Any

from gateway.endpoints.inspect import Inspector
from gateway.proto import gateway_pb2 as gpb
from gateway.protocol.inspect import InspectRequest
from gateway.server.grpc import convert as convert
from gateway.server.http.util import parse_model


def inspect_request(request: gpb.InspectPrefixRequest) -> dict[str, Any]:
    """The message as the JSON body POST /admin/inspect takes."""
    body: dict[str, Any] = {}
    kind = request.WhichOneof("input")
    if kind == "text":
        body["text"] = request.text
    elif kind == "token_ids":
        body["input_ids"] = list(request.token_ids.ids)
    elif kind == "messages":
        body["messages"] = convert.message_dicts(request.messages.messages)
        if request.messages.HasField("chat_template_kwargs"):
            body["chat_template_kwargs"] = convert.struct_dict(request.messages.chat_template_kwargs)
    if request.model:
        body["model"] = request.model
    if request.pool:
        body["pool"] = request.pool
    for name in ("add_generation_prompt", "add_special_tokens", "block_size", "depth_tokens", "include_tokens"):
        if request.HasField(name):
            body[name] = getattr(request, name)
    return body


def inspect_response(d: dict[str, Any]) -> gpb.InspectPrefixResponse:
    out = gpb.InspectPrefixResponse(
        model=d["model"], pool=d["pool"], token_count=d["token_count"], block_size=d["block_size"],
        tree=d["tree"], tree_match_tokens=d["tree_match_tokens"], policy=d.get("policy") or "",
        notes=d.get("notes") or [],
    )
    for t in d["tokens"]:
        out.tokens.add(index=t["index"], id=t["id"], piece=t.get("piece") or "")
    for b in d["blocks"]:
        out.blocks.add(index=b["index"], hash=b["hash"], start=b["start"], end=b["end"])
    ring = d.get("ring")
    if ring is not None:
        out.ring.CopyFrom(gpb.RingMapping(**{k: v for k, v in ring.items() if k in gpb.RingMapping.DESCRIPTOR.fields_by_name}))
    for w in d["workers"]:
        out.workers.add(**{k: v for k, v in w.items() if k in gpb.WorkerPrediction.DESCRIPTOR.fields_by_name})
    decision = d.get("decision")
    if decision:
        out.chosen_worker = str(decision.get("choice") or "")
        out.reason = str(decision.get("reason") or "")
        # Through JSON text: Struct holds only JSON values (tuples, big ints become text/floats).
        out.decision.update(json.loads(json.dumps(decision, default=str)))
    if d.get("text") is not None:
        out.text = d["text"]
    return out


async def inspect_prefix(inspector: Inspector, request: gpb.InspectPrefixRequest) -> gpb.InspectPrefixResponse:
    req = parse_model(InspectRequest, inspect_request(request))
    result = await inspector.inspect(req)
    return inspect_response(result.to_dict())
