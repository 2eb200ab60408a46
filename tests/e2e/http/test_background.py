"""Background responses end to end with the official ``openai`` client: create returns at
once, the events are journaled, and a reader resuming with ``starting_after`` gets every
event exactly once, in this process or in another one sharing the store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

import openai
import pytest

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

SLOW = {"step_base_s": 0.0, "prefill_token_s": 0.0, "decode_seq_s": 0.005, "time_scale": 1.0, "eos_probability": 0.0}  # ~200 tokens/s, to the budget


async def _read(client: openai.AsyncOpenAI, rid: str, *, after: int | None = None, take: int | None = None) -> list[Any]:
    kwargs: dict[str, Any] = {"stream": True}
    if after is not None:
        kwargs["starting_after"] = after
    stream = await client.responses.retrieve(rid, **kwargs)
    events = []
    async for event in stream:
        events.append(event)
        if take is not None and len(events) >= take:
            await stream.close()  # the client goes away mid-stream
            break
    return events


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_background_returns_at_once_and_replays_exactly_once(stack: Stack) -> None:
    c = stack.client
    resp = await c.responses.create(model=stack.model, input="Tell me a long story.", background=True, max_output_tokens=120)
    assert resp.status == "in_progress" and resp.background
    live = await c.responses.retrieve(resp.id)
    assert live.status == "in_progress"
    first = await _read(c, resp.id, take=6)  # part of the stream, then the client leaves
    rest = await _read(c, resp.id, after=first[-1].sequence_number)
    seqs = [e.sequence_number for e in first + rest]
    assert seqs == list(range(len(seqs)))  # every event once, none missing
    assert rest[-1].type == "response.incomplete"  # it ran to max_output_tokens
    text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
    done = await c.responses.retrieve(resp.id)
    assert done.status == "incomplete" and done.output_text == text and done.usage.output_tokens == 120  # type: ignore[union-attr]
    again = await _read(c, resp.id)  # after the end: the whole journal from the store
    assert [e.sequence_number for e in again] == seqs


@pytest.mark.stack(workers=1, sim=SLOW)
async def test_cancel_a_background_run(stack: Stack) -> None:
    c = stack.client
    resp = await c.responses.create(model=stack.model, input="Tell me a long story.", background=True, max_output_tokens=2000)
    await asyncio.sleep(0.2)
    cancelled = await c.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    events = await _read(c, resp.id)
    assert events[-1].response.status == "cancelled"  # type: ignore[union-attr]
    final = await c.responses.retrieve(resp.id)
    assert final.status == "cancelled" and final.usage is not None and final.usage.output_tokens < 2000
    worker = stack.state.registry.all()[0]
    for _ in range(100):  # the worker's slot is freed and its request aborted
        if worker.load.in_flight == 0 and stack.fleet.workers[0].scheduler.num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert worker.load.in_flight == 0 and stack.fleet.workers[0].scheduler.num_running == 0


async def test_a_reader_in_another_process_follows_the_journal(tmp_path: Any) -> None:
    """Two gateways on one store file: the run's events reach the other one's reader
    through the journal (batches in the store), complete and in order."""
    opts = StackOptions(workers=1, sim=SLOW)
    async with start_stack(opts, tmp_path) as a, start_stack(opts, tmp_path) as b:
        resp = await a.client.responses.create(model=a.model, input="Tell me a story.", background=True, max_output_tokens=80)
        events = await _read(b.client, resp.id, after=2)
        assert [e.sequence_number for e in events] == list(range(3, 3 + len(events)))
        assert events[-1].type == "response.incomplete"  # it ran to max_output_tokens
        assert (await b.client.responses.retrieve(resp.id)).status == "incomplete"


async def test_background_errors(stack: Stack) -> None:
    c = stack.client
    with pytest.raises(openai.BadRequestError, match="store"):
        await c.responses.create(model=stack.model, input="x", background=True, store=False)
    plain = await c.responses.create(model=stack.model, input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        await _read(c, plain.id)
    with pytest.raises(openai.NotFoundError):
        await _read(c, "resp_missing")


@pytest.mark.stack(workers=1, sim=SLOW, sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0}})
async def test_a_background_run_holds_its_admission_slot(stack: Stack) -> None:
    c = stack.client
    resp = await c.responses.create(model=stack.model, input="Tell me a story.", background=True, max_output_tokens=60)
    with pytest.raises(openai.RateLimitError):  # the one slot is the run's until it ends
        await c.responses.create(model=stack.model, input="x", max_output_tokens=2)
    events = await _read(c, resp.id)
    assert events[-1].type == "response.incomplete"
    for _ in range(50):
        if stack.state.admission.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    ok = await c.responses.create(model=stack.model, input="x", max_output_tokens=2)
    assert ok.status == "incomplete"


@pytest.mark.slow
async def test_a_run_whose_process_is_killed_is_continued_by_another(tmp_path: Any) -> None:
    """SIGKILL the gateway process running a background response halfway: another gateway
    sharing the store claims the run once its heartbeat is stale and continues it from
    the journaled tokens; a client that resumes with ``starting_after`` gets every event
    exactly once and a response whose text is the whole of its deltas."""
    async with SimFleet.start(1, SimConfig(**{**SLOW, "decode_seq_s": 0.01})) as fleet:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0",
            "--worker-urls", fleet.urls[0], "--tokenizer-cache-dir", str(tmp_path / "tok"),
            "--history-path", str(tmp_path / "history.sqlite3"), "--history-stale-s", "1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                ready = json.loads(await proc.stdout.readline())  # type: ignore[union-attr]
            doomed = openai.AsyncOpenAI(base_url=ready["url"] + "/v1", api_key="none", max_retries=0)
            model = (await doomed.models.list()).data[0].id
            resp = await doomed.responses.create(model=model, input="Tell me a long story.", background=True, max_output_tokens=300)
            seen = await _read(doomed, resp.id, take=40)
            await doomed.close()
        finally:
            proc.kill()
            await proc.wait()
        opts = StackOptions(workers=1, sim={**SLOW, "decode_seq_s": 0.01}, sections={"history": {"history_stale_s": 1.0}})
        async with start_stack(opts, tmp_path) as other:
            rest = await _read(other.client, resp.id, after=seen[-1].sequence_number)
            events = seen + rest
            assert [e.sequence_number for e in events] == list(range(len(events)))  # nothing twice, nothing missing
            assert rest[-1].type == "response.incomplete"  # it ran to max_output_tokens
            done = rest[-1].response  # type: ignore[union-attr]
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert done.output_text == text and done.usage.output_tokens == 300
            assert (await other.client.responses.retrieve(resp.id)).status == "incomplete"
            again = await _read(other.client, resp.id)  # a late reader: the same events from the store
            assert [e.sequence_number for e in again] == [e.sequence_number for e in events]


async def test_a_run_that_cannot_be_continued_ends_failed(tmp_path: Any) -> None:
    """A constrained run (a JSON format) cannot be continued faithfully on another worker
    (the grammar state is the worker's): when its process stops, readers end with
    ``response.failed``."""
    opts = StackOptions(workers=1, sim=SLOW, sections={"history": {"history_stale_s": 0.5}})
    async with start_stack(opts, tmp_path) as a:
        resp = await a.client.responses.create(
            model=a.model, input="Tell me a story.", background=True, max_output_tokens=2000,
            text={"format": {"type": "json_object"}},
        )
        await _read(a.client, resp.id, take=5)
        task = next(iter(a.state.background._tasks))
        task.cancel()  # as if the process stopped: its run is left to others
        with contextlib.suppress(asyncio.CancelledError):
            await task
        events = await _read(a.client, resp.id)
        assert events[-1].type == "response.failed" and "constrained" in (events[-1].response.error.message or "")  # type: ignore[union-attr]
