"""Completions through the gateway, in front of SGLang's own --grpc-mode server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.interop_sglang import expect
from tests.interop_sglang.servers import Recording
from tests.interop_sglang.standin import fake_model

PROMPT = "Hello there"


def test_whole(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5)
    assert r.choices[0].text == expect.output_text(5)
    assert r.choices[0].finish_reason == "length"
    [rec] = recording.generates()
    assert rec["input_ids"] == expect.text_ids(PROMPT)
    assert rec["sampling_params"]["max_new_tokens"] == 5


def test_streamed(client: Any, model: str) -> None:
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, stream=True) if c.choices)
    assert text == expect.output_text(6)


def test_token_id_prompt_goes_through_unchanged(client: Any, model: str, recording: Recording) -> None:
    prompt = [1000, 2000, 3000, 4000]
    client.completions.create(model=model, prompt=prompt, max_tokens=1)
    [rec] = recording.generates()
    assert rec["input_ids"] == prompt


def test_logprobs_with_echo(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=1, echo=True)
    prompt_ids = expect.text_ids(PROMPT)
    out_ids = expect.output_ids(3)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == PROMPT + expect.output_text(3)
    want_prompt = [fake_model.token_logprob(t, i) for i, t in enumerate(prompt_ids)]
    want_out = [fake_model.token_logprob(t, i) for i, t in enumerate(out_ids)]
    assert lp.token_logprobs[0] is None  # the first prompt token has no logprob
    assert lp.token_logprobs[1:] == pytest.approx(want_prompt[1:] + want_out, abs=1e-5)
    [rec] = recording.generates()
    assert rec["return_logprob"] is True and rec["logprob_start_len"] == 0


def test_logprobs_without_echo_ask_no_prompt_logprobs(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=2)
    assert len(r.choices[0].logprobs.token_logprobs) == 3
    [rec] = recording.generates()
    assert rec["return_logprob"] is True and rec["top_logprobs_num"] == 2


def test_max_tokens_reaches_the_scheduler(client: Any, model: str, recording: Recording) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=16)
    assert r.usage.completion_tokens == 16
    [rec] = recording.generates()
    assert rec["sampling_params"]["max_new_tokens"] == 16
