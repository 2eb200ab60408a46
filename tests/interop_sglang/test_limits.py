"""Context length: what the gateway advertises and enforces against SGLang's real limit.

SGLang refuses a prompt of ``context_len - 1 - 5`` tokens or more (its scheduler's
``max_req_input_len``: 40,954 for Qwen3's 40,960); the servicer reports its KV pool
size as the model's context instead.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.interop_sglang.servers import Process, Recording

CONTEXT = 40960
FIRST_REFUSED = CONTEXT - 1 - 5


def test_prompt_just_under_the_limit_is_served(client: Any, model: str, recording: Recording) -> None:
    prompt = [1000 + i % 5000 for i in range(FIRST_REFUSED - 1)]
    r = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert r.usage.prompt_tokens == FIRST_REFUSED - 1
    [rec] = recording.generates()
    assert len(rec["input_ids"]) == FIRST_REFUSED - 1


def test_prompt_at_the_limit_is_refused_cleanly(client: Any, model: str) -> None:
    prompt = [1000 + i % 5000 for i in range(FIRST_REFUSED)]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert client.completions.create(model=model, prompt="ok", max_tokens=1).usage.completion_tokens == 1


def test_prompt_over_the_limit_is_refused_before_any_worker(client: Any, model: str, recording: Recording) -> None:
    prompt = [1000 + i % 5000 for i in range(45000)]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert recording.generates() == []


def test_models_list_advertises_the_models_context(gateway: Process, model: str) -> None:
    body = httpx.get(gateway.extra["url"] + "/v1/models", timeout=10).json()
    [entry] = [m for m in body["data"] if m["id"] == model]
    assert entry["max_model_len"] == CONTEXT
