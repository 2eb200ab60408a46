"""Tokenizer registry: path -> cache -> worker zip -> hub, and safe zip installation."""

from __future__ import annotations

import functools
import hashlib
import io
import socket
import stat
import time
import zipfile
from pathlib import Path

import pytest

from gateway.tokenization import (
    TokenizerArchiveError,
    TokenizerNotFound,
    TokenizerRegistry,
    cache_dirname,
)

MODEL = "Qwen/Qwen3-0.6B"


def make_zip(files: dict[str, bytes], *, symlink: str | None = None) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@functools.cache
def qwen_zip(qwen_dir: Path, prefix: str = "") -> tuple[bytes, str]:
    """What a worker's GetTokenizer sends: its tokenizer files, zipped (built once)."""
    names = ("tokenizer.json", "tokenizer_config.json")
    return make_zip({prefix + name: (qwen_dir / name).read_bytes() for name in names})


@pytest.fixture
def registry(tmp_path: Path) -> TokenizerRegistry:
    return TokenizerRegistry(tmp_path / "cache", hub_enabled=False)


def test_cache_dirname_is_safe_and_unambiguous() -> None:
    assert cache_dirname("Qwen/Qwen3-8B") == "Qwen--Qwen3-8B"
    assert cache_dirname("a--b") != cache_dirname("a/b")
    assert cache_dirname("..") == "%2E."
    assert "/" not in cache_dirname("../../etc/passwd")
    assert cache_dirname("name with spaces") == "name%20with%20spaces"
    with pytest.raises(ValueError):
        cache_dirname("")


def test_explicit_folder_or_file_wins(registry: TokenizerRegistry, qwen_dir: Path) -> None:
    folder = registry.resolve(MODEL, str(qwen_dir))
    assert (folder.source, folder.path) == ("path", qwen_dir)
    assert folder.tokenizer.eos_token_ids == {151645}
    as_file = registry.resolve(MODEL, str(qwen_dir / "tokenizer.json"))
    assert as_file.source == "path" and as_file.location.endswith("tokenizer.json")
    assert registry.resolve(MODEL, str(qwen_dir)) is folder  # loaded once, then kept


def test_worker_zip_then_cache(registry: TokenizerRegistry, qwen_dir: Path) -> None:
    assert registry.resolve_local(MODEL) is None
    calls: list[str] = []

    def fetch(model: str) -> tuple[bytes, str]:
        calls.append(model)
        return qwen_zip(qwen_dir)

    resolved = registry.resolve(MODEL, worker_fetch=fetch)
    assert resolved.source == "worker" and calls == [MODEL]
    assert resolved.path == registry.cache_path(MODEL)
    assert resolved.tokenizer.encode("hi", add_special_tokens=False) == [6023]
    # A fresh registry (a restart) finds it in the cache without asking the worker.
    again = TokenizerRegistry(registry.cache_dir, hub_enabled=False).resolve(MODEL)
    assert again.source == "cache"
    assert [a.source for a in again.attempts] == []


def test_async_caller_flow(registry: TokenizerRegistry, qwen_dir: Path) -> None:
    """resolve_local -> (caller fetches) -> install_and_load, as workers/ does it."""
    assert registry.resolve_local(MODEL, "/nonexistent/tokenizer") is None
    data, sha = qwen_zip(qwen_dir, prefix="Qwen3/")  # a single top-level folder is fine
    resolved = registry.install_and_load(MODEL, data, sha)
    assert resolved.source == "worker"
    assert (resolved.path / "tokenizer.json").is_file()
    assert registry.resolve_local(MODEL) is not None


def test_the_registry_parses_with_the_parse_it_was_given(tmp_path: Path, qwen_dir: Path) -> None:
    """The catalog gives its registry a parse that runs in a child process; every load uses it."""
    from tokenizers import Tokenizer as BackendTokenizer

    parsed: list[Path] = []

    def parse(json_file: Path) -> BackendTokenizer:
        parsed.append(json_file)
        return BackendTokenizer.from_file(str(json_file))

    registry = TokenizerRegistry(tmp_path, hub_enabled=False, parse=parse)
    data, sha = qwen_zip(qwen_dir)
    resolved = registry.install_and_load(MODEL, data, sha)
    assert parsed == [resolved.path / "tokenizer.json"]
    assert resolved.tokenizer.encode("hi", add_special_tokens=False) == [6023]


