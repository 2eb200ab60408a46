"""OpenAI Responses end to end: the official ``openai`` client's ``responses`` calls
against the gateway over simulated workers, history through the SQLite store."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.http.conftest import Stack, StackOptions, start_stack
from tests.postgres_server import PostgresUnavailable, postgres_server

TOOL = {"type": "function", "name": "get_weather", "description": "weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
PAGE = 16  # the simulated worker's page size


def _scripted(text: str) -> str:
    return f"please answer <<sim-reply>>{text}<</sim-reply>>"


async def test_create_retrieve_delete_and_input_items(stack: Stack) -> None:
    c = stack.client
    resp = await c.responses.create(model=stack.model, input=_scripted("Hello there."), instructions="Be brief.",
                                    max_output_tokens=40, metadata={"k": "v"})
    assert resp.status == "completed" and resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == "Hello there." and resp.metadata == {"k": "v"}
    assert resp.usage is not None and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.input_tokens_details.cached_tokens >= 0
    got = await c.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == "Hello there."
    items = await c.responses.input_items.list(resp.id)
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == _scripted("Hello there.")  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError):
        await c.responses.cancel(resp.id)  # finished: nothing to cancel
    await c.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(resp.id)


async def test_store_false_leaves_nothing(stack: Stack) -> None:
    resp = await stack.client.responses.create(model=stack.model, input=_scripted("Gone."), store=False)
    assert resp.status == "completed"
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(resp.id)


async def test_max_output_tokens_is_incomplete(stack: Stack) -> None:
    resp = await stack.client.responses.create(model=stack.model, input="Tell me a story.", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens" and resp.usage.output_tokens == 3  # type: ignore[union-attr]


async def test_streaming_event_sequence(stack: Stack) -> None:
    stream = await stack.client.responses.create(model=stack.model, input=_scripted("Streamed words here."), stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == "Streamed words here."
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == text and done.usage.output_tokens > 0
    assert (await stack.client.responses.retrieve(done.id)).output_text == text
    # the SDK's own accumulating helper agrees
    async with stack.client.responses.stream(model=stack.model, input=_scripted("Streamed words here.")) as s:
        final = await s.get_final_response()
    assert final.output_text == text


@pytest.mark.parametrize("stream", [False, True])
async def test_function_tools_round_trip(stack: Stack, stream: bool) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    kwargs: dict[str, Any] = {"model": stack.model, "input": _scripted(call), "tools": [TOOL], "max_output_tokens": 80}
    if stream:
        async with stack.client.responses.stream(**kwargs) as s:
            resp = await s.get_final_response()
    else:
        resp = await stack.client.responses.create(**kwargs)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    follow = await stack.client.responses.create(
        model=stack.model, previous_response_id=resp.id, tools=[TOOL],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
               {"role": "user", "content": _scripted("It is sunny.")}],
    )
    assert follow.output_text == "It is sunny." and follow.previous_response_id == resp.id


async def test_reasoning_item(stack: Stack) -> None:
    resp = await stack.client.responses.create(model=stack.model, input=_scripted("<think>\nhmm\n</think>\n\nDone."), reasoning={"effort": "low"})
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text.strip() == "hmm"  # type: ignore[union-attr, index]
    assert resp.output_text.strip() == "Done."


async def _chain_usage(stack: Stack, turns: int) -> list[Any]:
    """Turns through previous_response_id; each turn's usage."""
    usages, prev = [], None
    replies = stack.state.catalog.get(stack.model).reply_cache
    assert replies is not None
    for n in range(turns):
        replies.clear()  # as in another process or after a restart: only the store knows the ids
        resp = await stack.client.responses.create(
            model=stack.model, input=f"Question number {n}?", previous_response_id=prev,
            instructions="You are a helpful assistant. " * 12, max_output_tokens=48,
            extra_body={"seed": n},
        )
        usages.append(resp.usage)
        prev = resp.id
    return usages


