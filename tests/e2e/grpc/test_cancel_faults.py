"""Cancellation, deadlines and worker faults through both gRPC services.

Whatever ends a call (the client cancels, its deadline passes, a worker fails) the
worker must see its request aborted and the gateway must free the load slot.
The workers here are slow on purpose (10 ms per decode step) so a generation is
still running when the client leaves.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from gateway.client import GatewayRpcError, user
from gateway.proto import gateway_pb2 as gpb
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from tests.e2e.grpc.conftest import GrpcStack

SLOW = {"step_base_s": 0.01, "time_scale": 1.0, "eos_probability": 0.0}
PROMPT = list(range(2000, 2040))


async def _settled(gstack: GrpcStack, *, aborted: int, timeout: float = 10.0) -> None:
    """Wait (bounded) until the workers counted ``aborted`` aborts, finished nothing,
    and the gateway holds no load slot."""
    registry = gstack.http.state.registry
    workers = gstack.http.fleet.workers
    async with asyncio.timeout(timeout):
        while True:
            seen = sum(w.counters.aborted for w in workers)
            if seen >= aborted and all(w.load.in_flight == 0 for w in registry.all()):
                break
            await asyncio.sleep(0.02)
    assert sum(w.counters.finished for w in workers) == 0


def _scheduler(gstack: GrpcStack) -> tuple[aio.Channel, pb_grpc.SglangSchedulerStub]:
    channel = aio.insecure_channel(gstack.target)
    return channel, pb_grpc.SglangSchedulerStub(channel)


def _generate(rid: str, max_new: int = 400, **kw: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=PROMPT), stream=True,
        sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=max_new, ignore_eos=True, stream_interval=1),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_cancelled_chat_stream_aborts_worker_request(gstack: GrpcStack) -> None:
    request = gstack.client.chat_request([user("go on")], max_tokens=400, ignore_eos=True)
    call = gstack.client.stub.StreamChatCompletion(request)
    got = 0
    async for _ in call:
        got += 1
        if got == 3:
            break
    assert gstack.http.state.registry.all()[0].load.in_flight == 1
    call.cancel()
    await _settled(gstack, aborted=1)
    again = await gstack.client.chat([user("short")], max_tokens=2)
    assert again.usage.completion_tokens == 2


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_client_deadline_aborts_worker_request(gstack: GrpcStack) -> None:
    with pytest.raises(GatewayRpcError) as err:
        await gstack.client.complete("tell a long story", max_tokens=400, ignore_eos=True, timeout=1.0)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    await _settled(gstack, aborted=1)
    with pytest.raises(GatewayRpcError) as err:
        async for _ in gstack.client.generate(PROMPT, stream=True, max_new_tokens=400, ignore_eos=True, timeout=1.0):
            pass
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    await _settled(gstack, aborted=2)


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_passthrough_cancel_and_deadline_abort_worker_request(gstack: GrpcStack) -> None:
    channel, stub = _scheduler(gstack)
    async with channel:
        call = stub.Generate(_generate("pt-cancel"))
        first = await call.read()
        assert first.request_id == "pt-cancel" and first.WhichOneof("response") == "chunk"
        metadata = dict(await call.initial_metadata())
        assert metadata["x-worker-id"] == gstack.http.state.registry.all()[0].id
        call.cancel()
        await _settled(gstack, aborted=1)
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stub.Generate(_generate("pt-deadline"), timeout=1.0):
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await _settled(gstack, aborted=2)


@pytest.mark.stack(workers=2, sim=SLOW)
async def test_passthrough_abort_by_request_id_reaches_the_serving_worker(gstack: GrpcStack) -> None:
    channel, stub = _scheduler(gstack)
    async with channel:
        call = stub.Generate(_generate("pt-abort"))
        await call.read()
        reply = await stub.Abort(pb.AbortRequest(request_id="pt-abort", reason="test"))
        assert reply.success
        # SGLang leaves an aborted stream open; the gateway ends the client's, CANCELLED
        with pytest.raises(aio.AioRpcError) as err:
            while (message := await call.read()) is not aio.EOF:
                assert message.WhichOneof("response") == "chunk"
        assert err.value.code() == grpc.StatusCode.CANCELLED
        await _settled(gstack, aborted=1)
        unknown = await stub.Abort(pb.AbortRequest(request_id="never-seen"))
        assert not unknown.success  # ids are scoped to keys: nothing of this caller's has that id


@pytest.mark.stack(workers=1, retry={"max_attempts": 1}, sections={"resume": {"resume": False}})
async def test_worker_failing_mid_stream_ends_call_with_status(gstack: GrpcStack) -> None:
    gstack.http.fleet.workers[0].faults.fail_after_tokens = 3
    with pytest.raises(GatewayRpcError) as err:
        async for _ in gstack.client.stream_complete("hello", max_tokens=50, ignore_eos=True):
            pass
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.type
    channel, stub = _scheduler(gstack)
    async with channel:
        with pytest.raises(aio.AioRpcError) as raw:
            async for _ in stub.Generate(_generate("pt-fail", max_new=50)):
                pass
        assert raw.value.code() == grpc.StatusCode.UNAVAILABLE
    assert gstack.http.state.registry.all()[0].load.in_flight == 0
    gstack.http.fleet.workers[0].faults.fail_after_tokens = -1
    assert (await gstack.client.complete("hello", max_tokens=3)).usage.completion_tokens == 3


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_stream_broken_mid_way_resumes_on_the_gateway_grpc_api(gstack: GrpcStack) -> None:
    gstack.http.fleet.workers[0].faults.fail_after_tokens = 3
    for _ in range(2):  # round robin: one of them starts on the failing worker
        chunks = [c async for c in gstack.client.stream_complete(
            "hello", max_tokens=20, ignore_eos=True, stream_options=gpb.StreamOptions(include_usage=True),
        )]
        assert "".join(ch.text for c in chunks for ch in c.choices)
        assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens > 0
    reply = await gstack.client.complete("hello", max_tokens=20, n=2, ignore_eos=True)
    assert reply.usage.completion_tokens == 40 and len(reply.choices) == 2
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_rejecting_worker_is_retried_elsewhere_on_both_services(gstack: GrpcStack) -> None:
    bad = gstack.http.fleet.workers[0]
    bad.faults.reject_status = "UNAVAILABLE"
    good_id = gstack.http.fleet.workers[1].url.removeprefix("grpc://")
    for _ in range(3):
        reply = await gstack.client.complete("hello", max_tokens=3)
        assert list(reply.worker_ids) == [good_id]
    channel, stub = _scheduler(gstack)
    async with channel:
        for i in range(3):
            call = stub.Generate(_generate(f"pt-retry-{i}", max_new=3))
            replies = [m async for m in call]
            assert replies[-1].complete.finish_reason == "length"
            assert dict(await call.initial_metadata())["x-worker-id"] == good_id
        gstack.http.fleet.workers[1].faults.reject_status = "UNAVAILABLE"
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stub.Generate(_generate("pt-none", max_new=3)):
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())
