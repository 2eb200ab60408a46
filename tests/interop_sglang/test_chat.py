"""Chat completions through the gateway, in front of SGLang's own --grpc-mode server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.interop_sglang import expect
from tests.interop_sglang.corpus import KINDS
from tests.interop_sglang.servers import Recording
from tests.interop_sglang.standin import fake_model

MESSAGES = [{"role": "user", "content": "Hello there"}]


def only(records: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(records) == 1, records
    return records[0]


def test_whole_answer_is_the_models_tokens(client: Any, model: str, recording: Recording) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6)
    assert r.choices[0].message.content == expect.output_text(6)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(expect.chat_ids(MESSAGES)), 6)
    rec = only(recording.generates())
    assert rec["input_ids"] == expect.chat_ids(MESSAGES)
    assert rec["sampling_params"]["max_new_tokens"] == 6
    assert r.id.endswith(rec["rid"]) or rec["rid"] in r.id


def test_an_uncapped_whole_answer_is_asked_for_unstreamed(client: Any, model: str, recording: Recording) -> None:
    """No max_tokens and not streamed: asked for unstreamed as SGLang's HTTP server asks (its
    budget is what the context leaves, its deadline the gateway's), no cap on the wire."""
    r = client.chat.completions.create(model=model, messages=MESSAGES)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == expect.output_text(fake_model.EOS_AT)
    rec = only(recording.generates())
    assert rec["stream"] is False
    assert rec["sampling_params"]["max_new_tokens"] is None and rec["sampling_params"]["stream_interval"] is None


def test_streamed_answer_equals_the_whole_one(client: Any, model: str, recording: Recording) -> None:
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=7, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expect.output_text(7)
    assert finish == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert only(recording.generates())["stream"] is True


def test_explicit_sampling_values_reach_the_scheduler(client: Any, model: str, recording: Recording) -> None:
    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3, temperature=0.3, top_p=0.8,
                                   presence_penalty=0.5, frequency_penalty=0.25,
                                   extra_body={"top_k": 7, "min_p": 0.05, "repetition_penalty": 1.1})
    sp = only(recording.generates())["sampling_params"]
    assert sp["temperature"] == pytest.approx(0.3)
    assert sp["top_p"] == pytest.approx(0.8)
    assert sp["top_k"] == 7
    assert sp["min_p"] == pytest.approx(0.05)
    assert sp["presence_penalty"] == pytest.approx(0.5)
    assert sp["frequency_penalty"] == pytest.approx(0.25)
    assert sp["repetition_penalty"] == pytest.approx(1.1)
    assert sp["max_new_tokens"] == 3


def test_model_defaults_apply_when_the_request_omits_them(client: Any, model: str, recording: Recording) -> None:
    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)
    sp = only(recording.generates())["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (pytest.approx(0.6), pytest.approx(0.95), 20)


@pytest.mark.xfail(strict=True, reason=KINDS["seed"].reason)
def test_seed_reaches_the_scheduler_as_sampling_seed(client: Any, model: str, recording: Recording) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, seed=1234)
    assert only(recording.generates())["sampling_params"]["sampling_seed"] == 1234
    assert r.choices[0].message.content == expect.output_text(5, seed=1234)


def test_same_seed_same_answer(client: Any, model: str) -> None:
    a = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, seed=99)
    b = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, seed=99)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_n_samples_have_their_own_index(client: Any, model: str, recording: Recording) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.message.content == expect.output_text(4) for c in r.choices)
    assert r.usage.completion_tokens == 12
    recs = recording.generates()
    assert recs and all(rec["input_ids"] == expect.chat_ids(MESSAGES) for rec in recs)


def test_n_samples_streamed(client: Any, model: str) -> None:
    texts: dict[int, str] = {}
    for c in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, n=2, stream=True):
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert texts == {0: expect.output_text(4), 1: expect.output_text(4)}


def test_logprobs_are_the_models(client: Any, model: str, recording: Recording) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=2)
    ids = expect.output_ids(4)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(
        [fake_model.token_logprob(t, i) for i, t in enumerate(ids)], abs=1e-5)
    assert all(len(c.top_logprobs) == 2 for c in content)
    rec = only(recording.generates())
    assert (rec["return_logprob"], rec["top_logprobs_num"]) == (True, 2)


def test_stop_string_ends_the_answer(client: Any, model: str) -> None:
    ids = expect.output_ids(12)
    stop = expect.decode([ids[4]]).strip()
    before = expect.decode(ids[:4])
    assert stop and stop not in before, "the fake model's sequence must not hold the stop string earlier"
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content.startswith(before.rstrip()) and stop not in r.choices[0].message.content


def test_stop_token_id_ends_the_answer(client: Any, model: str, recording: Recording) -> None:
    ids = expect.output_ids(10)
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10,
                                       extra_body={"stop_token_ids": [ids[3]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 4
    assert r.choices[0].message.content == expect.decode(ids[:3])
    assert ids[3] in only(recording.generates())["sampling_params"]["stop_token_ids"]


def test_no_reasoning_tokens_without_a_think_block(client: Any, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)
    details = r.usage.completion_tokens_details
    assert details is None or not details.reasoning_tokens
