"""gRPC fuzzing of every method of both services: hypothesis builds random messages (every
field of the request type, NaN and infinities included) and random bytes. No call may end
UNKNOWN or INTERNAL (a gateway bug), the gateway keeps serving a normal call, and its
admission and load counters return to zero.

The gateway runs in a background thread with its own loop (as tests/server/test_fuzz.py
does) so hypothesis can drive a synchronous gRPC channel.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pd
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.proto import gateway_pb2, sglang_scheduler_pb2
from gateway.server.grpc.server import GrpcServer, start_grpc_server
from gateway_lab.bench.soak_targets import rss_mb
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

KEY = "sk-grpc-fuzz"
MD = (("authorization", f"Bearer {KEY}"),)
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}
EXAMPLES = 15  # per method and kind: ~600 calls in all


def _methods() -> list[tuple[str, pd.MethodDescriptor]]:
    out = []
    for module, name in ((gateway_pb2, "TokenGateway"), (sglang_scheduler_pb2, "SglangScheduler")):
        service = module.DESCRIPTOR.services_by_name[name]
        out += [(service.full_name, m) for m in service.methods]
    return out


METHODS = _methods()


def _scalar(field: pd.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (pd.FieldDescriptor.TYPE_DOUBLE, pd.FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, 1.0, -1.0]))
    if t in (pd.FieldDescriptor.TYPE_INT32, pd.FieldDescriptor.TYPE_SINT32, pd.FieldDescriptor.TYPE_SFIXED32, pd.FieldDescriptor.TYPE_ENUM):
        return st.integers(-(2**31), 2**31 - 1)
    if t in (pd.FieldDescriptor.TYPE_UINT32, pd.FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 300))
    if t in (pd.FieldDescriptor.TYPE_INT64, pd.FieldDescriptor.TYPE_SINT64, pd.FieldDescriptor.TYPE_SFIXED64):
        return st.integers(-(2**63), 2**63 - 1)
    if t in (pd.FieldDescriptor.TYPE_UINT64, pd.FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == pd.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == pd.FieldDescriptor.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.sampled_from(["", "x" * 300, "{\"type\": \"object\"}", "(a|b"]))
    return st.binary(max_size=40)


@st.composite
def message(draw: st.DrawFn, desc: pd.Descriptor, depth: int = 0) -> Any:
    cls = message_factory.GetMessageClass(desc)
    msg = cls()
    if desc.full_name.startswith("google.protobuf.") or depth > 3:
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            if value_f.message_type is not None:
                continue
            entries = draw(st.dictionaries(_scalar(key_f), _scalar(value_f), max_size=3))
            getattr(msg, field.name).update(entries)
        elif field.is_repeated:
            if field.message_type is not None:
                for item in draw(st.lists(message(field.message_type, depth + 1), max_size=3)):
                    getattr(msg, field.name).add().CopyFrom(item)
            else:
                getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=6)))
        elif field.message_type is not None:
            getattr(msg, field.name).CopyFrom(draw(message(field.message_type, depth + 1)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


class LiveGrpcGateway:
    """A stack plus its gRPC port, served from its own thread and loop."""

    def __init__(self, tmp: Any) -> None:
        self._tmp = tmp
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.stack: Stack | None = None
        self.grpc: GrpcServer | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="grpc-fuzz-gateway", daemon=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        opts = StackOptions(workers=2, sim={"context_length": 2048}, server={"api_keys": [KEY], "max_body_bytes": 1 << 20},
                            sections={"limits": {"max_tokens_cap": 8}})
        async with start_stack(opts, self._tmp) as stack:
            self.stack = stack
            self.grpc = await start_grpc_server(stack.state, "127.0.0.1", 0)
            self._ready.set()
            await self._stop.wait()
            await self.grpc.stop(0)

    def start(self) -> LiveGrpcGateway:
        self._thread.start()
        self._ready.wait(60)
        if self.error is not None or self.grpc is None:
            raise RuntimeError(f"gateway did not start: {self.error!r}")
        return self

    def call(self, fn: Any) -> Any:
        async def wrap() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(10)

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveGrpcGateway, grpc.Channel]]:
    gateway = LiveGrpcGateway(tmp_path_factory.mktemp("grpc-fuzz")).start()
    assert gateway.grpc is not None
    channel = grpc.insecure_channel(gateway.grpc.target)
    try:
        yield gateway, channel
    finally:
        channel.close()
        gateway.stop()


def _invoke(channel: grpc.Channel, service: str, method: pd.MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    path = f"/{service}/{method.name}"
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path)(payload, metadata=MD, timeout=15):
                pass
        else:
            channel.unary_unary(path)(payload, metadata=MD, timeout=15)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[f"{s.rsplit('.', 1)[-1]}.{m.name}" for s, m in METHODS])
@FUZZ
@given(data=st.data())
def test_random_messages_get_a_clean_status(live: tuple[LiveGrpcGateway, grpc.Channel], service: str, method: pd.MethodDescriptor, data: st.DataObject) -> None:
    _, channel = live
    request = data.draw(message(method.input_type))
    code = _invoke(channel, service, method, request.SerializeToString())
    assert code not in FORBIDDEN, f"{method.name}({request}) -> {code}"


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[f"{s.rsplit('.', 1)[-1]}.{m.name}" for s, m in METHODS])
@FUZZ
@given(payload=st.binary(max_size=200))
def test_random_bytes_get_a_clean_status(live: tuple[LiveGrpcGateway, grpc.Channel], service: str, method: pd.MethodDescriptor, payload: bytes) -> None:
    _, channel = live
    code = _invoke(channel, service, method, payload)
    assert code not in FORBIDDEN, f"{method.name}({payload!r}) -> {code}"


def test_gateway_serves_and_is_idle_after_fuzzing(live: tuple[LiveGrpcGateway, grpc.Channel]) -> None:
    gateway, channel = live
    stack = gateway.stack
    assert stack is not None
    before = rss_mb()
    stub_call = channel.unary_unary(f"/{gateway_pb2.DESCRIPTOR.services_by_name['TokenGateway'].full_name}/Completion",
                                    request_serializer=gateway_pb2.CompletionRequest.SerializeToString,
                                    response_deserializer=gateway_pb2.CompletionResponse.FromString)
    reply = stub_call(gateway_pb2.CompletionRequest(text="hello", sampling=gateway_pb2.Sampling(max_tokens=2)), metadata=MD, timeout=30)
    assert reply.choices
    assert gateway.call(lambda: stack.state.admission.in_flight) == 0
    assert gateway.call(lambda: [w.load.in_flight for w in stack.state.registry.all()]) == [0, 0]
    assert rss_mb() - before < 64
