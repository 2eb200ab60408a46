"""Request-body schemas in the OpenAPI document for routes that read raw JSON.

The handlers parse bodies themselves (orjson, size limit, OpenAI-shaped
errors), so FastAPI cannot see what they accept. This adds each route's
pydantic model as its ``requestBody`` without changing how it is handled, so
clients, docs and schema-driven fuzzers (schemathesis) know the real shapes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.embeddings import EmbeddingRequest
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.inspect import InspectRequest
from gateway.protocol.parse import ParseReasoningRequest, ParseToolCallsRequest
from gateway.protocol.responses_api import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    ResponsesRequest,
)
from gateway.protocol.tokens import DetokenizeRequest, TokenizeRequest

REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/generate": GenerateRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/tokenize": TokenizeRequest,
    "/v1/detokenize": DetokenizeRequest,
    "/admin/inspect": InspectRequest,
    "/parse/tool_calls": ParseToolCallsRequest,
    "/parse/reasoning": ParseReasoningRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/conversations": ConversationCreate,
    "/v1/conversations/{conversation_id}": ConversationUpdate,
    "/v1/conversations/{conversation_id}/items": ItemsCreate,
    # /v1/messages is left out: its errors have Anthropic's shape, not the ErrorResponse below.
    # POST /workers is left out on purpose: a fuzzer must not make the gateway dial made-up addresses.
}

_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}


def _error_responses() -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    content = {"application/json": {"schema": ref}}
    return {
        code: {"description": text, "content": content}
        for code, text in (
            ("400", "invalid request"), ("401", "missing or wrong API key"), ("404", "unknown model"),
            ("413", "body too large"), ("503", "no worker available"),
        )
    }


def describe_request_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]] | None = None) -> None:
    """Wrap ``app.openapi`` so the POST routes in ``bodies`` document their JSON body."""
    bodies = REQUEST_BODIES if bodies is None else bodies
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["ErrorResponse"] = ERROR_SCHEMA
        for path, model in bodies.items():
            operation = schema.get("paths", {}).get(path, {}).get("post")
            if operation is None:
                continue
            body = model.model_json_schema(ref_template=_REF, mode="validation")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
            }
            operation.setdefault("responses", {}).update(_error_responses())
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
