"""The SGLang HTTP client against a real HTTP server on loopback that answers the way
SGLang's own server does (Starlette on uvicorn, scripted per test): the seam's
messages, its errors, cancel, abort and the self-description calls."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.reply_bound import CONTROL_REPLY_BYTES, ReplyTooLarge, json_reply_bytes
from gateway.workers.sglang_http import SglangHttpClient, SseLines
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError

Handler = Callable[[Request], Any]


class Peer:
    """A loopback HTTP server whose routes each test sets; it records what it got."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []  # every request's path, in order
        self.disconnected = asyncio.Event()
        self.server: uvicorn.Server | None = None

        async def dispatch(request: Request) -> Response:
            if request.method == "POST":
                raw = await request.body()
                self.bodies.append(orjson.loads(raw) if raw else {})
            self.headers.append(dict(request.headers))
            self.paths.append(request.url.path)
            handler = self.routes.get(request.url.path)
            if handler is None:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return await handler(request)

        self.app = Starlette(routes=[Route("/{path:path}", dispatch, methods=["GET", "POST"])])

    def sse(self, events: list[Any], *, done: bool = True, hang: bool = False) -> Handler:
        async def handler(request: Request) -> Response:
            async def body() -> AsyncIterator[bytes]:
                try:
                    for event in events:
                        yield b"data: " + orjson.dumps(event) + b"\n\n"
                    for _ in range(600 if hang else 0):
                        await asyncio.sleep(0.05)
                        if await request.is_disconnected():
                            return
                    if done:
                        yield b"data: [DONE]\n\n"
                finally:
                    self.disconnected.set()
            return StreamingResponse(body(), media_type="text/event-stream")
        return handler


