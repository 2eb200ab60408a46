"""One rule set on every door, and tenancy, through the gateway's gRPC port (issue 16):
the SGLang pass-through obeys the operator limits and refuses fields a client must not
set, admin-only calls need the admin key, request ids are scoped to the key that made
them, and a body that is not protobuf is INVALID_ARGUMENT on both services."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
import pytest
from grpc import aio

from gateway.proto import common_pb2
from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.server.grpc.server import GATEWAY_SERVICE, SCHEDULER_SERVICE
from tests.e2e.grpc.conftest import GrpcStack

A, B, ADMIN = "tenant-a", "tenant-b", "the-admin"
KEYS = {"server": {"api_keys": [A, B]}, "sections": {
    "security": {"admin_api_key": ADMIN},
    "limits": {"max_n": 2, "max_tokens_cap": 16, "max_prompt_tokens": 500},
}}
SLOW = {"step_base_s": 0.01, "time_scale": 1.0, "eos_probability": 0.0}
PROMPT = list(range(1000, 1040))


def _md(key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),) if key else ()


def _request(rid: str = "", max_new: int | None = 8, **kw: Any) -> pb.GenerateRequest:
    params = pb.SamplingParams(temperature=1.0, n=1, ignore_eos=True)
    if max_new is not None:
        params.max_new_tokens = max_new
    return pb.GenerateRequest(request_id=rid, tokenized=pb.TokenizedInput(input_ids=PROMPT), stream=True,
                              sampling_params=params, **kw)


async def _generate(stub: pb_grpc.SglangSchedulerStub, request: pb.GenerateRequest, key: str) -> list[pb.GenerateResponse]:
    return [m async for m in stub.Generate(request, metadata=_md(key), timeout=30)]


async def _code(coro: Any) -> grpc.StatusCode:
    try:
        result = await coro
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _stream_code(call: Any) -> grpc.StatusCode:
    try:
        async for _ in call:
            pass
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _stubs(gstack: GrpcStack) -> tuple[aio.Channel, pb_grpc.SglangSchedulerStub, gpb_grpc.TokenGatewayStub]:
    channel = aio.insecure_channel(gstack.target)
    return channel, pb_grpc.SglangSchedulerStub(channel), gpb_grpc.TokenGatewayStub(channel)


@pytest.mark.stack(workers=2, policy="cache_aware", **KEYS)
async def test_pass_through_obeys_the_limits_and_refuses_client_only_fields(gstack: GrpcStack) -> None:
    channel, stub, front = _stubs(gstack)
    vocab = gstack.http.state.catalog.get(None).tokenizer.vocab_size
    bad: dict[str, pb.GenerateRequest] = {
        "custom_logit_processor": _request(custom_logit_processor="gASV..."),
        "disaggregated_params": _request(disaggregated_params=pb.DisaggregatedParams(bootstrap_host="10.0.0.1", bootstrap_port=1)),
        "input_embeds": _request(input_embeds=[0.5] * 8),
        "mm_inputs": _request(mm_inputs=pb.MultimodalInputs(image_urls=["http://169.254.169.254/"])),
        "long request id": _request("r" * 10_000),
        "n over --max-n": _request(),
        "max_new_tokens over the cap": _request(max_new=17),
        "prompt over --max-prompt-tokens": pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[5] * 501)),
        "prompt past the vocabulary": pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[vocab + 5])),
    }
    bad["n over --max-n"].sampling_params.n = 3
    for name, value in {"nan temperature": math.nan, "inf top_p": math.inf}.items():
        req = _request()
        setattr(req.sampling_params, "temperature" if "temperature" in name else "top_p", value)
        bad[name] = req
    req = _request()
    req.sampling_params.logit_bias[str(vocab + 1)] = 1.0
    bad["logit_bias key past the vocabulary"] = req
    req = _request()
    req.sampling_params.regex = "([a-"
    bad["regex that does not compile"] = req
    req = _request()
    req.sampling_params.custom_params.update({"processor_arg": 1})
    bad["custom_params beyond seed"] = req
    async with channel:
        for name, request in bad.items():
            code = await _stream_code(stub.Generate(request, metadata=_md(A), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        # unset max_new_tokens runs to the operator's cap, not the worker default
        out = await _generate(stub, _request(max_new=None), A)
        assert out[-1].complete.completion_tokens == 16
        # stripped fields do not stop a request
        ok = _request(return_hidden_states=True, data_parallel_rank=3)
        assert (await _generate(stub, ok, A))[-1].WhichOneof("response") == "complete"
        # embeddings: the vocabulary is checked on both services
        code = await _code(stub.Embed(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[vocab + 1])), metadata=_md(A)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        code = await _code(front.Embed(gpb.EmbedRequest(token_ids=gpb.TokenIds(ids=[vocab + 1])), metadata=_md(A)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert gstack.http.state.admission.in_flight == 0
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


@pytest.mark.stack(workers=2, policy="cache_aware", **KEYS)
async def test_admin_calls_need_the_admin_key_and_info_is_trimmed(gstack: GrpcStack) -> None:
    state = gstack.http.state
    resets: list[int] = []
    real_reset = state.router.reset_policies
    state.router.reset_policies = lambda: (resets.append(1), real_reset())[1]  # type: ignore[method-assign]
    channel, stub, front = _stubs(gstack)
    async with channel:
        code = await _code(stub.FlushCache(common_pb2.FlushCacheRequest(), metadata=_md(A)))
        assert code == grpc.StatusCode.PERMISSION_DENIED and not resets
        reply = await stub.FlushCache(common_pb2.FlushCacheRequest(), metadata=_md(ADMIN))
        assert reply.success and resets == [1]  # the policies' trees forget, as with POST /flush_cache
        info = await stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=_md(A))
        args = dict(info.server_args)
        assert "host" not in args and "model_path" not in args and "tokenizer_path" not in args
        assert args.get("page_size")
        full = await stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=_md(ADMIN))
        assert "host" in dict(full.server_args)
        code = await _code(front.InspectPrefix(gpb.InspectPrefixRequest(text="secret prefix"), metadata=_md(A)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert (await front.InspectPrefix(gpb.InspectPrefixRequest(text="secret prefix"), metadata=_md(ADMIN))).token_count
        # unauthenticated KV-event subscription: a clean status, no traceback
        code = await _stream_code(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code = await _stream_code(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), metadata=_md(A), timeout=10))
        assert code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.stack(workers=1, sim=SLOW, **KEYS)
async def test_request_ids_are_scoped_to_the_key_that_made_them(gstack: GrpcStack) -> None:
    channel, stub, _ = _stubs(gstack)
    async with channel:
        call_a = stub.Generate(_request("same", max_new=16), metadata=_md(A), timeout=30)
        first = await call_a.read()
        assert first.request_id == "same"  # the client sees its own id, not the worker-side one
        # another key's Abort with that id finds nothing and touches nothing
        reply = await stub.Abort(pb.AbortRequest(request_id="same"), metadata=_md(B))
        assert not reply.success
        # and the same id from another key runs beside it without colliding on the worker
        mine = await _generate(stub, _request("same", max_new=4), B)
        assert mine[-1].complete.finish_reason != "abort" and all(m.request_id == "same" for m in mine)
        rest = []
        while (message := await call_a.read()) is not aio.EOF:
            rest.append(message)
        assert rest[-1].complete.finish_reason != "abort"
        # its own key can abort it
        call = stub.Generate(_request("again", max_new=16), metadata=_md(A), timeout=30)
        await call.read()
        assert (await stub.Abort(pb.AbortRequest(request_id="again"), metadata=_md(A))).success
        # SGLang never ends a stream it aborted; the gateway ends it, CANCELLED
        with pytest.raises(aio.AioRpcError) as err:
            while (message := await call.read()) is not aio.EOF:
                assert message.WhichOneof("response") == "chunk"
        assert err.value.code() == grpc.StatusCode.CANCELLED and "aborted" in (err.value.details() or "")
    for _ in range(200):
        if gstack.http.state.registry.all()[0].load.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert gstack.http.state.registry.all()[0].load.in_flight == 0


@pytest.mark.stack(workers=1, **KEYS)
async def test_unparseable_protobuf_is_invalid_argument_on_both_services(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        for service, method in ((SCHEDULER_SERVICE, "Generate"), (SCHEDULER_SERVICE, "Abort"),
                                (GATEWAY_SERVICE, "Completion"), (GATEWAY_SERVICE, "StreamCompletion")):
            path = f"/{service}/{method}"
            streaming = method in ("Generate", "StreamCompletion")
            call = (channel.unary_stream if streaming else channel.unary_unary)(path)
            garbage = b"\xff\xff\xff\xff\x0f\x0a\x99"  # a truncated varint: not a message
            try:
                result = call(garbage, metadata=_md(A), timeout=10)
                if streaming:
                    async for _ in result:
                        pass
                else:
                    await result
                code = grpc.StatusCode.OK
            except aio.AioRpcError as exc:
                code = exc.code()
            assert code == grpc.StatusCode.INVALID_ARGUMENT, path
        # a normal call still works
        reply = await gpb_grpc.TokenGatewayStub(channel).ListModels(gpb.ListModelsRequest(), metadata=_md(A))
        assert reply.models
