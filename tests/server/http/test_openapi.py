"""The OpenAPI document describes the JSON bodies the raw-JSON routes accept."""

from __future__ import annotations

from gateway.server.config import GatewayConfig
from gateway.server.http.app import create_app
from gateway.server.http.openapi import REQUEST_BODIES
from gateway.server.state import GatewayState


def test_every_body_route_documents_its_model() -> None:
    state = GatewayState(GatewayConfig())
    try:
        schema = create_app(state, manage_lifecycle=False).openapi()
    finally:
        state.engine.close()
    components = schema["components"]["schemas"]
    assert "/metrics" not in schema["paths"]
    for path, model in REQUEST_BODIES.items():
        op = schema["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model.__name__}"
        body = components[model.__name__]
        assert set(body["properties"]) == {f.alias or name for name, f in model.model_fields.items()}
        assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    # every $ref resolves inside the document
    text = str(schema)
    refs = {part.split("'")[0] for part in text.split("#/components/schemas/")[1:]}
    assert refs <= set(components), refs - set(components)
