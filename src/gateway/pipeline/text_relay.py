"""Requests to workers that cannot take token ids, forwarded as text on load only.

An external OpenAI-compatible endpoint (``workers/openai_backend``) gets the client's
request unchanged: there are no token ids to route on and no cache the gateway can
see, so the choice is the least loaded available worker that lists the model (ties go
round the pool), never the token policies. The worker's load slot is held from the
moment the request is sent until its answer is read to the end or given up, its
breaker hears how the call went and the progress watchdog hears each piece of the
answer, as for any worker; a call that fails before the answer began is tried once
more on another worker.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Protocol

from gateway.pipeline.errors import map_rpc_error, no_worker_error
from gateway.workers.openai_backend import Upstream
from gateway.workers.registry import WorkerRegistry
from gateway.workers.transport import WorkerCallError
from gateway.workers.watchdog import ProgressTracker
from gateway.workers.worker import Worker

ATTEMPTS = 2  # a refused connection moves to another worker once; then the client hears it


class _Forwards(Protocol):
    models: tuple[str, ...]

    async def forward(self, path: str, body: bytes, request_id: str | None = None) -> Upstream: ...


def _progressed(progress: ProgressTracker) -> None:
    progress.message(time.monotonic())


def takes_text(worker: Worker) -> bool:
    """Whether ``worker`` takes text only (its engine lacks token ids)."""
    return "token_ids" in worker.client.lacks


def _listed(worker: Worker) -> tuple[str, ...]:
    return worker.client.models or (worker.model,)


class TextRelay:
    """Picks and holds the worker of each forwarded request."""

    def __init__(self, registry: WorkerRegistry) -> None:
        self.registry = registry
        self._turn = itertools.count()
        # The text workers, kept from the registry's changes: a fleet of token workers
        # pays one empty check per request, not a scan of every worker.
        self._text: dict[str, Worker] = {w.id: w for w in registry.all() if takes_text(w)}
        registry.subscribe(self._on_change)

    def _on_change(self, event: str, worker: Worker) -> None:
        if event == "added" and takes_text(worker):
            self._text[worker.id] = worker
        elif event == "removed" and self._text.get(worker.id) is worker:
            del self._text[worker.id]

    def _workers(self, model: str) -> list[Worker]:
        return [w for w in self._text.values() if not w.draining and model in _listed(w)]

    def serves(self, model: object) -> bool:
        """Whether requests for ``model`` go to text workers."""
        return bool(self._text) and isinstance(model, str) and bool(self._workers(model))

    def models(self) -> list[str]:
        """Every model the text workers list, once each, in the order first seen."""
        return list(dict.fromkeys(m for w in self._text.values() if not w.draining for m in _listed(w)))

    def pick(self, model: str, exclude: frozenset[str] = frozenset()) -> Worker:
        """The least loaded available text worker for ``model`` (ties: round the pool)."""
        ready = [w for w in self._workers(model) if w.available and w.id not in exclude]
        if not ready:
            raise no_worker_error(f"no available worker for model {model!r}")
        start = next(self._turn) % len(ready)
        ordered = ready[start:] + ready[:start]
        return min(ordered, key=lambda w: w.load.in_flight)

    @asynccontextmanager
    async def relay(self, model: str, path: str, body: bytes, request_id: str | None) -> AsyncIterator[Upstream]:
        """Send ``body`` to a worker for ``model``; the answer is yours inside the block.
        The slot and the breaker's verdict are settled however the block ends."""
        tried: frozenset[str] = frozenset()
        for attempt in range(ATTEMPTS):
            worker = self.pick(model, tried)
            worker.progress.started(time.monotonic(), idle=worker.load.in_flight == 0)
            guard = worker.load.acquire(0, 0)
            worker.breaker.on_dispatch()
            client: _Forwards = worker.client  # type: ignore[assignment]
            try:
                upstream = await client.forward(path, body, request_id)
            except WorkerCallError as exc:
                guard.release()
                worker.record_outcome(False)
                tried |= {worker.id}
                others = any(w.available and w.id not in tried for w in self._workers(model))
                if attempt + 1 < ATTEMPTS and exc.retryable and others:
                    continue
                raise map_rpc_error(exc, worker.id) from None
            except BaseException:
                guard.release()
                worker.record_outcome(None)
                raise
            outcome: bool | None = upstream.status < 500
            worker.progress.message(time.monotonic(), first=True)
            upstream.on_data = partial(_progressed, worker.progress)
            try:
                guard.first_token()
                yield upstream
            except BaseException:
                outcome = None  # the client left or the gateway gave up: says nothing of the worker
                raise
            finally:
                upstream.close()
                guard.release()
                worker.record_outcome(False if upstream.failed else outcome)
            return


__all__ = ["ATTEMPTS", "TextRelay", "takes_text"]
