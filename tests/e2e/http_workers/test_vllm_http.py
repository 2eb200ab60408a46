"""The official openai client -> gateway -> simulated *vLLM* HTTP workers (OpenAI server
with token-id prompts and ``return_token_ids``): detected by what they answer, routed on
the ids they cache, resumed after a failure."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.http_workers.test_sglang_http import eventually, http_stack, idle


async def test_vllm_workers_are_detected_and_serve_chat_and_completions(tmp_path: Any) -> None:
    async with http_stack(tmp_path, api="vllm") as stack:
        assert {w.client.kind for w in stack.state.registry.all()} == {"vllm/http"}
        whole = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=10,
            extra_body={"ignore_eos": True},
        )
        assert whole.choices[0].finish_reason == "length" and whole.choices[0].message.content
        assert whole.usage is not None and whole.usage.completion_tokens == 10
        stream = await stack.client.completions.create(
            model=stack.model, prompt="tell me", max_tokens=10, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text or ""
            usage = chunk.usage or usage
        assert text and usage is not None and usage.completion_tokens == 10
        assert idle(stack)


async def test_vllm_workers_report_cached_tokens_and_route_on_them(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=2, api="vllm", policy="cache_aware") as stack:
        prompt = "a long shared preamble about routing on tokens " * 8
        for _ in range(3):
            last = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=3)
        assert last.usage is not None and last.usage.prompt_tokens_details is not None
        assert last.usage.prompt_tokens_details.cached_tokens
        # Streamed, vLLM reports cached tokens only in its closing usage chunk.
        stream = await stack.client.completions.create(
            model=stack.model, prompt=prompt, max_tokens=3, stream=True, stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens_details.cached_tokens
        served = sorted(w.worker.counters.requests for w in stack.workers)
        assert served == [0, 4]  # cache_aware kept the prefix on one worker


async def test_a_vllm_worker_failing_mid_stream_is_resumed(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=2, api="vllm") as stack:
        stack.workers[0].worker.faults.fail_after_tokens = 4
        for _ in range(2):
            stream = await stack.client.completions.create(
                model=stack.model, prompt="hello there", max_tokens=20, stream=True,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == 20
        await eventually(lambda: idle(stack))


async def test_a_data_parallel_vllm_worker_is_one_target_per_rank(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=1, api="vllm", policy="cache_aware", sim={"dp_size": 2}) as stack:
        ranks = sorted(w.id for w in stack.state.registry.all())
        assert len(ranks) == 2 and all("@" in r for r in ranks)
        for preamble in ("one shared preamble about tokens " * 8, "another preamble on routing, quite different " * 8):
            for _ in range(2):
                last = await stack.client.completions.create(model=stack.model, prompt=preamble, max_tokens=2)
            assert last.usage is not None and last.usage.prompt_tokens_details is not None
            # Pinned to the rank that holds it: unpinned, the worker takes its ranks in turn,
            # and the second request would find the other rank's cache empty.
            assert last.usage.prompt_tokens_details.cached_tokens


async def _logprob_rows(stack: Any, stream: bool) -> tuple[list[Any], list[Any], str]:
    """An echo completion with logprobs through the gateway: (token_logprobs, top_logprobs, text)."""
    fields: dict[str, Any] = {"prompt": "rows of logprobs", "max_tokens": 4, "logprobs": 2, "echo": True, "seed": 1}
    if not stream:
        whole = await stack.client.completions.create(model=stack.model, **fields)
        lp = whole.choices[0].logprobs
        return lp.token_logprobs, lp.top_logprobs, whole.choices[0].text
    values: list[Any] = []
    tops: list[Any] = []
    text = ""
    async for chunk in await stack.client.completions.create(model=stack.model, stream=True, **fields):
        for choice in chunk.choices:
            text += choice.text or ""
            if choice.logprobs is not None:
                values += choice.logprobs.token_logprobs
                tops += choice.logprobs.top_logprobs
    return values, tops, text


async def test_vllm_workers_give_logprobs_as_the_sglang_ones_do(tmp_path: Any) -> None:
    """The same simulated model behind vLLM's server and SGLang's: the gateway's answers,
    prompt rows (echo) and top candidates included, agree whole and streamed."""
    answers = {}
    for api in ("vllm", "sglang"):
        async with http_stack(tmp_path / api, workers=1, api=api) as stack:
            answers[api] = [await _logprob_rows(stack, stream) for stream in (False, True)]
            assert idle(stack)
    for (values, tops, text), (want_values, want_tops, want_text) in zip(answers["vllm"], answers["sglang"], strict=True):
        assert text == want_text and values == want_values and tops == want_tops
        assert values[0] is None and all(isinstance(v, float) for v in values[1:])
        assert all(len(row) == 2 for row in tops[1:])
    assert answers["vllm"][0] == answers["vllm"][1]


async def test_vllm_workers_serve_embeddings_as_the_sglang_grpc_path_does(tmp_path: Any) -> None:
    """vLLM's ``/v1/embeddings`` with the routed ids: the same vectors as the same simulated
    model gives over SGLang's gRPC seam (the simulator's Embed behind both)."""
    async with http_stack(tmp_path, workers=1, api="vllm") as stack:
        (worker,) = stack.state.registry.all()
        assert "embed" not in worker.client.lacks
        got = await stack.client.embeddings.create(model=stack.model, input=["a b c", "d e"])
        served = stack.workers[0].worker
        assert served.counters.embeds == 2
        from gateway_lab.sim.sampler import embedding

        ids = [(await stack.http.post("/v1/tokenize", json={"prompt": t})).json()["tokens"] for t in ("a b c", "d e")]
        for datum, prompt in zip(got.data, ids, strict=True):
            want = embedding(prompt, served.config.seed, served.config.embed_dim)
            assert datum.embedding == pytest.approx(want, rel=1e-6)
        assert got.usage.prompt_tokens == sum(len(p) for p in ids)
