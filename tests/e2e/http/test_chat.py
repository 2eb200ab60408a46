"""/v1/chat/completions end to end: official openai client -> gateway -> simulated workers."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.e2e.http.conftest import ENGINES, Stack, only
from tests.e2e.push_spy import record_pushes

# Conformance: the same OpenAI checks against every kind of worker.
pytestmark = pytest.mark.parametrize("engine", ENGINES)


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"please answer <<sim-reply>>{text}<</sim-reply>>"}]


async def _stream_text(stack: Stack, **kwargs: object) -> tuple[str, str, list, object]:
    content, reasoning, calls, usage = [], [], [], None
    stream = await stack.client.chat.completions.create(model=stack.model, stream=True, **kwargs)  # type: ignore[call-overload]
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            extra = getattr(choice.delta, "reasoning_content", None)
            if extra:
                reasoning.append(extra)
            if choice.delta.tool_calls:
                calls.extend(choice.delta.tool_calls)
    return "".join(content), "".join(reasoning), calls, usage


async def test_chat_stream_equals_whole_for_same_seed(stack: Stack) -> None:
    messages = [{"role": "user", "content": "Tell me something."}]
    whole = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=40, seed=3,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text = whole.choices[0].message.content
    streamed, _, _, usage = await _stream_text(
        stack, messages=messages, max_tokens=40, seed=3, stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert text and streamed == text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_reasoning_split_streaming_and_not(stack: Stack) -> None:
    messages = _reply("<think>Let me think.</think>The answer is 4.")
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=60)
    msg = whole.choices[0].message
    assert msg.content == "The answer is 4."
    assert getattr(msg, "reasoning_content", None) == "Let me think."
    assert whole.usage.completion_tokens_details.reasoning_tokens > 0
    content, reasoning, _, _ = await _stream_text(stack, messages=messages, max_tokens=60)
    assert content == "The answer is 4."
    assert reasoning == "Let me think."


async def test_tool_call_streaming_and_not(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    messages = _reply(call)
    kwargs = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, tools=tools, max_tokens=80, **kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    _, _, deltas, _ = await _stream_text(stack, messages=messages, tools=tools, max_tokens=80, **kwargs)
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == {"city": "Paris"}


async def test_stop_string_across_tokens_trims_and_reports(stack: Stack) -> None:
    messages = _reply("alpha beta gamma delta")
    kwargs = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, stop=["a gam"], max_tokens=40, **kwargs)
    assert whole.choices[0].message.content == "alpha bet"
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].model_extra.get("matched_stop") == "a gam"
    streamed, _, _, _ = await _stream_text(stack, messages=messages, stop=["a gam"], max_tokens=40, **kwargs)
    assert streamed == "alpha bet"


async def test_n_and_logprobs(stack: Stack, engine: str) -> None:
    only(engine, {"sglang", "vllm", "trtllm", "sglang-http"}, "the simulator's vLLM HTTP mode returns no logprobs yet")
    resp = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=8,
        logprobs=True, top_logprobs=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True},
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for c in resp.choices:
        assert c.logprobs is not None and len(c.logprobs.content) == 8
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in c.logprobs.content)
    assert resp.usage.completion_tokens == 24


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[]", 400),
        (json.dumps({"messages": []}).encode(), 400),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 0}).encode(), 400),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}).encode(), 400),
        (json.dumps({"model": "missing", "messages": [{"role": "user", "content": "x"}]}).encode(), 404),
    ],
)
async def test_bad_requests_get_openai_errors(stack: Stack, body: bytes, status: int) -> None:
    resp = await stack.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["message"] and error["type"]
    assert (await stack.http.get("/health")).status_code == 200


async def test_client_disconnect_during_prefill_aborts_worker(tmp_path, engine: str) -> None:
    from tests.e2e.http.conftest import StackOptions, start_stack

    # A slow prefill (100 ms per 1000 tokens of simulated time) so the client leaves before any token.
    opts = StackOptions(workers=1, sim={"prefill_token_s": 1e-3, "time_scale": 1.0}, engine=engine)
    async with start_stack(opts, tmp_path) as stack:
        worker = stack.fleet.workers[0]
        task = asyncio.create_task(
            stack.client.chat.completions.create(
                model=stack.model, messages=[{"role": "user", "content": "word " * 3000}], max_tokens=50, stream=True
            )
        )
        # Leave once the worker holds the request (it prefills for ~3 s): a cold first render can take longer
        # than any fixed sleep on a loaded machine, and a client gone before dispatch never reaches a worker.
        for _ in range(200):
            if worker.counters.requests >= 1 or task.done():
                break
            await asyncio.sleep(0.025)
        assert worker.counters.requests == 1 and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gw_worker = stack.state.registry.all()[0]
        for _ in range(50):
            if gw_worker.load.in_flight == 0 and worker.counters.aborted >= 1:
                break
            await asyncio.sleep(0.05)
        assert gw_worker.load.in_flight == 0
        assert worker.counters.aborted >= 1


async def test_tokenize_roundtrip_models_and_embeddings(stack: Stack, engine: str) -> None:
    only(engine, {"sglang", "vllm", "vllm-http"}, "SGLang HTTP and TensorRT-LLM workers lack embeddings (GET /workers lists it)")
    tok = (await stack.http.post("/v1/tokenize", json={"prompt": "Hello, world"})).json()
    assert tok["count"] == len(tok["tokens"]) > 0
    text = (await stack.http.post("/v1/detokenize", json={"tokens": tok["tokens"]})).json()["text"]
    assert text == "Hello, world"
    models = await stack.client.models.list()
    assert [m.id for m in models.data] == [stack.model]
    emb = await stack.client.embeddings.create(model=stack.model, input=["a b c", "d e"])
    assert len(emb.data) == 2 and abs(sum(x * x for x in emb.data[0].embedding) - 1) < 1e-3


async def test_native_generate(stack: Stack) -> None:
    resp = (await stack.http.post("/generate", json={"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}})).json()
    assert len(resp["output_ids"]) == 5
    assert resp["meta_info"]["finish_reason"]["type"] == "length"


async def test_no_worker_is_503(stack: Stack) -> None:
    for w in stack.state.registry.all():
        w.healthy = False
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=2)
    assert info.value.status_code == 503


async def test_named_tool_choice_parses_whole_output_as_arguments(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    resp = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply('{"city": "Oslo"}'), tools=tools, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def _spy_worker_requests(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The GenerateRequests the gateway sends its workers, as sent (every kind of client)."""
    from gateway.workers.client import WorkerClient
    from gateway.workers.sglang_http import HttpWorkerClient
    from gateway.workers.trtllm_grpc import TrtllmGrpcClient
    from gateway.workers.vllm_grpc import VllmGrpcClient
    from gateway.workers.vllm_http import VllmHttpClient

    sent: list[object] = []

    def spy(cls: type) -> None:
        real = cls.generate

        def generate(self: object, request: object, **kwargs: object) -> object:
            sent.append(request)
            return real(self, request, **kwargs)

        monkeypatch.setattr(cls, "generate", generate)

    for cls in (WorkerClient, VllmGrpcClient, TrtllmGrpcClient, HttpWorkerClient, VllmHttpClient):
        spy(cls)
    return sent


