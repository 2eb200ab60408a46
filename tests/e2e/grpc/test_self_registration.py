"""A gateway asked to register its own gRPC port as a worker refuses (its pass-through
would route to itself, and its load polls would call themselves for ever)."""

from __future__ import annotations

import pytest

from tests.e2e.grpc.conftest import GrpcStack


@pytest.mark.stack(workers=1)
async def test_the_gateway_refuses_itself_as_a_worker(gstack: GrpcStack) -> None:
    http = gstack.http.http
    before = [w.id for w in gstack.http.state.registry.all()]
    added = await http.post("/workers", json={"url": f"grpc://{gstack.target}"})
    assert added.status_code == 400, added.text
    assert "own gRPC port" in added.json()["error"]["message"]
    assert [w.id for w in gstack.http.state.registry.all()] == before
    ok = await gstack.http.client.completions.create(model=gstack.model, prompt="hi", max_tokens=2)
    assert ok.choices[0].text is not None


@pytest.mark.stack(workers=1)
async def test_another_gateway_may_be_a_worker(gstack: GrpcStack, tmp_path: object) -> None:
    from tests.e2e.live_gateway import gateway

    async with gateway([f"grpc://{gstack.target}"], tmp_path / "front") as front:  # type: ignore[operator]
        assert [w.url for w in front.state.registry.all()] == [f"grpc://{gstack.target}"]
        ok = await front.client.completions.create(model=front.model, prompt="hi", max_tokens=2)
        assert ok.choices[0].text is not None
