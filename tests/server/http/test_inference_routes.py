"""The table of inference routes: every API on the one path once, with its body model,
its admission and who may call it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.inspect import InspectRequest
from gateway.server.config import GatewayConfig
from gateway.server.http.inference import InferenceRoute
from gateway.server.http.inference_routes import inference_routes
from gateway.server.state import GatewayState


@pytest.fixture
def routes() -> Iterator[dict[str, InferenceRoute]]:
    state = GatewayState(GatewayConfig())
    try:
        yield {route.path: route for route in inference_routes(state)}
    finally:
        state.engine.close()


def test_each_path_is_in_the_table_once(routes: dict[str, InferenceRoute]) -> None:
    state = GatewayState(GatewayConfig())
    try:
        paths = [route.path for route in inference_routes(state)]
    finally:
        state.engine.close()
    assert len(paths) == len(set(paths)) == len(routes)
    assert all(path.startswith("/") for path in paths)


def test_bodies_are_the_apis_own_models(routes: dict[str, InferenceRoute]) -> None:
    assert routes["/v1/chat/completions"].model is ChatCompletionRequest
    assert routes["/v1/completions"].model is CompletionRequest
    assert routes["/generate"].model is GenerateRequest
    assert routes["/admin/inspect"].model is InspectRequest
    for route in routes.values():
        # A GET replays a stored stream: no body.
        assert (route.model is None) if route.method == "GET" else issubclass(route.model, BaseModel)  # type: ignore[arg-type]
        assert route.summary and callable(route.open)


def test_a_stored_stream_is_matched_only_when_asked_for(routes: dict[str, InferenceRoute]) -> None:
    replay = routes["/v1/responses/{response_id}"]
    assert replay.method == "GET" and replay.admit is False and replay.done == b""

    def scope(path: str, query: bytes) -> dict[str, object]:
        return {"type": "http", "method": "GET", "path": path, "query_string": query}

    ref = replay.stored(scope("/v1/responses/resp_1", b"stream=TRUE&starting_after=3"))
    assert ref is not None and ref.id == "resp_1" and ref.query["starting_after"] == "3"
    assert replay.stored(scope("/v1/responses/resp_1", b"")) is None  # a plain read: FastAPI's
    assert replay.stored(scope("/v1/responses/resp_1", b"stream=false")) is None
    assert replay.stored(scope("/v1/responses/resp_1/input_items", b"stream=true")) is None
    assert replay.stored(scope("/v1/responses/", b"stream=true")) is None
    assert replay.stored(scope("/v1/conversations/c_1", b"stream=true")) is None


def test_batches_reserve_per_sample_and_the_rest_take_one_slot(routes: dict[str, InferenceRoute]) -> None:
    # chat: one slot per n; /v1/responses reserves its one slot once the body says whether
    # the run outlives the request
    assert {p for p, r in routes.items() if r.admit == "batch"} == {
        "/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings", "/v1/responses",
    }
    assert {p for p, r in routes.items() if r.admit is True} == {
        "/v1/tokenize", "/v1/detokenize", "/admin/inspect", "/v1/messages", "/v1/messages/count_tokens",
    }


def test_only_inspection_needs_the_inspector_key(routes: dict[str, InferenceRoute]) -> None:
    assert {p for p, r in routes.items() if r.auth == "inspector"} == {"/admin/inspect"}


def test_only_token_prompt_routes_check_their_body_before_validation(routes: dict[str, InferenceRoute]) -> None:
    assert [path for path, route in routes.items() if route.precheck is not None] == ["/v1/completions", "/generate"]


async def test_a_token_prompt_too_long_is_refused_before_its_ids_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal is the one the whole request's checks give (same status, shape, message),
    and no per-id work runs for it: the validators' scans of the ids are never called."""
    from gateway.endpoints import completions as completions_route
    from gateway.protocol import completions as protocol
    from gateway.protocol import generate as generate_protocol
    from tests.server.http.gateway_app import gateway

    scans: list[int] = []
    scan = protocol.are_token_ids

    def counted(values: list[object]) -> bool:
        scans.append(len(values))
        return scan(values)

    def spy() -> None:
        monkeypatch.setattr(protocol, "are_token_ids", counted)
        monkeypatch.setattr(generate_protocol, "are_token_ids", counted)

    async def answers(*calls: tuple[str, dict[str, object]]) -> list[tuple[int, object]]:
        async with gateway() as (state, client):
            await state.add_worker("grpc://w1:1")
            out = []
            for path, body in calls:
                r = await client.post(path, json=body)
                out.append((r.status_code, r.json()))
            return out

    spy()
    limit = 131072  # the bundled Qwen3 files' context length (the fake worker reports none smaller)
    too_long = {"model": "fake-model", "prompt": [7] * limit, "max_tokens": 1}
    batch = {"prompt": [[1, 2], [7] * (limit + 5)], "max_tokens": 1}
    generate = {"input_ids": [7] * (limit + 1), "sampling_params": {"max_new_tokens": 1}}
    calls = [("/v1/completions", too_long), ("/v1/completions", batch), ("/generate", generate)]
    early = await answers(*calls)
    assert scans == []
    error = {"type": "invalid_request_error", "param": "prompt", "code": "context_length_exceeded"}
    assert early == [
        (400, {"error": {"message": f"the prompt has {n} tokens; this model's maximum context length is {limit} tokens", **error}})
        for n in (limit, limit + 5, limit + 1)
    ]
    # Without the check before validation: the same answers, after the scans of every prompt's ids.
    monkeypatch.setattr(completions_route, "refuse_long_body", lambda engine, body, field="prompt": None)
    assert await answers(*calls) == early
    assert scans == [limit, 2, 2, limit + 5, limit + 1]  # the batch: its outer list, then each prompt
    monkeypatch.undo()
    # An unknown model and a bad id go the usual way (the check leaves them to validation).
    scans.clear()
    spy()
    unknown, bad = await answers(("/v1/completions", {**too_long, "model": "nope"}),
                                 ("/v1/completions", {"prompt": [1, True], "max_tokens": 1}))  # fmt: skip
    assert unknown[0] == 404 and unknown[1]["error"]["code"] == "model_not_found"  # type: ignore[index]
    assert bad[0] == 400 and bad[1]["error"]["param"] == "prompt" and scans == [limit, 2]  # type: ignore[index]
