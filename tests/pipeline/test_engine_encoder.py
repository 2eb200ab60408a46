"""The engine builds a model's fast encoder once, in a thread of its own, at its first long
prompt or its Nth prompt."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine, EngineConfig
from gateway.pipeline.router import Router
from gateway.policies.factory import make_policy
from gateway.tokenization import ChatPromptCache, Tokenizer
from gateway.workers.registry import WorkerRegistry
from tests.tokenization.helpers import qwen_files


class _Catalog:
    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry

    def get(self, name: str | None) -> ModelEntry:
        return self.entry


def _engine(tmp_path: Path, **config: int) -> tuple[Engine, ModelEntry]:
    tokenizer = Tokenizer.from_path(qwen_files())
    entry = ModelEntry("m", tokenizer, "path", 0, ChatPromptCache(tokenizer))
    settings = EngineConfig(**{"offload_chars": 4096, "fast_encoder_after": 0, **config})
    engine = Engine(Router(WorkerRegistry(), lambda role: make_policy()), _Catalog(entry), config=settings)  # type: ignore[arg-type]
    return engine, entry


_REAL_BUILD = Tokenizer.fast_bpe.func  # type: ignore[attr-defined]


def _spy_on_builds() -> list[int]:
    """Record the thread of every fast-encoder build (until ``_unspy``)."""
    built_on: list[int] = []

    def spy(self: Tokenizer) -> object:
        built_on.append(threading.get_ident())
        return _REAL_BUILD(self)

    Tokenizer.fast_bpe.func = spy  # type: ignore[attr-defined]
    return built_on


def _unspy() -> None:
    Tokenizer.fast_bpe.func = _REAL_BUILD  # type: ignore[attr-defined]


async def test_long_prompts_build_the_encoder_once_off_the_loop(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path)
    tokenizer = entry.tokenizer
    try:
        built_on = _spy_on_builds()
        short = "hello there " * 10
        assert await engine.encode_prompt(entry, short) == tokenizer.backend.encode(short).ids
        assert not built_on and not tokenizer.fast_bpe_ready  # short prompts never pay for it
        long = "alpha river stone light " * 400
        want = tokenizer.backend.encode(long).ids
        assert await engine.encode_prompt(entry, long) == want
        for _ in range(200):
            if tokenizer.fast_bpe_ready:
                break
            await asyncio.sleep(0.05)
        assert tokenizer.fast_bpe_ready and tokenizer.fast_bpe is not None
        assert await engine.encode_prompt(entry, long + " again") == tokenizer.backend.encode(long + " again").ids
        messages = [{"role": "user", "content": long}]
        text, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert ids == tokenizer.backend.encode(text, add_special_tokens=False).ids
        assert len(built_on) == 1 and built_on[0] != threading.get_ident()  # off the event loop
    finally:
        _unspy()
        engine.close()


async def test_the_nth_short_prompt_builds_the_encoder_once_off_the_loop(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path, fast_encoder_after=5)
    tokenizer = entry.tokenizer
    try:
        built_on = _spy_on_builds()
        messages = [{"role": "user", "content": "hello there, how are you"}]
        for n in range(4):  # chat renders and plain prompts both count
            if n % 2:
                await engine.encode_prompt(entry, f"short prompt {n}")
            else:
                await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        await asyncio.sleep(0.05)
        assert not built_on and not tokenizer.fast_bpe_ready
        text, ids = await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None)
        assert ids == tokenizer.backend.encode(text, add_special_tokens=False).ids  # HF serves meanwhile
        for _ in range(200):
            if tokenizer.fast_bpe_ready:
                break
            await asyncio.sleep(0.05)
        assert tokenizer.fast_bpe_ready and tokenizer.fast_bpe is not None
        for _ in range(10):  # built once, not again
            assert await engine.render_chat(entry, messages, tools=None, chat_template_kwargs=None) == (text, ids)
        assert len(built_on) == 1 and built_on[0] != threading.get_ident()
    finally:
        _unspy()
        engine.close()


async def test_zero_builds_only_at_a_long_prompt(tmp_path: Path) -> None:
    engine, entry = _engine(tmp_path, fast_encoder_after=0)
    try:
        for n in range(300):
            await engine.encode_prompt(entry, f"short prompt {n}")
        await asyncio.sleep(0.05)
        assert not entry.tokenizer.fast_bpe_ready and not engine._building
    finally:
        engine.close()


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="fast_encoder_after"):
        EngineConfig(fast_encoder_after=-1)
