"""Building a model's fast encoder (pipeline/encoder_build.py): planned in a child process
from the tokenizer's files, built here from the plan; in this process when there are no
files or the child fails."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer

from gateway.pipeline.encoder_build import build_encoder, plan_in_child, start_build
from gateway.tokenization import Tokenizer
from gateway.tokenization.fast_bpe import FastBpePlan
from tests.tokenization.helpers import small_byte_level_tokenizer

TEXTS = ["abc abcab", "hello world, abc!", "L'été à Zürich 東京"]


def _pid(path: str) -> int:
    return os.getpid()


def _fail(path: str) -> FastBpePlan | None:
    raise RuntimeError(f"no plan for {path}")


def _hf(tok: Tokenizer, text: str) -> list[int]:
    ids: list[int] = tok.backend.encode(text, add_special_tokens=False).ids
    return ids


@pytest.fixture
def no_build_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every build of the encoder in this process (``Tokenizer.fast_bpe``)."""
    built: list[str] = []
    real = Tokenizer.fast_bpe.func  # type: ignore[attr-defined]

    def spy(self: Tokenizer) -> object:
        built.append(self.name)
        return real(self)

    monkeypatch.setattr(Tokenizer.fast_bpe, "func", spy)
    return built


def test_the_plan_is_made_in_another_process() -> None:
    assert plan_in_child("unused", _pid) != os.getpid()  # type: ignore[arg-type]


def test_the_encoder_is_planned_in_a_child_and_built_here(tmp_path: Path, no_build_here: list[str]) -> None:
    tok = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "small"), name="small")
    build_encoder(tok)
    assert no_build_here == []  # the vocabulary walk and the self-check ran elsewhere
    assert tok.fast_bpe_ready and tok.fast_bpe is not None
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == _hf(tok, text)


def test_a_failing_child_leaves_the_build_to_this_process(
    tmp_path: Path, no_build_here: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    tok = Tokenizer.from_path(small_byte_level_tokenizer(tmp_path / "small"), name="small")
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline.encoder_build"):
        build_encoder(tok, _fail)
    assert no_build_here == ["small"] and tok.fast_bpe is not None
    assert "no plan for" in caplog.text and "building it in this process" in caplog.text


def test_a_tokenizer_without_files_is_built_in_a_thread_here(tmp_path: Path, no_build_here: list[str]) -> None:
    files = small_byte_level_tokenizer(tmp_path / "small")
    tok = Tokenizer(BackendTokenizer.from_file(str(files / "tokenizer.json")), name="in-memory")
    start_build(tok, _fail).join(30)  # the child is never asked
    assert no_build_here == ["in-memory"] and tok.fast_bpe_ready and tok.fast_bpe is not None
    assert tok.encode(TEXTS[0], add_special_tokens=False) == _hf(tok, TEXTS[0])
