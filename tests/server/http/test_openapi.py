"""The OpenAPI document describes the JSON bodies the raw-JSON routes accept, the
inference routes (which do not run on FastAPI) included."""

from __future__ import annotations

from gateway.server.config import GatewayConfig
from gateway.server.http.app import GatewayApp, create_app
from gateway.server.http.openapi import REQUEST_BODIES
from gateway.server.state import GatewayState


def test_every_body_route_documents_its_model() -> None:
    state = GatewayState(GatewayConfig())
    try:
        app = create_app(state, manage_lifecycle=False)
        assert isinstance(app, GatewayApp)
        schema = app.openapi()
    finally:
        state.engine.close()
    components = schema["components"]["schemas"]
    assert "/metrics" not in schema["paths"]
    inference = {path: route.model for path, route in app.inference.routes.items()}
    assert {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings"} <= set(inference)
    for path, model in {**REQUEST_BODIES, **inference}.items():
        op = schema["paths"][path]["post"]
        assert op["operationId"] and op["responses"]["200"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model.__name__}"
        body = components[model.__name__]
        assert set(body["properties"]) == {f.alias or name for name, f in model.model_fields.items()}
        assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    # every $ref resolves inside the document
    text = str(schema)
    refs = {part.split("'")[0] for part in text.split("#/components/schemas/")[1:]}
    assert refs <= set(components), refs - set(components)
