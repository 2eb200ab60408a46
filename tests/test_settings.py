"""Settings helpers: the tokenizer cache's default folder and the lower-bound check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.server.config import ServerConfig
from gateway.settings import check_at_least, default_tokenizer_cache


def test_the_tokenizer_cache_is_in_the_users_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_tokenizer_cache() == str(tmp_path / "token-gateway" / "tokenizers")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_tokenizer_cache() == str(tmp_path / "home" / ".cache" / "token-gateway" / "tokenizers")
    assert Path(ServerConfig().tokenizer_cache_dir).is_absolute()


def test_check_at_least_names_the_flag() -> None:
    @dataclass
    class Limits:
        max_n: int = -5

    with pytest.raises(ValueError, match="--max-n must be at least 1, got -5"):
        check_at_least(Limits(), 1, "max_n")
    check_at_least(Limits(max_n=1), 1, "max_n")
