"""Completions and chat through the gateway, in front of vLLM's own HTTP server and gRPC servicer.

Every answer is checked against what the stand-in's model produces (``fake_model``) and
what vLLM's engine core received; where vLLM's own OpenAI server answers the same request,
the gateway's answer must agree with it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.interop_sglang import expect
from tests.interop_sglang.servers import Recording
from tests.interop_sglang.standin import fake_model

PROMPT = "Hello there"
MESSAGES = [{"role": "user", "content": "Name three rivers in Europe."}]


def only(records: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(records) == 1, records
    return records[0]


def test_whole_completion(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5)
    assert r.choices[0].text == expect.output_text(5) and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(expect.text_ids(PROMPT)), 5)
    rec = only(recording.generates())
    assert rec["prompt_token_ids"] == expect.text_ids(PROMPT) and rec["sampling"]["max_tokens"] == 5


def test_streamed_completion(client: Any, model: str) -> None:
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model=model, prompt=PROMPT, max_tokens=6, stream=True)
        if c.choices
    )
    assert text == expect.output_text(6)


def test_chat_whole_and_streamed_with_usage(client: Any, model: str, recording: Recording) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=7)
    assert r.choices[0].message.content == expect.output_text(7)
    assert only(recording.generates())["prompt_token_ids"] == expect.chat_ids(MESSAGES)
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices
    ) == expect.output_text(7)
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == len(
        expect.chat_ids(MESSAGES)
    )


def test_n_above_one(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, n=3, seed=11)
    assert sorted(c.index for c in r.choices) == [0, 1, 2] and r.usage.completion_tokens == 12
    # vLLM fans n out into one engine request per sample, each seeded seed + index.
    seeds = sorted(rec["sampling"]["seed"] for rec in recording.generates())
    assert seeds == [11, 12, 13]
    assert sorted(c.text for c in r.choices) == sorted(
        expect.output_text(4, seed=11 + k) for k in range(3)
    )
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=4,
            n=2,
            stream=True,
            seed=5,
            stream_options={"include_usage": True},
        )
    )
    texts = {
        i: "".join(
            c.choices[0].delta.content or ""
            for c in chunks
            if c.choices and c.choices[0].index == i
        )
        for i in (0, 1)
    }
    assert texts == {0: expect.output_text(4, seed=5), 1: expect.output_text(4, seed=6)}
    assert chunks[-1].usage.completion_tokens == 8


def test_a_seed_reaches_the_engine_and_matches_vllms_own_answer(
    client: Any, direct: Any, model: str, recording: Recording
) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, seed=1234)
    assert only(recording.generates())["sampling"]["seed"] == 1234
    assert r.choices[0].text == expect.output_text(6, seed=1234)
    own = direct.completions.create(model=model, prompt=PROMPT, max_tokens=6, seed=1234)
    assert r.choices[0].text == own.choices[0].text


def test_chat_without_max_tokens_runs_to_eos_as_on_vllms_chat_route(
    client: Any, direct: Any, model: str
) -> None:
    """vLLM's /v1/completions alone would stop it at 16 tokens."""
    r = client.chat.completions.create(model=model, messages=MESSAGES)
    own = direct.chat.completions.create(model=model, messages=MESSAGES)
    assert r.choices[0].finish_reason == own.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == own.usage.completion_tokens == fake_model.EOS_AT + 1
    assert r.choices[0].message.content == own.choices[0].message.content


def test_logprobs(client: Any, direct: Any, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=2)
    ids = expect.output_ids(3)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(
        [fake_model.token_logprob(t, i) for i, t in enumerate(ids)], abs=1e-5
    )
    assert [len(top) for top in lp.top_logprobs] == [2, 2, 2]
    own = (
        direct.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=2)
        .choices[0]
        .logprobs
    )
    assert lp.tokens == own.tokens and lp.token_logprobs == pytest.approx(
        own.token_logprobs, abs=1e-6
    )
    for mine, theirs in zip(lp.top_logprobs, own.top_logprobs, strict=True):
        assert dict(mine) == pytest.approx(dict(theirs), abs=1e-6)
    chat = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=2, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(
        [fake_model.token_logprob(t, i) for i, t in enumerate(expect.output_ids(2))], abs=1e-5
    )
    assert all(len(c.top_logprobs) == 2 for c in content)


def test_prompt_logprobs_with_echo_match_vllms_own_answer(client: Any, direct: Any, model: str) -> None:
    """``echo`` with ``logprobs``: the prompt's logprobs (none for its first token) and then
    the output's, as vLLM's own server answers."""
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True)
    own = direct.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True)
    mine, theirs = r.choices[0].logprobs, own.choices[0].logprobs
    prompt_ids = expect.text_ids(PROMPT)
    assert r.choices[0].text == own.choices[0].text == PROMPT + expect.output_text(3)
    assert len(mine.tokens) == len(prompt_ids) + 3 and mine.tokens == theirs.tokens
    assert mine.token_logprobs[0] is None and theirs.token_logprobs[0] is None
    assert mine.token_logprobs[1:] == pytest.approx(theirs.token_logprobs[1:], abs=1e-6)
    assert mine.token_logprobs[1] == pytest.approx(fake_model.token_logprob(prompt_ids[1], 1), abs=1e-5)
    assert [dict(t or {}) for t in mine.top_logprobs] == [
        pytest.approx(dict(t or {}), abs=1e-6) for t in theirs.top_logprobs
    ]

    def streamed(c: Any) -> tuple[list[str], list[float | None]]:
        tokens: list[str] = []
        values: list[float | None] = []
        for part in c.completions.create(
            model=model, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True, stream=True
        ):
            if part.choices and part.choices[0].logprobs:
                tokens += part.choices[0].logprobs.tokens
                values += part.choices[0].logprobs.token_logprobs
        return tokens, values

    (tokens, values), (own_tokens, own_values) = streamed(client), streamed(direct)
    assert tokens == own_tokens and len(tokens) == len(prompt_ids) + 3
    assert values[0] is None and own_values[0] is None
    assert values[1:] == pytest.approx(own_values[1:], abs=1e-6)


def test_a_stop_token_and_a_stop_string(client: Any, model: str, recording: Recording) -> None:
    ids = expect.output_ids(10)
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=10, extra_body={"stop_token_ids": [ids[3]]}
    )
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4
    assert ids[3] in only(recording.generates())["sampling"]["stop_token_ids"]
    stop = expect.decode(ids[4:6])
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == expect.decode(ids[:4])


def test_cached_tokens_whole_and_streamed(client: Any, model: str) -> None:
    """vLLM counts whole KV blocks (64 tokens on its CPU platform), never the last prompt token."""
    prompt = [1000 + k for k in range(300)]
    client.completions.create(model=model, prompt=prompt, max_tokens=1)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens == (300 - 1) // 64 * 64
    chunks = list(
        client.completions.create(
            model=model,
            prompt=prompt + [7] * 70,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 256