async def test_short_unary_answers_come_whole_from_the_worker(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-streamed answer is asked of the worker not streamed, as SGLang's own frontends
    ask (its GenerateComplete alone), when its time on the workers is within
    --unary-whole-max-s: n > 1 and logprobs included. The answer is the one the streamed
    path gives. Stop strings matched here stream; past the bound, coarse chunks."""
    sent = _spy_worker_requests(monkeypatch)
    messages = [{"role": "user", "content": "Tell me something."}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=8, seed=5, extra_body=off)
    assert [r.stream for r in sent] == [False]  # type: ignore[attr-defined]
    streamed, _, _, usage = await _stream_text(
        stack, messages=messages, max_tokens=8, seed=5, stream_options={"include_usage": True}, extra_body=off
    )
    assert sent[-1].stream  # type: ignore[attr-defined]
    assert whole.choices[0].message.content == streamed and streamed
    assert whole.choices[0].finish_reason == "length"
    assert usage is not None and whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens) == (usage.prompt_tokens, 8)
    sent.clear()
    interval = stack.state.config.resume.unary_stream_interval
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=interval, extra_body=off)
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=interval + 1, extra_body=off)
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=8, n=2, extra_body=off)
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=8, logprobs=True, extra_body=off)
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=8, stop=["zz"], extra_body=off)
    assert [r.stream for r in sent] == [False, False, False, False, True]  # type: ignore[attr-defined]
    sent.clear()
    stack.state.engine.resume.unary_whole_max_s = 0.0  # only one-message answers go whole
    many = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=8, n=2, logprobs=True, extra_body=off
    )
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=interval + 1, extra_body=off)
    assert [r.stream for r in sent] == [True, True]  # type: ignore[attr-defined]
    assert sent[1].sampling_params.stream_interval == interval  # type: ignore[attr-defined]
    stack.state.engine.resume.unary_whole_max_s = 60.0
    whole_many = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=8, n=2, logprobs=True, extra_body=off
    )
    assert not sent[-1].stream  # type: ignore[attr-defined]
    for streamed_choice, whole_choice in zip(many.choices, whole_many.choices, strict=True):
        assert whole_choice.index == streamed_choice.index and whole_choice.finish_reason == "length"
        assert whole_choice.message.content and streamed_choice.message.content
        assert whole_choice.logprobs is not None and streamed_choice.logprobs is not None
        # The same rows either way (a fleet whose workers report no logprobs has none in both).
        assert len(whole_choice.logprobs.content or []) == len(streamed_choice.logprobs.content or [])


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_short_unary_answer_retried_when_its_worker_fails_mid_generation(stack: Stack) -> None:
    """Not streamed, a failure after some tokens is a failure before the first message:
    the request goes to the other worker and the client gets the whole answer."""
    stack.fleet.workers[0].faults.fail_after_tokens = 3
    for _ in range(4):  # round robin: at least two of them meet the failing worker first
        reply = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.choices[0].finish_reason == "length"
    retried = sum(s.value for m in stack.state.metrics.retries.collect() for s in m.samples if s.name.endswith("_total"))
    resumed = sum(s.value for m in stack.state.metrics.resumes.collect() for s in m.samples if s.name.endswith("_total"))
    assert retried >= 2 and resumed == 0  # before any output: retried whole, never resumed
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())


# The worker kinds whose calls hand messages to the relay as they arrive (``WorkerStream.listen``).
PUSHING = {"sglang", "sglang-http", "vllm-http"}

@pytest.mark.stack(workers=1, sim={"step_base_s": 0.002, "time_scale": 1.0})
async def test_a_paced_streams_tokens_go_to_the_client_from_the_worker_connection(
    stack: Stack, engine: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plain text path's tokens after the first event are written as they arrive
    (``Generation.push_to``, on the gateway's own HTTP/2 worker calls), and the client
    reads what it reads without: the whole answer's text, the role first, one finish."""
    only(engine, PUSHING, "only the gateway's own HTTP/2 calls and the HTTP workers' calls hand messages over")
    pushed = record_pushes(monkeypatch)
    messages = [{"role": "user", "content": "Tell me something."}]
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=24, seed=5)
    stream = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=24, seed=5, stream=True,
    )
    roles, texts, finishes = [], [], []
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                texts.append(choice.delta.content)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert "".join(texts) == whole.choices[0].message.content
    assert roles == ["assistant"] and finishes == [whole.choices[0].finish_reason]
    assert pushed and "".join("".join(p) for p in pushed) in "".join(texts)


