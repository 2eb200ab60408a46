"""/v1/completions through the official openai client, against simulated workers."""

from __future__ import annotations

import pytest

from tests.e2e.http.conftest import ENGINES, Stack, only

# Conformance: the same OpenAI checks against every kind of worker.
pytestmark = pytest.mark.parametrize("engine", ENGINES)


async def test_completion_text_prompt_streams_same_text(stack: Stack) -> None:
    whole = await stack.client.completions.create(model=stack.model, prompt="Hello there", max_tokens=24, seed=7)
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    text = whole.choices[0].text
    assert text
    parts = []
    stream = await stack.client.completions.create(
        model=stack.model, prompt="Hello there", max_tokens=24, seed=7, stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].text)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(parts) == text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_token_prompt_batch_and_n(stack: Stack) -> None:
    resp = await stack.client.completions.create(
        model=stack.model, prompt=[[100, 200, 300], [400, 500]], max_tokens=5, n=2, seed=1
    )
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert resp.usage.prompt_tokens == 5


async def test_cached_tokens_reported_on_repeat(stack: Stack) -> None:
    prompt = list(range(1000, 1000 + 256))
    extra = {"extra_headers": {"x-smg-target-worker": stack.fleet.urls[0]}}
    await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=2, **extra)
    again = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=2, **extra)
    assert again.usage.prompt_tokens_details.cached_tokens >= 240


async def test_unknown_model_is_404(stack: Stack) -> None:
    import openai

    with pytest.raises(openai.NotFoundError):
        await stack.client.completions.create(model="nope", prompt="hi", max_tokens=2)


@pytest.mark.stack(workers=1, sections={"engine": {"worker_stream_interval": 4}})
async def test_worker_stream_interval_batches_tokens_same_text(stack: Stack, engine: str) -> None:
    """--worker-stream-interval asks workers for N-token chunks: fewer events, same text and usage."""
    only(engine, {"sglang", "sglang-http"}, "vLLM and TensorRT-LLM lack a stream interval (they stream every step)")
    whole = await stack.client.completions.create(model=stack.model, prompt=[100, 200, 300], max_tokens=12, seed=3)
    stream = await stack.client.completions.create(
        model=stack.model, prompt=[100, 200, 300], max_tokens=12, seed=3, stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            texts.append(chunk.choices[0].text)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(texts) == whole.choices[0].text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens == 12
    assert len(texts) <= 4  # 12 tokens in chunks of 4 (a chunk's text may wait for a whole character)


async def _stream_texts(stack: Stack, **extra: object) -> list[str]:
    stream = await stack.client.completions.create(
        model=stack.model, prompt=[100, 200, 300], max_tokens=12, seed=3, stream=True, **extra,  # type: ignore[call-overload]
    )
    return [c.choices[0].text async for c in stream if c.choices and c.choices[0].text]


@pytest.mark.stack(
    workers=1, sim={"step_base_s": 0.002, "time_scale": 1.0},
    sections={"engine": {"busy_stream_interval": 4, "busy_in_flight": 1}},
)
async def test_busy_stream_interval_batches_only_under_load(stack: Stack, engine: str) -> None:
    only(engine, {"sglang", "sglang-http"}, "vLLM and TensorRT-LLM lack a stream interval (they stream every step)")
    """--busy-stream-interval: one token per event while the gateway is not busy; N-token
    chunks for streams that start while --busy-in-flight requests are already running."""
    quiet = await _stream_texts(stack)
    # Nothing else in flight: the worker streams token by token, as without the flag (tokens
    # that reach the gateway together still go out as one event: more than 4 events, not 12).
    assert len(quiet) > 4
    held = await stack.client.completions.create(
        model=stack.model, prompt=[7, 8, 9], max_tokens=2000, stream=True, extra_body={"ignore_eos": True},
    )
    try:
        async for _ in held:  # the first event: the held stream is in flight on its worker
            break
        busy = await _stream_texts(stack)
    finally:
        await held.close()
    assert "".join(busy) == "".join(quiet)
    assert len(busy) <= 4  # 12 tokens in chunks of 4
