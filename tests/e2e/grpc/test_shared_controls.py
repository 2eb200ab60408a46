"""The gRPC front door shares the HTTP path's controls: admission slots and refusals, API keys, metrics and the access log."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.client import GatewayClient, GatewayRpcError
from tests.e2e.grpc.conftest import GrpcStack

SLOW = {"fault_stall_s": 0.6}  # each request goes silent once for 0.6 s before its first token
ONE_SLOT = {"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0}}


@pytest.mark.stack(workers=1, sim=SLOW, sections=ONE_SLOT)
async def test_grpc_and_http_share_the_slot_and_full_queue_is_resource_exhausted(gstack: GrpcStack) -> None:
    body = {"model": gstack.model, "prompt": "hello", "max_tokens": 2}
    first = asyncio.ensure_future(gstack.http.http.post("/v1/completions", json=body))
    for _ in range(100):  # bounded: until the HTTP request holds the only slot
        if gstack.http.state.admission.in_flight:
            break
        await asyncio.sleep(0.005)
    with pytest.raises(GatewayRpcError) as err:
        await gstack.client.complete("hello", max_tokens=2)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.error_code == "queue_full" and err.value.retry_after is not None
    # metadata calls do not take a slot; tokenizing costs CPU like a prompt and does
    assert await gstack.client.list_models()
    with pytest.raises(GatewayRpcError) as err:
        await gstack.client.tokenize("hello")
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await first).status_code == 200
    reply = await gstack.client.complete("hello", max_tokens=2)
    assert reply.choices[0].text is not None
    assert gstack.http.state.admission.in_flight == 0


@pytest.mark.stack(workers=1, server={"api_keys": ["k1"]}, sections={"security": {"admin_api_key": "adm"}})
async def test_grpc_accepts_the_same_keys_as_http(gstack: GrpcStack) -> None:
    assert (await gstack.client.complete("hi", max_tokens=1)).choices
    for key, ok in (("adm", True), ("wrong", False)):
        client = GatewayClient(gstack.target, api_key=key, timeout=30)
        try:
            if ok:
                assert (await client.complete("hi", max_tokens=1)).choices
            else:
                with pytest.raises(GatewayRpcError) as err:
                    await client.complete("hi", max_tokens=1)
                assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await client.close()


@pytest.mark.stack(workers=1)
async def test_grpc_calls_are_counted_and_logged_like_http_requests(
    gstack: GrpcStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="gateway.access")
    await gstack.client.complete("hello", max_tokens=2)
    chunks = [c async for c in gstack.client.stream_complete("hello", max_tokens=2)]
    assert chunks
    with pytest.raises(GatewayRpcError):
        await gstack.client.complete("hello", max_tokens=2, model="no-such-model")
    text = (await gstack.http.http.get("/metrics")).text
    model = gstack.model
    assert f'token_gateway_requests_total{{endpoint="grpc Completion",model="{model}",status="200"}} 1.0' in text
    assert f'token_gateway_requests_total{{endpoint="grpc StreamCompletion",model="{model}",status="200"}} 1.0' in text
    assert 'endpoint="grpc Completion",model="none",status="404"' in text
    assert 'token_gateway_time_to_first_token_seconds_count{endpoint="grpc StreamCompletion"} 1.0' in text
    lines = [r for r in caplog.records if r.name == "gateway.access"]
    assert any(getattr(r, "access", {}).get("endpoint") == "grpc Completion" for r in lines)


@pytest.mark.stack(workers=1, sim=SLOW, sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 8}})
async def test_grpc_x_priority_metadata_orders_the_shared_queue(gstack: GrpcStack) -> None:
    done: list[str] = []

    async def grpc_call(label: str, priority: str | None) -> None:
        metadata = (("x-priority", priority),) if priority is not None else None
        assert (await gstack.client.complete("hello", max_tokens=2, metadata=metadata)).choices
        done.append(label)

    body = {"model": gstack.model, "prompt": "hello", "max_tokens": 2}
    first = asyncio.ensure_future(gstack.http.http.post("/v1/completions", json=body))
    for _ in range(100):  # bounded: until the HTTP request holds the only slot
        if gstack.http.state.admission.in_flight:
            break
        await asyncio.sleep(0.005)
    low = asyncio.ensure_future(grpc_call("low", "-1"))
    await asyncio.sleep(0.1)
    high = asyncio.ensure_future(grpc_call("high", "4"))
    await asyncio.sleep(0.1)
    assert gstack.http.state.admission.queued == 2
    assert (await first).status_code == 200
    await asyncio.wait_for(asyncio.gather(low, high), 30)
    assert done == ["high", "low"]
    with pytest.raises(GatewayRpcError) as err:
        await gstack.client.complete("hello", max_tokens=1, metadata=(("x-priority", "soon"),))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
