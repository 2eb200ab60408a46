"""Request-body schemas in the OpenAPI document for routes that read raw JSON.

Every route parses its body itself (orjson, size limit, OpenAI-shaped errors), and
the inference routes do not run on FastAPI at all (``server.http.inference``), so
FastAPI cannot see what they accept. This adds each inference route's operation and
each route's pydantic model as its ``requestBody`` without changing how it is
handled, so clients, docs and schema-driven fuzzers (schemathesis) know the real shapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from gateway.protocol.parse import ParseReasoningRequest, ParseToolCallsRequest
from gateway.protocol.responses_api import ConversationCreate, ConversationUpdate, ItemsCreate
from gateway.server.http.inference import InferenceRoute

# The FastAPI routes with a JSON body (the inference routes bring their own models).
REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/parse/tool_calls": ParseToolCallsRequest,
    "/parse/reasoning": ParseReasoningRequest,
    "/v1/conversations": ConversationCreate,
    "/v1/conversations/{conversation_id}": ConversationUpdate,
    "/v1/conversations/{conversation_id}/items": ItemsCreate,
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


def _operation(route: InferenceRoute) -> dict[str, Any]:
    """An inference route's POST operation, as FastAPI would describe a handler of its path."""
    return {
        "summary": route.summary,
        "operationId": re.sub(r"\W", "_", route.path.strip("/")) + "_post",
        "responses": {"200": {"description": "Successful Response", "content": {"application/json": {"schema": {}}}}},
    }


def describe_request_bodies(app: FastAPI, inference: Iterable[InferenceRoute] = ()) -> None:
    """Wrap ``app.openapi`` so the ``inference`` routes are in it and every POST route
    with a JSON body (those and ``REQUEST_BODIES``) documents it."""
    inference = list(inference)
    bodies = {**REQUEST_BODIES, **{r.path: r.model for r in inference if r.model is not None}}
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        paths = schema.setdefault("paths", {})
        for route in inference:
            paths.setdefault(route.path, {})["post"] = _operation(route)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["ErrorResponse"] = ERROR_SCHEMA
        for path, model in bodies.items():
            operation = paths.get(path, {}).get("post")
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
