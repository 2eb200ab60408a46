"""A supervised helper process that holds the whole tokenizers of models that joined at run time.

A model that joins a serving process gets a tokenizer without its BPE merges
(``tokenization.backend_parts.merges_later``): tiktoken encodes ASCII and Latin text, and
the merges' native build (``models.BPE(vocab, merges)``) holds the GIL for hundreds of
milliseconds, so a thread cannot keep it away from the event loop. ``TokenizerHelper``
spawns one process (not forked: this one has threads) that builds the whole tokenizer from
the same parts when the model joins (``attach``, run off the loop) and then encodes the
texts tiktoken does not take (CJK, Cyrillic, emoji, special-token strings read as text):
a round trip of tens of microseconds over a pipe, a batch of texts per call. The serving
process never builds the merges of such a model.

The caller's thread sends and waits itself, one call at a time (the helper encodes one
batch at a time anyway): a ``ProcessPoolExecutor`` in its place costs this process more
than ten times the CPU per call (its feeder and result threads, and their wake-ups).

Supervision: at most ``max_pending`` calls wait for the helper at once (more are refused
with a 503); a call that takes longer than ``timeout_s`` kills the helper; a helper that
dies (killed, out of memory) fails the call it held with a 503 naming it, and the next
call starts a new one, which builds every held tokenizer again before it takes encodes.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import multiprocessing
import os
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from gateway.protocol.errors import ServiceUnavailableError
from gateway.tokenization import Tokenizer
from gateway.tokenization.backend_parts import (
    BackendParts,
    deferred_parts,
    elsewhere,
    encode_elsewhere,
)
from gateway.tokenization.held_tokenizers import encode_held, hold, release, unpack, unreached
from gateway.tokenization.vocabulary_table import table_of

log = logging.getLogger(__name__)

MAX_PENDING = 256
"""Calls waiting for the helper at once: each holds a thread of this process (the tokenize
pool's, or the event loop's for a token look-up) until the helper answers."""
TIMEOUT_S = 30.0
"""Longest an encode may take in the helper before it is taken as stuck and killed (a
megabyte of CJK text encodes in well under a second)."""
HOLD_TIMEOUT_S = 120.0
"""Longest the helper may take to build one model's tokenizer (seconds on a busy host)."""

_CALLS: dict[str, Callable[..., Any]] = {"hold": hold, "encode": encode_held, "release": release, "unreached": unreached}


def serve_helper(conn: Connection) -> None:
    """The helper process: answer each ``(call, *args)`` with ``("ok", result)`` or
    ``("error", repr)`` until the pipe closes. Its batch encodes run on one thread: on a host
    of two cores, ``tokenizers``' thread pool would take both from the serving process."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    while True:
        try:
            name, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", _CALLS[name](*args))
        except Exception as exc:  # answered, not fatal: the caller turns it into a 503
            answer = ("error", repr(exc))
        conn.send(answer)


def _set_in_steps(ids: array[int]) -> set[int]:
    """``ids`` as a set, a few thousand at a time (a vocabulary may have a hundred thousand
    such pieces: one native call for all of them would hold the GIL for tens of ms)."""
    found: set[int] = set()
    for start in range(0, len(ids), 8192):
        found.update(ids[start : start + 8192])
    return found


class HelperFailed(ServiceUnavailableError):
    """503: the tokenizer helper process failed this call (died, stuck, or refused it)."""

    code = "tokenizer_helper_failed"


class _Process:
    """One spawned helper process and this end of its pipe."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # not forked: this process has threads
        self.conn, child = ctx.Pipe()
        self.process: BaseProcess = ctx.Process(target=serve_helper, args=(child,), name="tokenizer-helper", daemon=True)
        self.process.start()
        child.close()

    def call(self, message: tuple[Any, ...], timeout_s: float) -> tuple[str, Any]:
        """Send ``message`` and wait for the answer; TimeoutError when it takes longer than
        ``timeout_s``, EOFError or OSError when the process is gone."""
        self.conn.send(message)
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        answer: tuple[str, Any] = self.conn.recv()
        return answer

    def stop(self) -> None:
        self.conn.close()
        self.process.kill()
        self.process.join(5)