@pytest.mark.stack(workers=1)
async def test_previous_response_hits_what_the_worker_cached(stack: Stack) -> None:
    """The next turn's prompt is the previous prompt + the generated ids: the worker's cache
    covers both (the reply's text re-encoded would diverge from the generated ids)."""
    usages = await _chain_usage(stack, 3)
    replies = stack.state.catalog.get(stack.model).reply_cache
    assert replies is not None and replies.stats().spliced_spans >= 2 + 1  # turn 2: one reply, turn 3: two
    for before, after in itertools.pairwise(usages):
        covered = (before.input_tokens + before.output_tokens) // PAGE * PAGE
        assert after.input_tokens_details.cached_tokens >= covered - PAGE


async def test_history_survives_a_restart_with_sqlite(tmp_path: Any) -> None:
    """The default store keeps responses and conversations across a gateway restart."""
    async with start_stack(StackOptions(workers=1), tmp_path) as stack:
        first = await stack.client.responses.create(model=stack.model, input=_scripted("Remember me."))
        conv = await stack.client.conversations.create(metadata={"topic": "restart"})
    async with start_stack(StackOptions(workers=1), tmp_path) as stack:
        again = await stack.client.responses.retrieve(first.id)
        assert again.output_text == "Remember me."
        follow = await stack.client.responses.create(model=stack.model, previous_response_id=first.id, input=_scripted("Yes."))
        assert follow.output_text == "Yes."
        assert (await stack.client.conversations.retrieve(conv.id)).metadata == {"topic": "restart"}


@pytest.mark.stack(server={"api_keys": ["k1", "k2"]})
async def test_stored_objects_are_scoped_to_their_key(stack: Stack) -> None:
    mine = await stack.client.responses.create(model=stack.model, input="hi", max_output_tokens=4)
    conv = await stack.client.conversations.create()
    other = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k2", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.create(model=stack.model, input="x", previous_response_id=mine.id)
        with pytest.raises(openai.NotFoundError):
            await other.conversations.retrieve(conv.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.delete(mine.id)
    finally:
        await other.close()
    assert (await stack.client.responses.retrieve(mine.id)).id == mine.id


async def test_bad_requests_are_clean_errors(stack: Stack) -> None:
    c = stack.client
    with pytest.raises(openai.BadRequestError, match="not supported"):
        await c.responses.create(model=stack.model, input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="not supported"):
        await c.responses.create(model=stack.model, input=[{"type": "computer_call_output", "call_id": "x"}])  # type: ignore[list-item]
    with pytest.raises(openai.NotFoundError):
        await c.responses.create(model=stack.model, input="x", previous_response_id="resp_missing")
    with pytest.raises(openai.NotFoundError):
        await c.responses.create(model=stack.model, input="x", conversation="conv_missing")
    with pytest.raises(openai.BadRequestError):
        await c.responses.create(model=stack.model, input="")
    ok = await c.responses.create(model=stack.model, input="x", max_output_tokens=2)
    assert ok.usage.output_tokens == 2  # type: ignore[union-attr]


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    try:
        with postgres_server() as dsn:
            yield dsn
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")


async def test_two_replicas_share_history_through_postgres(tmp_path: Any, postgres_dsn: str) -> None:
    """A response made through one gateway is read and continued through another: both
    keep their history in one PostgreSQL database."""
    history = {"history": {"history_backend": "postgres", "history_dsn": postgres_dsn}}
    async with start_stack(StackOptions(workers=1, sections=history), tmp_path / "a") as a, \
            start_stack(StackOptions(workers=1, sections=history), tmp_path / "b") as b:
        first = await a.client.responses.create(model=a.model, input=_scripted("From replica A."))
        assert (await b.client.responses.retrieve(first.id)).output_text == "From replica A."
        follow = await b.client.responses.create(model=b.model, previous_response_id=first.id, input=_scripted("From B."))
        conv = await b.client.conversations.create(metadata={"by": "b"})
        assert (await a.client.responses.retrieve(follow.id)).previous_response_id == first.id
        assert (await a.client.conversations.retrieve(conv.id)).metadata == {"by": "b"}


async def _hit_rate(stack: Stack, *, via_responses: bool, conversations: int = 3, turns: int = 4) -> float:
    """cached / prompt tokens over every turn of a few multi-turn conversations."""
    system = "You are a helpful assistant. " * 12
    cached = prompt = 0
    for c in range(conversations):
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        prev: str | None = None
        for t in range(turns):
            question = f"Conversation {c}, question {t}?"
            seed = {"seed": 100 * c + t}
            if via_responses:
                resp = await stack.client.responses.create(
                    model=stack.model, instructions=system, input=question, previous_response_id=prev,
                    max_output_tokens=48, extra_body=seed,
                )
                prev = resp.id
                usage = resp.usage
                assert usage is not None
                cached += usage.input_tokens_details.cached_tokens
                prompt += usage.input_tokens
            else:
                messages.append({"role": "user", "content": question})
                chat = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=48, seed=100 * c + t)  # type: ignore[arg-type]
                messages.append({"role": "assistant", "content": chat.choices[0].message.content or ""})
                assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
                cached += chat.usage.prompt_tokens_details.cached_tokens or 0
                prompt += chat.usage.prompt_tokens
    return cached / prompt


