"""The one load counter per worker, and the guard that gives a slot back.

Every request that reaches a worker holds a ``LoadGuard``. The guard is released
exactly once, whichever way the request ends (stream end, worker error, client
disconnect, cancellation), so in-flight figures cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerLoad:
    """What the gateway itself has outstanding on one worker."""

    in_flight: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens sent, no first token back yet
    running_decode_tokens: int = 0  # max_new_tokens owed by requests past prefill
    total_requests: int = 0
    silent: int = 0  # of ``in_flight``: whole answers asked for unstreamed (no message until done)

    def acquire(self, prompt_tokens: int, max_new_tokens: int, *, silent: bool = False) -> LoadGuard:
        self.in_flight += 1
        self.total_requests += 1
        self.queued_prefill_tokens += prompt_tokens
        if silent:
            self.silent += 1
        return LoadGuard(self, prompt_tokens, max_new_tokens, silent)


class LoadGuard:
    """Moves a request's weight from "prefill queued" to "decoding" to "gone"."""

    __slots__ = ("_decode", "_load", "_prefill", "_silent", "released")

    def __init__(self, load: WorkerLoad, prompt_tokens: int, max_new_tokens: int, silent: bool = False) -> None:
        self._load = load
        self._prefill = prompt_tokens
        self._decode = max_new_tokens
        self._silent = silent
        self.released = False

    def first_token(self) -> None:
        """The worker finished this request's prefill."""
        if self.released or self._prefill == 0:
            return
        self._load.queued_prefill_tokens -= self._prefill
        self._prefill = 0
        self._load.running_decode_tokens += self._decode

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        load = self._load
        load.in_flight -= 1
        if self._silent:
            load.silent -= 1
        if self._prefill:
            load.queued_prefill_tokens -= self._prefill
        else:
            load.running_decode_tokens -= self._decode

    def __enter__(self) -> LoadGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
