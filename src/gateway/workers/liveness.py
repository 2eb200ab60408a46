"""Whether a silent worker still runs: one health probe per worker at a time, shared.

An answer asked for unstreamed says nothing until it is done, so a worker that holds only
such answers sends nothing for as long as they take, and its silence cannot tell a busy
worker from a hung one. Past a check point with nothing heard on any call, the gateway
asks the worker itself. SGLang's ``HealthCheck`` runs a one-token generation through the
scheduler, so a scheduler that hangs cannot answer it, while a busy one takes it into its
next batch. Every answer waiting on one worker shares the probe in flight: the worker gets
one probe, not one per answer. An answered probe is recorded as evidence
(``ProgressTracker.alive``) for every answer that checks later.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from gateway.workers.worker import Worker

_probes: weakref.WeakKeyDictionary[Worker, asyncio.Future[bool]] = weakref.WeakKeyDictionary()


async def answers_probe(worker: Worker, timeout_s: float) -> bool:
    """Whether ``worker`` answers a health probe as healthy within ``timeout_s``; callers
    that ask while a probe is in flight wait for that one (a caller's cancellation leaves
    the probe running for the others)."""
    probe = _probes.get(worker)
    if probe is None or probe.done():
        probe = asyncio.ensure_future(_probe(worker, timeout_s))
        _probes[worker] = probe
    return await asyncio.shield(probe)


async def _probe(worker: Worker, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):  # also where a transport ignores its own timeout
            reply = await worker.client.health_check(timeout=timeout_s)
    except Exception:  # a timeout, a failed call, a closed channel: no answer, as the health loop counts it
        return False
    if not reply.healthy:
        return False
    worker.progress.alive(time.monotonic())
    return True
