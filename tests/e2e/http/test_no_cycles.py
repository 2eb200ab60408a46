"""Finished requests leave no reference cycle that holds the gateway's objects.

The serving process collects cycles rarely (``gateway.server.gc_policy``): a request
path that makes one keeps the whole request (its messages, prompt ids, route, ticket)
alive until a full collection, and under a failing worker or a hostile client that is
memory growing with every request. Each case runs a few requests of one kind with the
collector off and ``DEBUG_SAVEALL`` on, then collects: nothing in the garbage may be
the gateway's own (an instance of a ``gateway.`` class, a frame of its code, its
exception). The simulated workers and the test's clients share the process; what they
leave is not counted. The probe is ``tests/e2e/cycles.py``.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.client import GatewayRpcError
from tests.e2e.cycles import CHAT, assert_leaves_no_cycle, cycle_through, owned, thaw
from tests.e2e.grpc.conftest import GrpcStack, start_grpc_stack
from tests.e2e.http.conftest import Stack, StackOptions, start_stack


@pytest.fixture(autouse=True)
def _thawed_after() -> Iterator[None]:
    yield
    thaw()


async def _tolerate(call: Awaitable[Any]) -> None:
    """Run a request whose failure is the point of the case."""
    try:
        await call
    except (openai.APIError, GatewayRpcError):
        pass


def _http_kinds(s: Stack) -> dict[str, Callable[[], Awaitable[Any]]]:
    m = s.model

    async def chat() -> None:
        await s.client.chat.completions.create(model=m, messages=CHAT, max_tokens=8)  # type: ignore[arg-type]

    async def stream() -> None:
        chunks = await s.client.chat.completions.create(model=m, messages=CHAT, max_tokens=8, stream=True)  # type: ignore[arg-type]
        async for _ in chunks:
            pass

    async def completion() -> None:
        await s.client.completions.create(model=m, prompt="one two three", max_tokens=8)

    async def refused(body: dict[str, Any] | None, status: int, content: bytes | None = None) -> None:
        if content is not None:
            r = await s.http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
        else:
            r = await s.http.post("/v1/chat/completions" if "messages" in (body or {}) else "/v1/completions", json=body)
        assert r.status_code == status, r.text

    async def messages() -> None:
        r = await s.http.post("/v1/messages", json={"model": m, "max_tokens": 8, "messages": CHAT})
        assert r.status_code == 200, r.text

    async def messages_any() -> None:  # a faulty fleet's answer: resumed, refused or failed
        r = await s.http.post("/v1/messages", json={"model": m, "max_tokens": 8, "messages": CHAT})
        assert r.status_code in (200, 400, 500, 502, 503), r.text

    async def responses() -> None:
        r = await s.http.post("/v1/responses", json={"model": m, "input": "name a river", "max_output_tokens": 8, "store": False})
        assert r.status_code == 200, r.text

    async def left_mid_stream() -> None:
        body = {"model": m, "messages": CHAT, "max_tokens": 2000, "stream": True}
        async with s.http.stream("POST", "/v1/chat/completions", json=body) as r:
            async for _ in r.aiter_bytes():
                break

    return {
        "chat": chat,
        "stream": stream,
        "completion": completion,
        "invalid": lambda: refused({"model": m, "messages": "not a list"}, 400),
        "unknown model": lambda: refused({"model": "no-such-model", "messages": CHAT}, 404),
        "bad json": lambda: refused(None, 400, b"{not json"),
        "too long": lambda: refused({"model": m, "prompt": "x " * 50_000, "max_tokens": 4}, 400),
        "messages": messages,
        "messages, any answer": messages_any,
        "responses": responses,
        "left mid-stream": left_mid_stream,
    }


HEALTHY = {
    # the door's own paths once, on gRPC workers; the worker-facing ones on each transport
    "sglang": ["chat", "stream", "completion", "invalid", "unknown model", "bad json", "too long", "messages", "responses", "left mid-stream"],
    "sglang-http": ["chat", "stream", "too long", "left mid-stream"],
    "vllm-http": ["chat", "stream", "too long", "left mid-stream"],
}


@pytest.mark.parametrize("engine", sorted(HEALTHY))
async def test_healthy_fleet_requests_leave_no_cycle(engine: str, tmp_path: Path) -> None:
    async with start_stack(StackOptions(engine=engine), tmp_path) as s:
        kinds = _http_kinds(s)
        for name in HEALTHY[engine]:
            try:
                await assert_leaves_no_cycle(kinds[name])
            except AssertionError as exc:
                raise AssertionError(f"{engine}, {name}: {exc}") from None


FAULTS = {
    "rejected": {"fault_reject_status": "UNAVAILABLE"},
    "failed mid-answer": {"fault_fail_after_tokens": 2},
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("engine", ["sglang", "sglang-http"])
async def test_failing_workers_leave_no_cycle(engine: str, fault: str, tmp_path: Path) -> None:
    async with start_stack(StackOptions(engine=engine, sim=FAULTS[fault]), tmp_path) as s:
        kinds = _http_kinds(s)
        for name in ("chat", "stream", "messages, any answer"):
            try:
                await assert_leaves_no_cycle(lambda k=kinds[name]: _tolerate(k()))
            except AssertionError as exc:
                raise AssertionError(f"{engine}, {fault}, {name}: {exc}") from None


def _grpc_kinds(g: GrpcStack) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def stream() -> None:
        async for _ in g.client.stream_chat(CHAT, max_tokens=8):
            pass

    return {
        "chat": lambda: g.client.chat(CHAT, max_tokens=8),
        "stream": stream,
        "too long": lambda: _tolerate(g.client.complete([7] * 50_000, max_tokens=4)),
        "unknown model": lambda: _tolerate(g.client.chat(CHAT, model="no-such-model", max_tokens=4)),
    }


@pytest.mark.parametrize("sim", [{}, FAULTS["rejected"]], ids=["healthy", "rejected"])
async def test_grpc_door_requests_leave_no_cycle(sim: dict[str, Any], tmp_path: Path) -> None:
    async with start_grpc_stack(StackOptions(sim=sim), tmp_path) as g:
        kinds = _grpc_kinds(g)
        for name, run in kinds.items():
            if sim and name in ("too long", "unknown model"):
                continue
            call = run if not sim else (lambda r=run: _tolerate(r()))
            try:
                await assert_leaves_no_cycle(call)
            except AssertionError as exc:
                raise AssertionError(f"gRPC door, {name}: {exc}") from None


def test_the_probe_sees_a_cycle() -> None:
    """The check itself: a gateway object caught in a frame-exception cycle is found and named."""
    from gateway.pipeline.request_context import RequestContext

    def fail() -> None:
        ctx = RequestContext.__new__(RequestContext)  # noqa: F841 - held by the frame the traceback keeps
        try:
            raise ValueError("kept")
        except ValueError as exc:
            kept = exc  # noqa: F841 - the frame holds its own exception: a cycle

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fail()
        gc.collect()
        found = [o for o in gc.garbage if owned(o) is not None]
        assert [owned(o) for o in found] == ["RequestContext"]
        assert "cycle:" in cycle_through(found[0], gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("sim", [{}, FAULTS["rejected"], FAULTS["failed mid-answer"]], ids=["healthy", "rejected", "failed mid-answer"])
async def test_pd_pairs_and_several_samples_leave_no_cycle(sim: dict[str, Any], tmp_path: Path) -> None:
    opts = StackOptions(workers=4, roles=["prefill", "prefill", "decode", "decode"], sim=sim)
    async with start_stack(opts, tmp_path) as s:
        async def several() -> None:
            await s.client.chat.completions.create(model=s.model, messages=CHAT, max_tokens=8, n=3)  # type: ignore[arg-type]

        kinds = _http_kinds(s)
        for name, run in {"chat": kinds["chat"], "stream": kinds["stream"], "n=3": several}.items():
            try:
                await assert_leaves_no_cycle(lambda r=run: _tolerate(r()) if sim else r())
            except AssertionError as exc:
                raise AssertionError(f"PD, {sim or 'healthy'}, {name}: {exc}") from None


async def test_timeouts_stalls_and_refused_admissions_leave_no_cycle(tmp_path: Path) -> None:
    # Every answer stalls 0.6 s after its first token: past the stream's stall limit
    # and the first-token limit of a request that waits its turn for the one slot.
    opts = StackOptions(
        sim={"fault_stall_s": 0.6, "fault_stall_after_tokens": 1},
        dispatch={"stall_timeout_s": 0.2, "first_token_timeout_s": 0.3},
        sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0}},
    )
    async with start_stack(opts, tmp_path) as s:
        kinds = _http_kinds(s)

        async def crowd() -> None:  # one admitted (and stalled), two refused with 429
            await asyncio.gather(*(_tolerate(kinds["stream"]()) for _ in range(3)))

        for name, run in {"stalled stream": lambda: _tolerate(kinds["stream"]()), "crowd": crowd}.items():
            try:
                await assert_leaves_no_cycle(run)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from None