def reply(body: Any, status: int = 200) -> Handler:
    async def handler(request: Request) -> Response:
        return JSONResponse(body, status_code=status)
    return handler


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Peer, str]]:
    """A :class:`Peer` listening on loopback, and its URL."""
    p = Peer()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = p.server = uvicorn.Server(uvicorn.Config(p.app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield p, f"http://localhost:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        server.force_exit = True
        await task


@pytest.fixture
async def peer() -> AsyncIterator[tuple[Peer, SglangHttpClient]]:
    async with serving() as (p, url):
        client = SglangHttpClient(url, api_key="k")
        try:
            yield p, client
        finally:
            await client.close()


def ans(ids: list[int], done: Any = None, **meta: Any) -> dict[str, Any]:
    info = {"id": "r", "finish_reason": done, "prompt_tokens": 3, "completion_tokens": len(ids), "cached_tokens": 0}
    info.update(meta)
    return {"text": "", "output_ids": ids, "meta_info": info}


def request(stream: bool = True, **kw: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="req-1", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(temperature=0.0, n=1, max_new_tokens=4), stream=stream, **kw,
    )


async def drain(call: Any) -> list[pb.GenerateResponse]:
    out = []
    while (item := await call.read()) is not END_OF_STREAM:
        out.append(item)
    return out


async def test_a_streamed_generate_reads_as_chunks_then_a_complete(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    assert client.url.startswith("http://127.0.0.1:") and client.kind == "sglang/http"
    p.routes["/generate"] = p.sse([ans([7]), ans([7, 8], {"type": "stop", "matched": 8})])
    got = await drain(client.generate(request()))
    assert [m.WhichOneof("response") for m in got] == ["chunk", "chunk", "complete"]
    assert list(got[1].chunk.token_ids) == [8] and got[2].complete.matched_token_id == 8
    body = p.bodies[-1]
    assert body["input_ids"] == [1, 2, 3] and body["rid"] == "req-1" and body["stream"] is True
    assert p.headers[-1]["authorization"] == "Bearer k" and p.headers[-1]["x-request-id"] == "req-1"


async def test_ready_says_whether_a_read_would_wait(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    # The last token and its finish come in one event: one read of the answer, two messages.
    p.routes["/generate"] = p.sse([ans([7, 8], {"type": "length"})], hang=True)
    call = client.generate(request())
    assert not call.ready()  # nothing has arrived yet
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and first.HasField("chunk")
    assert call.ready()  # the complete came with it: the pipeline takes both as one batch
    last = await call.read()
    assert isinstance(last, pb.GenerateResponse) and last.HasField("complete")
    call.cancel()
    assert call.ready()  # a cancelled call's read raises at once


async def test_take_all_returns_what_has_arrived_and_leaves_the_end_to_read(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([7, 8], {"type": "length"})], hang=True)
    call = client.generate(request())
    assert call.take_all() == []  # nothing has arrived yet
    first = await call.read()
    assert first.HasField("chunk")  # type: ignore[union-attr]
    rest = call.take_all()  # the complete came with it: taken without a wait
    assert [m.WhichOneof("response") for m in rest] == ["complete"]
    call.cancel()
    assert call.take_all() == [] and call.ready()  # a cancelled call's read raises
    p.routes["/generate"] = p.sse([ans([1])], done=False)
    unfinished = client.generate(request())
    assert (await unfinished.read()).HasField("chunk")  # type: ignore[union-attr]
    for _ in range(500):  # its failure arrives with the body's end
        if unfinished.ready():
            break
        await asyncio.sleep(0.01)
    assert unfinished.take_all() == []  # the stream's failure is read()'s to raise
    with pytest.raises(WorkerCallError):
        await unfinished.read()
    p.routes["/generate"] = p.sse([ans([7]), ans([7, 8], {"type": "length"})])
    ended = client.generate(request())
    assert (await ended.read()).HasField("chunk")  # type: ignore[union-attr]
    for _ in range(500):  # the rest and the answer's end arrive
        if ended._items and type(ended._items[-1]) is not pb.GenerateResponse:
            break
        await asyncio.sleep(0.01)
    rest = ended.take_all()  # the messages before the end, not the end
    assert [m.WhichOneof("response") for m in rest] == ["chunk", "complete"]
    assert await ended.read() is END_OF_STREAM


async def test_a_whole_generate_is_one_complete(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = reply(ans([4, 5, 6], {"type": "length", "length": 3}))
    (only,) = await drain(client.generate(request(stream=False)))
    assert list(only.complete.output_ids) == [4, 5, 6] and only.complete.finish_reason == "length"


@pytest.mark.parametrize(("status", "code"), [(400, CallCode.INVALID_ARGUMENT), (503, CallCode.UNAVAILABLE)])
async def test_error_statuses_are_call_errors(peer: tuple[Peer, SglangHttpClient], status: int, code: CallCode) -> None:
    p, client = peer
    p.routes["/generate"] = reply({"error": {"message": "nope"}}, status)
    with pytest.raises(WorkerCallError) as err:
        await drain(client.generate(request()))
    assert err.value.code is code and err.value.message == "nope"


async def test_an_error_event_is_a_refusal_before_output_and_an_abort_after(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([{"error": {"message": "too long"}}])
    with pytest.raises(WorkerCallError) as err:
        await drain(client.generate(request()))
    assert err.value.code is CallCode.INVALID_ARGUMENT and err.value.message == "too long"
    p.routes["/generate"] = p.sse([ans([1]), {"error": {"message": "scheduler gone"}}])
    call = client.generate(request())
    assert (await call.read()).HasField("chunk")
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert err.value.code is CallCode.ABORTED and err.value.retryable


async def test_a_stream_that_ends_unfinished_is_unavailable(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([1])], done=False)
    call = client.generate(request())
    assert (await call.read()).HasField("chunk")
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert err.value.code is CallCode.UNAVAILABLE


async def test_a_malformed_answer_is_internal(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([{"output_ids": "x", "meta_info": {}}])
    with pytest.raises(WorkerCallError) as err:
        await drain(client.generate(request()))
    assert err.value.code is CallCode.INTERNAL and "malformed" in err.value.message


async def test_cancel_ends_a_pending_read_and_the_http_request(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([1])], hang=True)
    call = client.generate(request())
    assert (await call.read()).HasField("chunk")
    pending = asyncio.ensure_future(call.read())
    await asyncio.sleep(0.05)
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await asyncio.wait_for(p.disconnected.wait(), 5)  # the worker saw the request go


async def test_a_deadline_ends_the_call(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([1])], hang=True)
    call = client.generate(request(), timeout=0.2)
    assert (await call.read()).HasField("chunk")
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert err.value.code is CallCode.DEADLINE_EXCEEDED


async def test_abort_names_the_request(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/abort_request"] = reply({})
    assert await client.abort("req-9")
    assert p.bodies[-1] == {"rid": "req-9"}


async def test_health_model_and_server_info(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/health"] = reply({}, 503)
    assert not (await client.health_check()).healthy
    p.routes["/health"] = reply({})
    assert (await client.health_check()).healthy
    p.routes["/get_model_info"] = reply({
        "model_path": "Qwen/Qwen3-0.6B", "tokenizer_path": "/models/qwen", "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default",
    })
    info = await client.model_info()
    assert info.model_path == "Qwen/Qwen3-0.6B" and info.tokenizer_path == "/models/qwen" and info.is_generation
    p.routes["/get_server_info"] = reply({
        "served_model_name": "qwen", "page_size": 16, "dp_size": 1, "context_length": None,
        "max_total_num_tokens": 5000, "internal_states": [{"load": 2}], "version": "0.5.0",
    })
    server = await client.server_info()
    assert server.max_total_num_tokens == 5000 and server.sglang_version == "0.5.0"
    assert server.server_args["served_model_name"] == "qwen" and "context_length" not in server.server_args
    assert server.scheduler_info["load"] == 2


async def test_a_server_that_is_not_sglang_says_so(peer: tuple[Peer, SglangHttpClient]) -> None:
    _, client = peer
    with pytest.raises(WorkerCallError) as err:
        await client.model_info()
    assert err.value.code is CallCode.UNIMPLEMENTED and "not an SGLang HTTP server" in err.value.message


@pytest.mark.parametrize(
    ("body", "total", "waiting"),
    [
        ([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 100}], 5, 2),
        ({"load": 4}, 4, 0),
    ],
)
async def test_loads_of_both_shapes(peer: tuple[Peer, SglangHttpClient], body: Any, total: int, waiting: int) -> None:
    p, client = peer
    p.routes["/get_load"] = reply(body)
    loads = await client.loads()
    assert loads.dp_rank_count == 1
    assert (loads.loads[0].num_total_reqs, loads.loads[0].num_waiting_reqs) == (total, waiting)
    assert loads.loads[0].num_running_reqs == total - waiting


async def test_loads_from_v1_loads_as_sglang_0_5_23_serves_them_else_get_load(peer: tuple[Peer, SglangHttpClient]) -> None:
    """SGLang 0.5.23 has no ``/get_load``: its loads are ``/v1/loads`` (per rank, a field at 0
    left out). An older server answers 404 there once and is asked ``/get_load`` from then on."""
    p, client = peer
    p.routes["/v1/loads"] = reply({"timestamp": "t", "version": "0.5.23", "accelerator": None, "num_accelerators": 1,
                                   "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 2,
                                              "num_used_tokens": 640, "max_total_num_tokens": 4096},
                                             {"dp_rank": 1}]})
    loads = await client.loads()
    assert [(x.dp_rank, x.num_running_reqs, x.num_waiting_reqs, x.num_total_reqs, x.num_used_tokens) for x in loads.loads] == [
        (0, 3, 2, 5, 640), (1, 0, 0, 0, 0),
    ]
    assert loads.dp_rank_count == 2 and loads.aggregate.total_reqs == 5
    p.routes["/v1/loads"] = reply({"loads": 3})
    with pytest.raises(WorkerCallError) as err:
        await client.loads()
    assert err.value.code is CallCode.INTERNAL and "unknown shape" in err.value.message
    del p.routes["/v1/loads"]
    p.routes["/get_load"] = reply([{"dp_rank": 0, "num_reqs": 4, "num_waiting_reqs": 1, "num_tokens": 10}])
    p.paths.clear()
    for _ in range(2):
        assert (await client.loads()).loads[0].num_running_reqs == 3
    assert p.paths == ["/v1/loads", "/get_load", "/get_load"]
    p.routes["/get_load"] = reply({"loads": "?"}, status=500)
    with pytest.raises(WorkerCallError):
        await client.loads()


async def test_what_the_http_server_lacks_is_unimplemented(peer: tuple[Peer, SglangHttpClient]) -> None:
    _, client = peer
    for attempt in (client.tokenizer_zip(), client.embed(pb.EmbedRequest())):
        with pytest.raises(WorkerCallError) as err:
            await attempt
        assert err.value.code is CallCode.UNIMPLEMENTED
    with pytest.raises(WorkerCallError):
        async for _ in client.subscribe_kv_events():
            pass
    with pytest.raises(WorkerCallError):
        async for _ in client.tokenizer_chunks():
            pass


async def test_an_unreachable_worker_is_unavailable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    client = SglangHttpClient(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(WorkerCallError) as err:
            await client.health_check(timeout=2)
        assert err.value.code is CallCode.UNAVAILABLE
        with pytest.raises(WorkerCallError) as err:
            await drain(client.generate(request()))
        assert err.value.code is CallCode.UNAVAILABLE
    finally:
        await client.close()


async def test_cancel_after_the_last_complete_keeps_the_connection(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([7]), ans([7, 8], {"type": "length"})])
    for _ in range(3):  # the pipeline stops at the complete and cancels the call
        call = client.generate(request())
        while not (await call.read()).HasField("complete"):
            pass
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call.read()
    await asyncio.sleep(0.1)
    assert p.server is not None
    assert len(p.server.server_state.connections) == 1  # drained to its end, reused, never dropped


async def test_a_long_cumulative_answer_is_one_line_however_long(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    ids = list(range(100_000, 120_000))  # ~140 KB on one SSE line
    p.routes["/generate"] = p.sse([ans(ids[:-1]), ans(ids, {"type": "length"})])
    asked = request()
    asked.sampling_params.max_new_tokens = len(ids)
    got = await drain(client.generate(asked))
    assert [t for m in got if m.HasField("chunk") for t in m.chunk.token_ids] == ids


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_past_what_the_request_allows_is_reply_too_large(
    peer: tuple[Peer, SglangHttpClient], stream: bool
) -> None:
    p, client = peer
    flood = list(range(100_000, 140_000))  # ~280 KB where 4 tokens allow ~140 KB
    if stream:
        p.routes["/generate"] = p.sse([ans(flood, {"type": "length"})])
    else:
        p.routes["/generate"] = reply(ans(flood, {"type": "length"}))
    with pytest.raises(ReplyTooLarge) as err:
        await drain(client.generate(request(stream=stream)))
    assert err.value.bound == json_reply_bytes(request())
    p.routes["/generate"] = p.sse([ans([5, 6], {"type": "length"})])  # the client goes on
    assert len(await drain(client.generate(request()))) == 2


async def test_small_calls_and_refusals_read_a_bounded_body(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/get_model_info"] = reply({"pad": "x" * (CONTROL_REPLY_BYTES + 10)})
    with pytest.raises(ReplyTooLarge):
        await client.model_info()
    p.routes["/generate"] = reply({"error": {"message": "no " + "x" * 200_000}}, status=400)
    with pytest.raises(WorkerCallError) as err:
        await drain(client.generate(request()))
    assert err.value.code is CallCode.INVALID_ARGUMENT and len(err.value.message) < 70_000


def test_sse_lines_are_split_across_reads_and_only_data_lines_kept() -> None:
    lines = SseLines(64)
    assert lines.feed(b'data: {"a"') == []
    assert lines.feed(b': 1}\n\nevent: x\nid: 3\ndata: [DO') == [b'data: {"a": 1}']
    assert lines.feed(b"NE]\n\n") == [b"data: [DONE]"]
    assert lines.feed(b"data: 2") == [] and lines.close() == [b"data: 2"] and lines.close() == []
    assert lines.feed(b"retry: 5") == [] and lines.close() == []  # a trailing field that is not data


def test_sse_lines_refuse_a_line_past_the_bound_before_holding_more() -> None:
    with pytest.raises(ReplyTooLarge):
        SseLines(8).feed(b"data: 123456\n")  # a whole line
    lines = SseLines(8)
    with pytest.raises(ReplyTooLarge):
        lines.feed(b"data: 1234")  # a partial one, already longer
    assert SseLines(8).feed(b"data: 12\n") == [b"data: 12"]


class _Pusher:
    """A ``pusher`` that takes every chunk, as the relay's listener takes ordinary tokens."""

    def __init__(self) -> None:
        self.taken: list[list[int]] = []

    def __call__(self, inbox: deque[pb.GenerateResponse]) -> None:
        while inbox and inbox[0].HasField("chunk"):
            self.taken.append(list(inbox.popleft().chunk.token_ids))


async def test_a_pusher_takes_the_chunks_as_they_arrive_and_the_reader_wakes_for_the_rest(
    peer: tuple[Peer, SglangHttpClient],
) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([7]), ans([7, 8]), ans([7, 8, 9], {"type": "length"})])
    call = client.generate(request())
    pusher = call.pusher = _Pusher()
    last = await call.read()  # the first message the pusher left: the complete
    assert isinstance(last, pb.GenerateResponse) and list(last.complete.output_ids) == [9]
    assert pusher.taken == [[7], [8], [9]]
    assert await call.read() is END_OF_STREAM and call.pusher is None  # the end is the reader's


async def test_a_failure_after_pushed_chunks_still_reaches_the_reader(peer: tuple[Peer, SglangHttpClient]) -> None:
    p, client = peer
    p.routes["/generate"] = p.sse([ans([7]), {"error": {"message": "engine died"}}], done=False)
    call = client.generate(request())
    pusher = call.pusher = _Pusher()
    with pytest.raises(WorkerCallError, match="engine died") as err:
        await call.read()
    assert err.value.code is CallCode.ABORTED and pusher.taken == [[7]] and call.pusher is None
