"""token_gateway.v1 over real gRPC: our typed client -> gateway -> simulated workers.

Each call is checked against the HTTP answer to the same request where the two
must agree (same seed: same text, same usage), which is what sharing one
pipeline promises.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from gateway.client import GatewayRpcError, function_tool, gpb, user
from tests.e2e.grpc.conftest import GrpcStack

NO_THINK = Struct()
NO_THINK.update({"enable_thinking": False})


def _reply(text: str) -> list[gpb.ChatMessage]:
    return [user(f"please answer <<sim-reply>>{text}<</sim-reply>>")]


async def test_chat_whole_and_stream_agree_with_http(gstack: GrpcStack) -> None:
    messages = [user("Tell me something.")]
    whole = await gstack.client.chat(messages, max_tokens=30, seed=5, chat_template_kwargs=NO_THINK)
    http = await gstack.http.client.chat.completions.create(
        model=gstack.model, messages=[{"role": "user", "content": "Tell me something."}], max_tokens=30, seed=5,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert whole.choices[0].message.content == http.choices[0].message.content
    assert whole.choices[0].finish_reason == http.choices[0].finish_reason
    assert whole.usage.completion_tokens == http.usage.completion_tokens
    assert whole.usage.prompt_tokens == http.usage.prompt_tokens
    assert whole.worker_ids and whole.model == gstack.model and whole.id.startswith("chatcmpl-")

    chunks = [c async for c in gstack.client.stream_chat(
        messages, max_tokens=30, seed=5, chat_template_kwargs=NO_THINK,
        stream_options=gpb.StreamOptions(include_usage=True),
    )]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].worker_ids
    text = "".join(c.choices[0].delta.content for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].HasField("usage") and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_chat_reasoning_and_cached_tokens(gstack: GrpcStack) -> None:
    messages = _reply("<think>Let me think.</think>The answer is 4.")
    first = await gstack.client.chat(messages, max_tokens=60, metadata=[("x-smg-target-worker", gstack.http.fleet.workers[0].url.removeprefix("grpc://"))])
    again = await gstack.client.chat(messages, max_tokens=60, metadata=[("x-smg-target-worker", gstack.http.fleet.workers[0].url.removeprefix("grpc://"))])
    msg = again.choices[0].message
    assert msg.content == "The answer is 4." and msg.reasoning_content == "Let me think."
    assert again.usage.HasField("reasoning_tokens") and again.usage.reasoning_tokens > 0
    assert first.worker_ids == again.worker_ids
    assert again.usage.cached_tokens > 0  # the same worker holds the prompt now


async def test_chat_tool_calls_whole_and_streamed(gstack: GrpcStack) -> None:
    tools = [function_tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    whole = await gstack.client.chat(_reply(call), tools=tools, max_tokens=80, chat_template_kwargs=NO_THINK)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert not choice.message.HasField("content")

    deltas = [d async for c in gstack.client.stream_chat(_reply(call), tools=tools, max_tokens=80, chat_template_kwargs=NO_THINK)
              for ch in c.choices for d in ch.delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Paris"}

    named = await gstack.client.chat(
        _reply('{"city": "Oslo"}'), tools=tools, max_tokens=40, chat_template_kwargs=NO_THINK,
        tool_choice=gpb.ToolChoice(function_name="get_weather"),
    )
    assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}


async def test_chat_stop_string_and_logprobs(gstack: GrpcStack) -> None:
    reply = await gstack.client.chat(
        _reply("alpha beta gamma delta"), max_tokens=40, stop=[" gamma"], chat_template_kwargs=NO_THINK,
        logprobs=True, top_logprobs=2,
    )
    choice = reply.choices[0]
    assert choice.message.content == "alpha beta"
    assert choice.finish_reason == "stop" and choice.matched_stop.text == " gamma"
    tokens = choice.logprobs.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)
    http = await gstack.http.client.chat.completions.create(
        model=gstack.model, messages=[{"role": "user", "content": _reply("alpha beta gamma delta")[0].content}],
        max_tokens=40, stop=[" gamma"], logprobs=True, top_logprobs=2,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert http.choices[0].message.content == "alpha beta"
    assert [t.token for t in tokens] == [t.token for t in http.choices[0].logprobs.content]
    assert [t.bytes for t in tokens] == [bytes(t.bytes or []) for t in http.choices[0].logprobs.content]


async def test_completion_token_ids_batch_n_echo_logprobs(gstack: GrpcStack) -> None:
    ids = (await gstack.client.tokenize("The quick brown fox")).tokens
    reply = await gstack.client.complete([list(ids), list(ids)[:2]], max_tokens=4, n=2, echo=True, logprobs=1, temperature=0.0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text.startswith("The quick brown fox")
    assert reply.usage.completion_tokens == sum(
        len(c.logprobs.tokens) for c in reply.choices
    ) - len(ids) * 2 - 2 * 2
    assert not reply.choices[0].logprobs.tokens[0].HasField("logprob")  # the first prompt token has none
    http = await gstack.http.client.completions.create(model=gstack.model, prompt=list(ids), max_tokens=4, temperature=0.0)
    grpc_one = await gstack.client.complete(list(ids), max_tokens=4, temperature=0.0)
    assert grpc_one.choices[0].text == http.choices[0].text
    assert grpc_one.choices[0].finish_reason == http.choices[0].finish_reason == "length"

    streamed = [c async for c in gstack.client.stream_complete(list(ids), max_tokens=4, temperature=0.0,
                                                                 stream_options=gpb.StreamOptions(include_usage=True))]
    assert "".join(ch.text for c in streamed for ch in c.choices) == http.choices[0].text
    assert streamed[-1].usage.completion_tokens == 4 and streamed[0].worker_ids


async def test_generate_raw_ids_n2_streamed_and_whole(gstack: GrpcStack) -> None:
    ids = [9707, 11, 1879, 0, 1096, 374, 264, 1273]
    whole = [m async for m in gstack.client.generate(ids, max_new_tokens=6, n=2, ignore_eos=True, return_logprob=True, sampling_seed=1)]
    assert sorted(m.index for m in whole) == [0, 1]
    for m in whole:
        assert len(m.token_ids) == 6 and len(m.logprobs) == 6 and m.finish_reason == "length"
        assert m.completion_tokens == 6 and m.prompt_tokens == len(ids) and m.worker_id
        assert m.text == (await gstack.client.detokenize(list(m.token_ids)))
    deltas = [m async for m in gstack.client.generate(ids, stream=True, max_new_tokens=6, n=2, ignore_eos=True, sampling_seed=1)]
    by_index: dict[int, list[int]] = {0: [], 1: []}
    for m in deltas:
        by_index[m.index].extend(m.token_ids)
    assert {i: list(whole_m.token_ids) for whole_m in whole for i in [whole_m.index]} == by_index
    assert sum(1 for m in deltas if m.finish_reason) == 2


async def test_tokenize_detokenize_embed_models_workers(gstack: GrpcStack) -> None:
    tok = await gstack.client.tokenize("hello world")
    http = (await gstack.http.http.post("/v1/tokenize", json={"prompt": "hello world"})).json()
    assert list(tok.tokens) == http["tokens"] and tok.count == http["count"]
    chat = await gstack.client.tokenize(messages=[user("hi")])
    http_chat = (await gstack.http.http.post("/v1/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})).json()
    assert list(chat.tokens) == http_chat["tokens"]
    assert await gstack.client.detokenize(list(tok.tokens)) == "hello world"

    emb = await gstack.client.embed(["a b", "c d e"])
    assert [e.index for e in emb.data] == [0, 1] and all(len(e.values) > 0 for e in emb.data)
    assert emb.prompt_tokens > 0 and emb.worker_ids

    models = await gstack.client.list_models()
    assert [m.id for m in models] == [gstack.model] and models[0].worker_count == 2
    workers = await gstack.client.list_workers()
    assert {w.id for w in workers} == {w.id for w in gstack.http.state.registry.all()}
    assert all(w.available and w.role == "regular" and w.in_flight == 0 for w in workers)


@pytest.mark.stack(policy="cache_aware")
async def test_inspect_prefix_matches_admin_inspect(gstack: GrpcStack) -> None:
    ids = list(range(100, 180))
    await gstack.client.complete(ids, max_tokens=2)
    got = await gstack.client.inspect_prefix(ids)
    http = (await gstack.http.http.post("/admin/inspect", json={"input_ids": ids})).json()
    assert got.policy == http["policy"] == "cache_aware"
    assert [b.hash for b in got.blocks] == [b["hash"] for b in http["blocks"]]
    assert got.ring.key == http["ring"]["key"] and got.ring.owner == http["ring"]["owner"]
    assert {w.worker_id: w.predicted_cached_tokens for w in got.workers} == {
        w["worker_id"]: w["predicted_cached_tokens"] for w in http["workers"]
    }
    assert max(w.predicted_cached_tokens for w in got.workers) > 0
    assert got.chosen_worker == http["decision"]["choice"] and got.token_count == len(ids)
    assert [t.id for t in got.tokens] == ids


async def test_bad_requests_map_to_grpc_status_with_openai_fields(gstack: GrpcStack) -> None:
    with pytest.raises(GatewayRpcError) as bad:
        await gstack.client.chat([user("x")], temperature=5.0)
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.type == "invalid_request_error" and bad.value.param == "temperature"
    with pytest.raises(GatewayRpcError) as empty:
        await gstack.client.chat([])
    assert empty.value.code == grpc.StatusCode.INVALID_ARGUMENT and empty.value.param == "messages"
    with pytest.raises(GatewayRpcError) as model:
        await gstack.client.chat([user("x")], model="no-such-model")
    assert model.value.code == grpc.StatusCode.NOT_FOUND and model.value.error_code == "model_not_found"
    with pytest.raises(GatewayRpcError) as schema:
        await gstack.client.chat([user("x")], tools=[gpb.Tool(function=gpb.FunctionDefinition(name="f", parameters_json="{nope"))])
    assert schema.value.code == grpc.StatusCode.INVALID_ARGUMENT and "parameters_json" in (schema.value.param or "")
    with pytest.raises(GatewayRpcError) as vocab:
        await gstack.client.complete([10**7], max_tokens=2)
    assert vocab.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(GatewayRpcError) as ctx_len:
        await gstack.client.complete("hi", max_tokens=10**7)
    assert ctx_len.value.code == grpc.StatusCode.INVALID_ARGUMENT and ctx_len.value.error_code == "context_length_exceeded"
    with pytest.raises(GatewayRpcError) as stream_bad:
        async for _ in gstack.client.stream_complete("hi", max_tokens=2, top_p=0.0):
            pass
    assert stream_bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


@pytest.mark.stack(server={"api_keys": ["sekrit"]})
async def test_api_key_in_metadata(gstack: GrpcStack) -> None:
    assert (await gstack.client.list_models())[0].id == gstack.model  # the fixture's client sends the key
    from gateway.client import GatewayClient

    async with GatewayClient(gstack.target) as anonymous:
        with pytest.raises(GatewayRpcError) as err:
            await anonymous.chat([user("x")], max_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    async with GatewayClient(gstack.target, api_key="wrong") as wrong:
        with pytest.raises(GatewayRpcError) as err:
            async for _ in wrong.generate([1, 2, 3]):
                pass
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_sync_client_does_the_same_calls(gstack: GrpcStack) -> None:
    from gateway.client import SyncGatewayClient

    def calls() -> tuple[str, str, list[int], str, int]:
        with SyncGatewayClient(gstack.target, timeout=30) as client:
            whole = client.complete("Once upon a time", max_tokens=6, temperature=0.0)
            streamed = "".join(ch.text for c in client.stream_complete("Once upon a time", max_tokens=6, temperature=0.0) for ch in c.choices)
            ids = list(client.tokenize("hello world").tokens)
            try:
                client.chat([user("x")], temperature=9.0)
            except GatewayRpcError as exc:
                code = exc.code.name
            outs = list(client.generate(ids, max_new_tokens=3, n=2))
            return whole.choices[0].text, streamed, ids, code, len(outs)

    text, streamed, ids, code, samples = await asyncio.to_thread(calls)
    assert text and streamed == text
    assert ids == list((await gstack.client.tokenize("hello world")).tokens)
    assert code == "INVALID_ARGUMENT" and samples == 2
