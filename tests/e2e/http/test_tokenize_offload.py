"""A ~100K-token prompt is tokenized off the event loop: small requests keep flowing.

The big prompt's real tokenization is wrapped so that, once done, it waits for a gate
that only a small request *completing* opens. Were long prompts tokenized on the event
loop, the loop would sit in that wait, the small request could never complete, and the
gate would time out: the test checks the order of events, not wall-clock figures.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.http.conftest import Stack

BIG_TOKENS = 100_000
GATE_TIMEOUT_S = 60.0  # a safety valve only: the ordering assert is what fails


def _long_text(tokens: int) -> str:
    """Plain text of a bit over ``tokens`` Qwen3 tokens (each word-number pair is ~2.9)."""
    words = ("alpha", "river", "stone", "light", "cloud", "north", "maple", "seven")
    return " ".join(words[i % len(words)] + str(i % 97) for i in range(tokens * 10 // 28))


class _Gate:
    """Wraps a tokenization call: long inputs signal, tokenize for real, then wait for the gate."""

    def __init__(self, threshold_chars: int) -> None:
        self.threshold = threshold_chars
        self.started = threading.Event()
        self.release = threading.Event()
        self.released_in_time: bool | None = None
        self.on_loop_thread: bool | None = None
        self.loop_thread = threading.get_ident()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(text: str, *args: Any) -> Any:
            if len(text) < self.threshold:
                return fn(text, *args)
            self.on_loop_thread = threading.get_ident() == self.loop_thread
            self.started.set()
            result = fn(text, *args)
            self.released_in_time = self.release.wait(GATE_TIMEOUT_S)
            return result

        return wrapped


@pytest.mark.slow
@pytest.mark.stack(workers=2, sim={"context_length": 262144, "kv_capacity_tokens": 262144})
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_long_prompt_tokenization_does_not_stall_small_requests(
    stack: Stack, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = stack.state.catalog.get(stack.model)
    gate = _Gate(threshold_chars=stack.state.config.engine.offload_chars * 10)
    if endpoint == "chat":
        monkeypatch.setattr(entry.prompt_cache, "encode", gate.wrap(entry.prompt_cache.encode))
    else:  # text prompts go through the prefix-reusing prompt encoder (Engine.encode_prompt)
        monkeypatch.setattr(entry.prompt_cache, "encode_prompt", gate.wrap(entry.prompt_cache.encode_prompt))
    big_text = _long_text(BIG_TOKENS)

    async def big() -> Any:
        if endpoint == "chat":
            return await stack.client.chat.completions.create(
                model=stack.model, messages=[{"role": "user", "content": big_text}], max_tokens=4
            )
        return await stack.client.completions.create(model=stack.model, prompt=big_text, max_tokens=4)

    big_task = asyncio.create_task(big())
    assert await asyncio.to_thread(gate.started.wait, GATE_TIMEOUT_S), "the big prompt never reached the tokenizer"

    # While the big prompt is still in tokenization, a small request goes all the way through.
    small = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert small.choices[0].message.content is not None
    assert not big_task.done()
    assert gate.released_in_time is None  # the big tokenization is still waiting on us
    seen = [w.counters.prompt_tokens for w in stack.fleet.workers]
    assert max(seen) < BIG_TOKENS  # no worker has received the big prompt yet

    gate.release.set()
    response = await big_task
    assert gate.on_loop_thread is False
    assert gate.released_in_time is True
    assert response.usage is not None and response.usage.prompt_tokens >= BIG_TOKENS
