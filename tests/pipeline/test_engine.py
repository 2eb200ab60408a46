"""The engine's prompt tokenization: what the prompt cache does not hold decides where the
encode runs (on the event loop when small, in the pool when large, once per new text)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine, EngineConfig
from gateway.pipeline.router import Router
from gateway.policies.factory import make_policy
from gateway.tokenization import ChatPromptCache, Tokenizer
from gateway.tokenization.prefix_cache import Pending
from gateway.workers.registry import WorkerRegistry
from tests.tokenization.helpers import qwen_files

OFFLOAD_CHARS = 600
SYSTEM = "Shared words of a long system prompt that every request of a group starts with. " * 40


class _Catalog:
    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry

    def get(self, name: str | None) -> ModelEntry:
        return self.entry


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_path(qwen_files())


@pytest.fixture
def engine(tokenizer: Tokenizer) -> Iterator[tuple[Engine, ModelEntry, list[tuple[int, int]]]]:
    """An engine whose prompt cache records (thread, size of the new text) of every finish."""
    cache = ChatPromptCache(tokenizer)
    entry = ModelEntry("m", tokenizer, "path", 0, cache)
    settings = EngineConfig(offload_chars=OFFLOAD_CHARS, fast_encoder_after=0)
    eng = Engine(Router(WorkerRegistry(), lambda role: make_policy()), _Catalog(entry), config=settings)  # type: ignore[arg-type]
    finishes: list[tuple[int, int]] = []
    real = cache.finish

    def finish(pending: Pending) -> list[int]:
        finishes.append((threading.get_ident(), pending.rest_chars))
        return real(pending)

    cache.finish = finish  # type: ignore[method-assign]
    try:
        yield eng, entry, finishes
    finally:
        eng.close()


async def test_a_small_new_part_is_encoded_on_the_loop_a_large_one_in_the_pool(
    engine: tuple[Engine, ModelEntry, list[tuple[int, int]]], tokenizer: Tokenizer
) -> None:
    eng, entry, finishes = engine
    loop_thread = threading.get_ident()
    first, second = SYSTEM + "What is the capital of France?", SYSTEM + "Name three rivers, please!"
    assert len(first) > 4 * OFFLOAD_CHARS
    assert await eng.encode_prompt(entry, first) == tokenizer.encode(first, add_special_tokens=True)
    assert await eng.encode_prompt(entry, second) == tokenizer.encode(second, add_special_tokens=True)
    (t1, size1), (t2, size2) = finishes
    assert t1 != loop_thread and size1 == len(first)  # all new: the pool
    assert t2 == loop_thread and size2 <= OFFLOAD_CHARS  # only the question is new: here
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello?"}]
    for turn in ("Hello?", "And then?"):
        messages[-1]["content"] = turn
        text, ids = await eng.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
    (t3, size3), (t4, size4) = finishes[2:]
    assert t3 != loop_thread and size3 > OFFLOAD_CHARS  # a new system message: the pool
    assert t4 == loop_thread and size4 <= OFFLOAD_CHARS  # a new user turn: here


async def test_one_new_text_is_encoded_once_for_a_burst_of_requests(
    engine: tuple[Engine, ModelEntry, list[tuple[int, int]]], tokenizer: Tokenizer
) -> None:
    """Prompts arriving together with the same new system prompt: one encode in the pool,
    the others wait for it and encode only their own question."""
    eng, entry, finishes = engine
    texts = [SYSTEM + f"Question number {i}, about rivers?" for i in range(6)]
    got = await asyncio.gather(*(eng.encode_prompt(entry, t) for t in texts))
    assert got == [tokenizer.encode(t, add_special_tokens=True) for t in texts]
    loop_thread = threading.get_ident()
    assert sum(1 for thread, _ in finishes if thread != loop_thread) == 1
    assert all(size <= OFFLOAD_CHARS for thread, size in finishes if thread == loop_thread)
    stats = entry.prompt_cache.stats()
    assert (stats.lookups, stats.hits) == (6, 5)
    assert not eng._encoding  # nothing left in flight


async def test_a_waiter_keeps_its_encode_when_the_first_client_leaves(
    engine: tuple[Engine, ModelEntry, list[tuple[int, int]]], tokenizer: Tokenizer
) -> None:
    eng, entry, _ = engine
    first, second = SYSTEM + "First?", SYSTEM + "Second?"
    owner = asyncio.create_task(eng.encode_prompt(entry, first))
    await asyncio.sleep(0)  # the owner's encode is in the pool
    waiter = asyncio.create_task(eng.encode_prompt(entry, second))
    await asyncio.sleep(0)
    owner.cancel()
    assert await waiter == tokenizer.encode(second, add_special_tokens=True)
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert entry.prompt_cache.stats().hits == 1  # the cancelled client's encode still served the waiter


async def test_a_failed_encode_fails_its_waiters_and_leaves_nothing_in_flight(
    engine: tuple[Engine, ModelEntry, list[tuple[int, int]]], tokenizer: Tokenizer
) -> None:
    eng, entry, _ = engine
    cache = entry.prompt_cache
    real = cache.finish

    def failing(pending: Pending) -> list[int]:
        if pending.rest_chars > OFFLOAD_CHARS:
            raise RuntimeError("tokenizer failed")
        return real(pending)

    cache.finish = failing  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(eng.encode_prompt(entry, SYSTEM + f"Question {i}?") for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    assert not eng._encoding
    cache.finish = real  # type: ignore[method-assign]
    assert await eng.encode_prompt(entry, SYSTEM + "Again?") == tokenizer.encode(SYSTEM + "Again?", add_special_tokens=True)