def test_zip_replaces_an_older_copy_atomically(registry: TokenizerRegistry, qwen_dir: Path) -> None:
    old, old_sha = make_zip({"stale.txt": b"old"})
    registry.install_zip(MODEL, old, old_sha)
    folder = registry.install_zip(MODEL, *qwen_zip(qwen_dir))
    assert not (folder / "stale.txt").exists() and (folder / "tokenizer.json").is_file()
    leftovers = [p.name for p in registry.cache_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize(
    ("files", "symlink", "message"),
    [
        ({"../evil.json": b"x"}, None, "escapes the folder"),
        ({"a/../../evil.json": b"x"}, None, "escapes the folder"),
        ({"/etc/evil.json": b"x"}, None, "absolute path"),
        ({"C:/evil.json": b"x"}, None, "absolute path"),
        ({"dir\\evil.json": b"x"}, None, "unsafe path"),
        ({"tokenizer.json": b"{}"}, "link", "symlink"),
    ],
)
def test_unsafe_zips_are_refused(
    registry: TokenizerRegistry, files: dict[str, bytes], symlink: str | None, message: str
) -> None:
    data, sha = make_zip(files, symlink=symlink)
    with pytest.raises(TokenizerArchiveError, match=message):
        registry.install_zip(MODEL, data, sha)
    assert not registry.cache_path(MODEL).exists()
    assert not (registry.cache_dir.parent / "evil.json").exists()


def test_checksum_and_format_are_checked(registry: TokenizerRegistry, qwen_dir: Path) -> None:
    data, sha = qwen_zip(qwen_dir)
    with pytest.raises(TokenizerArchiveError, match="sha256 mismatch"):
        registry.install_zip(MODEL, data, "0" * 64)
    assert registry.install_zip(MODEL, data, sha.upper()).is_dir()  # hex case does not matter
    with pytest.raises(TokenizerArchiveError, match="not a zip"):
        registry.install_zip(MODEL, b"junk", hashlib.sha256(b"junk").hexdigest())


def test_not_found_lists_every_attempt(tmp_path: Path) -> None:
    registry = TokenizerRegistry(tmp_path / "cache", hub_enabled=False)

    def failing_fetch(model: str) -> tuple[bytes, str]:
        raise ConnectionError("worker unreachable")

    with pytest.raises(TokenizerNotFound) as caught:
        registry.resolve(MODEL, str(tmp_path / "nope"), worker_fetch=failing_fetch)
    attempts = caught.value.attempts
    assert [a.source for a in attempts] == ["path", "cache", "worker", "hub"]
    assert "does not exist" in attempts[0].reason
    assert "worker unreachable" in attempts[2].reason
    assert attempts[3].reason == "disabled"
    assert "Qwen/Qwen3-0.6B" in str(caught.value) and "worker unreachable" in str(caught.value)


def test_a_bad_worker_zip_is_reported(registry: TokenizerRegistry) -> None:
    data, sha = make_zip({"readme.txt": b"no tokenizer here"})
    with pytest.raises(TokenizerNotFound) as caught:
        registry.resolve(MODEL, worker_fetch=lambda model: (data, sha))
    worker = next(a for a in caught.value.attempts if a.source == "worker")
    assert "no tokenizer.json" in worker.reason


def test_hub_offline_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    registry = TokenizerRegistry(tmp_path / "cache")
    with pytest.raises(TokenizerNotFound) as caught:
        registry.resolve_remote(MODEL, worker_error="UNAVAILABLE")
    reasons = {a.source: a.reason for a in caught.value.attempts}
    assert reasons["worker"] == "UNAVAILABLE"
    assert reasons["hub"].startswith("offline")


def test_unreachable_hub_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub endpoint nobody listens on (loopback, closed port) is one failed attempt."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    registry = TokenizerRegistry(
        tmp_path / "cache", hub_timeout_s=2.0, hub_endpoint=f"http://127.0.0.1:{port}"
    )
    started = time.monotonic()
    with pytest.raises(TokenizerNotFound) as caught:
        registry.resolve(MODEL)
    assert time.monotonic() - started < 5
    hub = caught.value.attempts[-1]
    assert hub.source == "hub" and hub.reason


def test_an_oversized_tokenizer_json_from_a_worker_is_refused(registry: TokenizerRegistry) -> None:
    from gateway.tokenization.registry import MAX_TOKENIZER_JSON_BYTES

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:  # a few hundred KB on the wire
        archive.writestr("model/tokenizer.json", b" " * (MAX_TOKENIZER_JSON_BYTES + 1))
        archive.writestr("model/tokenizer_config.json", b"{}")
    data = buffer.getvalue()
    with pytest.raises(TokenizerArchiveError, match=r"tokenizer\.json in the tokenizer zip is"):
        registry.install_zip(MODEL, data, hashlib.sha256(data).hexdigest())
    assert not registry.cache_path(MODEL).exists()