async def test_previous_response_id_hits_as_well_as_chat_with_reply_reuse(tmp_path: Any) -> None:
    """The issue's bar: turns chained by previous_response_id reach the hit rate of the same
    turns sent as chat messages (with reply-token reuse), each on a fresh worker."""
    async with start_stack(StackOptions(workers=1), tmp_path / "chat") as stack:
        chat = await _hit_rate(stack, via_responses=False)
    async with start_stack(StackOptions(workers=1), tmp_path / "responses") as stack:
        responses = await _hit_rate(stack, via_responses=True)
    print(f"hit rate: chat {chat:.3f}, responses {responses:.3f}")
    assert chat > 0.5 and responses >= chat - 0.01


async def test_text_format_is_taken_and_echoed(stack: Stack) -> None:
    """The schema reaches the worker as the chat path's decoding constraint (the unit tests
    check the mapping; the simulated worker does not constrain its random text)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    resp = await stack.client.responses.create(
        model=stack.model, input="Where?", max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
    )
    assert resp.text is not None and resp.text.format.type == "json_schema" and resp.status in ("completed", "incomplete")


SLOW = {"workers": 1, "sim": {"decode_seq_s": 0.002, "time_scale": 1.0, "eos_probability": 0.0}}


async def _settled(stack: Stack, response_id: str) -> str:
    """The stored status once the gateway has unwound the request (bounded wait)."""
    status = "in_progress"
    for _ in range(100):
        status = (await stack.client.responses.retrieve(response_id)).status or ""
        if status != "in_progress" and stack.state.admission.in_flight == 0 \
                and all(w.load.in_flight == 0 for w in stack.state.registry.all()):
            break
        await asyncio.sleep(0.05)
    return status


@pytest.mark.stack(**SLOW)
async def test_a_client_leaving_a_stream_cancels_the_stored_response(stack: Stack) -> None:
    body = {"model": stack.model, "input": "Tell me a long story.", "max_output_tokens": 4000, "stream": True}
    response_id, deltas = "", 0
    async with stack.http.stream("POST", "/v1/responses", json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
            deltas += event["type"] == "response.output_text.delta"
            if deltas == 3:
                break  # leave mid-answer: the connection closes with the block
    assert response_id and await _settled(stack, response_id) == "cancelled"
    stored = await stack.client.responses.retrieve(response_id)
    assert stored.output_text and stored.usage is not None and 3 <= stored.usage.output_tokens < 4000
    assert stack.fleet.workers[0].counters.aborted >= 1  # the worker's request stopped, its slot free


@pytest.mark.stack(**SLOW)
async def test_a_client_leaving_a_whole_response_cancels_it(stack: Stack) -> None:
    task = asyncio.create_task(stack.client.responses.create(model=stack.model, input="Tell me a long story.", max_output_tokens=4000))
    running = stack.state.responses.running
    for _ in range(200):  # the run is started and the worker generates
        if running and stack.fleet.workers[0].counters.requests >= 1:
            break
        await asyncio.sleep(0.025)
    assert len(running) == 1 and not task.done()
    (response_id,) = running
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _settled(stack, response_id) == "cancelled"
    assert stack.fleet.workers[0].counters.aborted >= 1
    ok = await stack.client.responses.create(model=stack.model, input="hi", max_output_tokens=2)
    assert ok.status == "incomplete" and ok.usage is not None and ok.usage.output_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_output_text_logprobs_when_included(stack: Stack, stream: bool) -> None:
    kwargs: dict[str, Any] = {"model": stack.model, "input": _scripted("Some words to score."), "max_output_tokens": 40,
                              "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    if stream:
        events = [e async for e in await stack.client.responses.create(stream=True, **kwargs)]
        streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]  # type: ignore[union-attr]
        resp = events[-1].response  # type: ignore[union-attr]
    else:
        resp = await stack.client.responses.create(**kwargs)
    part = resp.output[0].content[0]  # type: ignore[union-attr]
    assert part.text == "Some words to score." and resp.top_logprobs == 3
    assert part.logprobs and "".join(lp.token for lp in part.logprobs) == part.text
    assert resp.usage is not None and len(part.logprobs) == resp.usage.output_tokens - 1  # the end token has no text
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 3 and bytes(lp.bytes).decode() == lp.token for lp in part.logprobs)
    if stream:
        assert [lp.token for lp in streamed] == [lp.token for lp in part.logprobs]
    plain = await stack.client.responses.create(model=stack.model, input=_scripted("No scores."), max_output_tokens=20)
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]


async def test_unsupported_include_values_are_400s(stack: Stack) -> None:
    for value, says in (("reasoning.encrypted_content", "not supported"), ("message.everything", "unknown include value")):
        resp = await stack.http.post("/v1/responses", json={"model": stack.model, "input": "x", "include": [value]})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert says in error["message"] and error["param"].startswith("include") and error["type"] == "invalid_request_error"
    resp = await stack.http.post("/v1/responses", json={"model": stack.model, "input": "x", "truncation": "middle"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "truncation"
    resp = await stack.http.post("/v1/responses", json={"model": stack.model, "input": "x", "top_logprobs": 21})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "top_logprobs"


@pytest.mark.stack(workers=1, sim={"context_length": 256})
async def test_truncation_auto_drops_the_oldest_turns(stack: Stack) -> None:
    c = stack.client
    prev = None
    for n in range(3):  # a history longer than the context
        resp = await c.responses.create(model=stack.model, instructions="Be brief.", input=f"Turn {n}: " + "tell me more " * 25,
                                        previous_response_id=prev, max_output_tokens=16, truncation="auto")
        prev = resp.id
        assert resp.usage is not None and resp.usage.input_tokens + 16 < 256
    with pytest.raises(openai.BadRequestError) as refused:
        await c.responses.create(model=stack.model, input="And now?", previous_response_id=prev, max_output_tokens=16)
    assert refused.value.code == "context_length_exceeded"
    cut = await c.responses.create(model=stack.model, input="And now?", previous_response_id=prev, max_output_tokens=16,
                                   truncation="auto")
    assert cut.status in ("completed", "incomplete") and cut.truncation == "auto"
    assert cut.usage is not None and cut.usage.input_tokens + 16 < 256
    with pytest.raises(openai.BadRequestError):  # one input that cannot fit is refused, not emptied
        await c.responses.create(model=stack.model, input="word " * 400, max_output_tokens=16, truncation="auto")
