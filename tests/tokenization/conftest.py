"""Session fixtures: the real Qwen3 tokenizer, and transformers' tokenizer for the same
files as the reference, each loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.tokenization import Tokenizer

from .helpers import qwen_files


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return qwen_files()


@pytest.fixture(scope="session")
def qwen(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_path(qwen_dir, name="Qwen/Qwen3-0.6B")


@pytest.fixture(scope="session")
def hf_qwen(qwen_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_dir)