class TokenizerHelper:
    """The helper process of one serving process, and the tokenizers it holds."""

    def __init__(
        self, *, max_pending: int = MAX_PENDING, timeout_s: float = TIMEOUT_S, hold_timeout_s: float = HOLD_TIMEOUT_S,
    ) -> None:
        if max_pending < 1 or timeout_s <= 0 or hold_timeout_s <= 0:
            raise ValueError("max_pending must be >= 1 and the timeouts > 0")
        self.max_pending, self.timeout_s, self.hold_timeout_s = max_pending, timeout_s, hold_timeout_s
        self._lock = threading.Lock()  # one call on the pipe at a time
        self._count_lock = threading.Lock()
        self._pending = 0
        self._helper: _Process | None = None
        self._held: dict[str, tuple[BackendParts, Any]] = {}  # key -> (parts, post-processor): built again after a restart
        self._keys = itertools.count(1)
        self._gone: collections.deque[str] = collections.deque()  # held tokenizers collected since the last call
        self._closed = False
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        """The helper process's id while one runs."""
        helper = self._helper
        return helper.process.pid if helper is not None else None

    # ------------------------------------------------------------------ models
    def attach(self, tokenizer: Tokenizer) -> bool:
        """Have the helper build the whole tokenizer of ``tokenizer`` (one whose merges were put
        off) and encode its texts from now on; blocks until it is built (call it off the event
        loop, before the model takes traffic). False when there is nothing to hold, or the
        helper could not build it: the merges are then built here when first needed, as before."""
        backend = tokenizer.backend
        parts = deferred_parts(backend)
        if parts is None or elsewhere(backend) is not None:
            return False
        key = f"m{next(self._keys)}"
        post = backend.post_processor
        try:
            self._call(("hold", key, parts, post), self.hold_timeout_s)
        except Exception as exc:  # no process here, or it failed: the merges are built here later
            log.warning("tokenizer %s: the helper process could not build it (%s); its merges stay here", tokenizer.name, exc)
            return False
        with self._lock:
            self._held[key] = (parts, post)
        encode_elsewhere(backend, functools.partial(self.encode, key))
        weakref.finalize(backend, self._release, key)
        table = table_of(backend)
        if table is not None:  # so that token look-ups are answered here, not over the pipe
            try:
                found = array("I")
                found.frombytes(self._call(("unreached", key), self.hold_timeout_s))
                table.unreached = _set_in_steps(found)
            except Exception as exc:  # look-ups of vocabulary pieces are then asked of the helper
                log.warning("tokenizer %s: the helper could not tell its unreached pieces (%s)", tokenizer.name, exc)
        log.info("tokenizer %s: its merges are built in the helper process %s, not here", tokenizer.name, self.pid)
        return True

    def _release(self, key: str) -> None:
        """Called when a held tokenizer's backend is collected (in whatever thread the
        collector runs, maybe inside a call): noted only; the next call tells the helper."""
        self._gone.append(key)

    def encode(self, key: str, texts: Sequence[str], add_special_tokens: bool, plain: bool) -> list[list[int]]:
        """``backend_parts.EncodeMany`` for the tokenizer held as ``key``."""
        packed = self._call(("encode", key, list(texts), add_special_tokens, plain), self.timeout_s)
        return unpack(packed)

    # ------------------------------------------------------------------ the process
    def _call(self, message: tuple[Any, ...], timeout_s: float) -> Any:
        """``message``'s answer from the helper (started, with every held tokenizer built
        again, when none runs); a 503 when too many calls wait, or the helper fails this one."""
        with self._count_lock:
            if self._pending >= self.max_pending:
                raise HelperFailed(
                    f"the tokenizer helper process has {self._pending} calls waiting; try again",
                    code="tokenizer_busy", retry_after=1.0,
                )
            self._pending += 1
        try:
            with self._lock:
                helper = self._running()
                try:
                    status, value = helper.call(message, timeout_s)
                except TimeoutError as exc:
                    self._drop("stuck: killed")
                    raise HelperFailed(
                        f"the tokenizer helper process did not answer in {timeout_s:g} s; it was restarted, try again",
                        retry_after=1.0,
                    ) from exc
                except (EOFError, OSError) as exc:
                    self._drop("died")
                    raise HelperFailed(
                        "the tokenizer helper process died while it held this request's text; it was restarted, try again",
                        retry_after=1.0,
                    ) from exc
        finally:
            with self._count_lock:
                self._pending -= 1
        if status != "ok":
            raise HelperFailed(f"the tokenizer helper process could not do it: {value}", retry_after=1.0)
        return value

    def _running(self) -> _Process:
        """The running helper, started if there is none (under ``_lock``): a new one builds
        every held tokenizer before it takes anything else."""
        if self._closed:
            raise HelperFailed("the gateway is shutting down", code="shutting_down")
        while self._gone:
            gone = self._gone.popleft()
            self._held.pop(gone, None)
            if self._helper is not None and self._helper.process.is_alive():
                try:
                    self._helper.call(("release", gone), self.timeout_s)
                except (TimeoutError, EOFError, OSError):  # its answer may come later: the pipe is out of step
                    self._drop("failed to release a tokenizer")
        if self._helper is not None and self._helper.process.is_alive():
            return self._helper
        if self._helper is not None:
            self._drop("died")
        helper = self._helper = _Process()
        for key, (parts, post) in self._held.items():
            try:
                status, value = helper.call(("hold", key, parts, post), self.hold_timeout_s)
            except (TimeoutError, EOFError, OSError) as exc:
                self._drop("failed to build a tokenizer again")
                raise HelperFailed("the tokenizer helper process failed to start; try again", retry_after=1.0) from exc
            if status != "ok":
                log.warning("tokenizer helper: building %s again failed: %s", key, value)
        return helper

    def _drop(self, why: str) -> None:
        """Stop the running helper (under ``_lock``); the next call starts another."""
        helper, self._helper = self._helper, None
        if helper is None:
            return
        self.restarts += 1
        log.warning("tokenizer helper process %s %s; the next call starts another", helper.process.pid, why)
        helper.stop()

    def close(self) -> None:
        """Stop the helper (at shutdown); calls after this fail with a 503."""
        with self._lock:
            self._closed = True
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.stop()