@pytest.mark.stack(workers=1, sim={"step_base_s": 0.002, "time_scale": 1.0})
async def test_a_paced_reasoning_stream_is_pushed_through_the_split_and_reads_as_the_whole_answer(
    stack: Stack, engine: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A think block's tokens are pushed too: each delivery's text through the reasoning
    parser (and its tokens through the counter) as the loop would, then content once the
    split is settled; the client reads the whole answer's reasoning, content and count."""
    only(engine, PUSHING, "only the gateway's own HTTP/2 calls and the HTTP workers' calls hand messages over")
    from gateway.endpoints import chat

    splitting: list[bool] = []
    write = chat._ChatPush.write

    def spy(self: chat._ChatPush, texts: list[str]) -> None:
        splitting.append(self.split.splitting)
        write(self, texts)

    monkeypatch.setattr(chat._ChatPush, "write", spy)
    messages = _reply("<think>Let me think about this for a while, step by step.</think>The answer is 4, as two and two make four.")
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=80)
    content, reasoning, _, usage = await _stream_text(
        stack, messages=messages, max_tokens=80, stream_options={"include_usage": True},
    )
    msg = whole.choices[0].message
    assert content == msg.content == "The answer is 4, as two and two make four."
    assert reasoning == getattr(msg, "reasoning_content", None)
    assert usage is not None
    assert usage.completion_tokens_details.reasoning_tokens == whole.usage.completion_tokens_details.reasoning_tokens > 0
    assert True in splitting and False in splitting  # pushed inside the think block and after it
