"""Finding a model's tokenizer: explicit path, local cache, worker, Hugging Face hub.

Synchronous by design. The async caller (workers/) owns the GetTokenizer RPC, so the
usual flow at the call site is::

    resolved = registry.resolve_local(model, path)        # path, then cache
    if resolved is None:
        data, sha256 = await fetch_tokenizer_zip(worker)   # caller's RPC
        folder = registry.install_zip(model, data, sha256)
        resolved = registry.load(model, folder, source="worker")

``resolve`` runs the whole chain in one call for callers that can hand it a blocking
``worker_fetch`` (or none), and falls back to the hub when it is reachable.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import quote

from gateway.tokenization.errors import (
    Attempt,
    TokenizerArchiveError,
    TokenizerLoadError,
    TokenizerNotFound,
)
from gateway.tokenization.tokenizer import TOKENIZER_FILES, ParseFile, Tokenizer

Source = Literal["path", "cache", "worker", "hub"]
WorkerFetch = Callable[[str], tuple[bytes, str]]

# Limits on a worker zip: tokenizer folders are tens of MB at most.
MAX_ZIP_MEMBERS = 64
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
MAX_TOKENIZER_JSON_BYTES = 64 * 1024 * 1024
"""A worker's ``tokenizer.json``, at most (the largest published ones are about half of it):
the gateway's own process builds the BPE model from its vocabulary and merges in one native
call that holds the GIL, so its size bounds how long a worker's tokenizer can stop the loop."""
# File patterns fetched from the hub (never weights).
HUB_PATTERNS: tuple[str, ...] = (*TOKENIZER_FILES, "*.model", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class ResolvedTokenizer:
    """A loaded tokenizer and where it came from."""

    model: str
    tokenizer: Tokenizer
    source: Source
    path: Path
    attempts: tuple[Attempt, ...] = field(default=())  # earlier sources that failed

    @property
    def location(self) -> str:
        """Where the files were loaded from, for logs."""
        return str(self.path)


def cache_dirname(model: str) -> str:
    """A model name as one safe folder name: ``Qwen/Qwen3-8B`` -> ``Qwen--Qwen3-8B``.

    Every character outside ``[A-Za-z0-9._~-]`` is percent-encoded, ``--`` in the name is
    escaped first so ``/`` -> ``--`` stays unambiguous, and a leading dot is encoded so
    the result is never ``.``/``..`` or hidden.
    """
    if not model:
        raise ValueError("model name is empty")
    name = quote(model, safe="").replace("--", "-%2D").replace("%2F", "--")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def _check_member(info: zipfile.ZipInfo) -> PurePosixPath | None:
    """The member's safe relative path, None for a directory entry; raise if unsafe."""
    name = info.filename
    if "\\" in name or "\x00" in name:
        raise TokenizerArchiveError(f"unsafe path in tokenizer zip: {name!r}")
    path = PurePosixPath(name)
    if path.is_absolute() or (path.parts and ":" in path.parts[0]):
        raise TokenizerArchiveError(f"absolute path in tokenizer zip: {name!r}")
    if any(part == ".." for part in path.parts):
        raise TokenizerArchiveError(f"path escapes the folder in tokenizer zip: {name!r}")
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise TokenizerArchiveError(f"symlink in tokenizer zip: {name!r}")
    if info.is_dir():
        return None
    return path


def _tokenizer_root(folder: Path) -> Path:
    """The folder holding tokenizer.json: the top, or a zip's single top-level folder."""
    if (folder / "tokenizer.json").is_file():
        return folder
    subdirs = [p for p in folder.iterdir() if p.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / "tokenizer.json").is_file():
        return subdirs[0]
    return folder


class TokenizerRegistry:
    """Resolves model names to loaded tokenizers and keeps them (one per model)."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        hub_enabled: bool = True,
        hub_timeout_s: float = 5.0,
        hub_endpoint: str | None = None,
        parse: ParseFile | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.parse = parse  # how tokenizer.json files are parsed (``Tokenizer.from_path``)
        self.hub_enabled = hub_enabled
        self.hub_timeout_s = hub_timeout_s
        self.hub_endpoint = hub_endpoint
        self._loaded: dict[tuple[str, str | None], ResolvedTokenizer] = {}
        self._lock = threading.Lock()

    def cache_path(self, model: str) -> Path:
        return self.cache_dir / cache_dirname(model)

    # ------------------------------------------------------------------ loading
    def load(
        self, model: str, path: Path, source: Source, attempts: tuple[Attempt, ...] = ()
    ) -> ResolvedTokenizer:
        """Load the tokenizer at ``path`` (raises ``TokenizerLoadError``)."""
        root = _tokenizer_root(path) if path.is_dir() else path
        tokenizer = Tokenizer.from_path(root, name=model, parse=self.parse)
        return ResolvedTokenizer(model, tokenizer, source, root, attempts)

    def _try(
        self, model: str, path: Path, source: Source, attempts: list[Attempt]
    ) -> ResolvedTokenizer | None:
        if not path.exists():
            attempts.append(Attempt(source, str(path), "does not exist"))
            return None
        try:
            return self.load(model, path, source, tuple(attempts))
        except TokenizerLoadError as exc:
            attempts.append(Attempt(source, str(path), str(exc)))
            return None

    def _local(
        self, model: str, tokenizer_path: str | None, attempts: list[Attempt]
    ) -> ResolvedTokenizer | None:
        if tokenizer_path:
            found = self._try(model, Path(tokenizer_path).expanduser(), "path", attempts)
            if found is not None:
                return found
        return self._try(model, self.cache_path(model), "cache", attempts)

    def resolve_local(
        self, model: str, tokenizer_path: str | None = None
    ) -> ResolvedTokenizer | None:
        """Explicit path, then the cache folder; None if neither holds a tokenizer."""
        key = (model, tokenizer_path)
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
        found = self._local(model, tokenizer_path, [])
        return self._remember(key, found) if found is not None else None

    def _remember(self, key: tuple[str, str | None], found: ResolvedTokenizer) -> ResolvedTokenizer:
        with self._lock:
            return self._loaded.setdefault(key, found)

    def resolve(
        self,
        model: str,
        tokenizer_path: str | None = None,
        worker_fetch: WorkerFetch | None = None,
    ) -> ResolvedTokenizer:
        """Path -> cache -> ``worker_fetch(model)`` (zip bytes, sha256) -> hub.

        Raises ``TokenizerNotFound`` listing every attempt and why it failed.
        """
        key = (model, tokenizer_path)
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
        attempts: list[Attempt] = []
        found = self._local(model, tokenizer_path, attempts)
        if found is None and worker_fetch is not None:
            found = self._from_worker(model, worker_fetch, attempts)
        elif found is None:
            attempts.append(Attempt("worker", "-", "no worker fetch given"))
        if found is None:
            found = self._from_hub(model, attempts)
        if found is None:
            raise TokenizerNotFound(model, attempts)
        return self._remember(key, found)

    def _from_worker(
        self, model: str, worker_fetch: WorkerFetch, attempts: list[Attempt]
    ) -> ResolvedTokenizer | None:
        try:
            data, sha256 = worker_fetch(model)
            folder = self.install_zip(model, data, sha256)
        except Exception as exc:  # the caller's RPC may fail in any way; record why
            attempts.append(Attempt("worker", "GetTokenizer", f"{type(exc).__name__}: {exc}"))
            return None
        return self._try(model, folder, "worker", attempts)

    def install_and_load(self, model: str, data: bytes, sha256: str) -> ResolvedTokenizer:
        """``install_zip`` then ``load`` (source ``"worker"``); the async caller's step 3."""
        folder = self.install_zip(model, data, sha256)
        found = self.load(model, folder, "worker")
        return self._remember((model, None), found)

    def resolve_remote(
        self, model: str, worker_error: str | None = None, tokenizer_path: str | None = None
    ) -> ResolvedTokenizer:
        """The last step when the worker could not send its tokenizer: the hub.

        ``worker_error`` says why the worker fetch failed; it is listed with the path,
        cache and hub attempts in ``TokenizerNotFound`` if the hub fails too.
        """
        attempts: list[Attempt] = []
        found = self._local(model, tokenizer_path, attempts)
        if found is None:
            attempts.append(Attempt("worker", "GetTokenizer", worker_error or "not tried"))
            found = self._from_hub(model, attempts)
        if found is None:
            raise TokenizerNotFound(model, attempts)
        return self._remember((model, tokenizer_path), found)

    # ------------------------------------------------------------------ worker zip
    def install_zip(self, model: str, data: bytes, sha256: str) -> Path:
        """Verify and unpack a GetTokenizer zip into the cache folder, atomically.

        Refuses a sha256 mismatch, absolute or escaping paths, symlinks and oversized
        archives. Unpacks into a temporary folder next to the target and renames it into
        place, so readers never see a half-written tokenizer. Returns the folder.
        """
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256.strip().lower():
            raise TokenizerArchiveError(
                f"tokenizer zip sha256 mismatch: expected {sha256}, got {digest}"
            )
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile as exc:
            raise TokenizerArchiveError(f"not a zip file: {exc}") from exc
        with archive:
            members = archive.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                raise TokenizerArchiveError(f"tokenizer zip has {len(members)} entries")
            if sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
                raise TokenizerArchiveError("tokenizer zip unpacks to more than 512 MiB")
            planned = [(m, _check_member(m)) for m in members]
            for info, rel in planned:
                if rel is not None and rel.name == "tokenizer.json" and info.file_size > MAX_TOKENIZER_JSON_BYTES:
                    raise TokenizerArchiveError(
                        f"tokenizer.json in the tokenizer zip is {info.file_size} bytes, over the "
                        f"{MAX_TOKENIZER_JSON_BYTES} a worker's tokenizer may have"
                    )
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_dir))
            try:
                for info, rel in planned:
                    if rel is None:
                        continue
                    dest = tmp.joinpath(*rel.parts)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out)
                return self._move_into_place(tmp, self.cache_path(model))
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)

    def _move_into_place(self, tmp: Path, target: Path) -> Path:
        """Rename ``tmp`` to ``target``, replacing an older copy without a moment where
        a half-written folder is visible."""
        old: Path | None = None
        if target.exists():
            old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex}")
            os.replace(target, old)
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.exists():  # a concurrent install did not win either: restore
                if old is not None:
                    os.replace(old, target)
                raise
        finally:
            if old is not None and old.exists():
                shutil.rmtree(old, ignore_errors=True)
        with self._lock:  # a new folder for this model: forget the loaded copy
            for key in [k for k in self._loaded if self.cache_path(k[0]) == target]:
                del self._loaded[key]
        return target

    # ------------------------------------------------------------------ hub
    def _from_hub(self, model: str, attempts: list[Attempt]) -> ResolvedTokenizer | None:
        if not self.hub_enabled:
            attempts.append(Attempt("hub", model, "disabled"))
            return None
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            attempts.append(Attempt("hub", model, "offline (HF_HUB_OFFLINE is set)"))
            return None
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            attempts.append(Attempt("hub", model, "huggingface_hub is not installed"))
            return None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-hub-", dir=self.cache_dir))
        outcome: list[BaseException | None] = []

        def download() -> None:
            try:
                snapshot_download(
                    model,
                    local_dir=tmp,
                    allow_patterns=list(HUB_PATTERNS),
                    etag_timeout=self.hub_timeout_s,
                    endpoint=self.hub_endpoint,
                )
                outcome.append(None)
            except Exception as exc:  # network, auth, missing repo: all mean "not from the hub"
                outcome.append(exc)

        # huggingface_hub has no overall deadline (retries, slow DNS), so the download
        # runs in a daemon thread we stop waiting for after hub_timeout_s (a late
        # download then only leaves a hidden .tmp-hub-* folder behind).
        worker = threading.Thread(target=download, name=f"hub-tokenizer-{model}", daemon=True)
        worker.start()
        worker.join(self.hub_timeout_s)
        try:
            if not outcome:
                attempts.append(Attempt("hub", model, f"no answer within {self.hub_timeout_s:g}s"))
                return None
            if (error := outcome[0]) is not None:
                attempts.append(Attempt("hub", model, f"{type(error).__name__}: {error}"))
                return None
            shutil.rmtree(tmp / ".cache", ignore_errors=True)
            if not (tmp / "tokenizer.json").is_file():
                attempts.append(Attempt("hub", model, "the repository has no tokenizer.json"))
                return None
            folder = self._move_into_place(tmp, self.cache_path(model))
        finally:
            if outcome and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return self._try(model, folder, "hub", attempts)
