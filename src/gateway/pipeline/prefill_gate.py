"""The prefill gate's waiting: hold a request until the request it shares a prefix with
has been prefilled on the chosen worker.

The rule (who waits, for whom) is ``policies.prefill_gate``; this module owns the
events. Every request sent to a worker (``dispatch.open_on``) is registered as *in
prefill* with its packed prompt until its first message arrives or its attempt ends
in any other way (worker error, stall, timeout, cancellation, the client going away):
``dispatch.open_on`` calls :meth:`PrefillHolds.prefilled` in a ``finally``, which sets
the event of anyone waiting on it. A request routed to a worker where the rule finds a
blocker waits on that blocker's event *after* taking its lease there (so it counts as
that worker's load while it waits), bounded by :meth:`PrefillHolds.timeout_s` (a
multiple of the expected prefill time of the worker's queue at its learned prefill
rate, capped), then is sent to the same worker (its prefix is cached there now, or the
wait timed out), or fails over through the retry loop if the worker left rotation
meanwhile. A request waits at most once per attempt; a cancelled wait sends nothing and
gives the lease back; the admission slot is the caller's and stays held. Holds are only
taken while the running slots of the worker are not all taken by requests sent to it
(``prefill_gate_free_slot_only``): see ``policies.prefill_gate.slot_free``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Protocol

from gateway.policies.base import Decision
from gateway.policies.prefill_gate import (
    DEFAULT_MIN_GAIN_TOKENS,
    PrefillGate,
    Prefilling,
    slot_free,
)
from gateway.settings import option
from gateway.workers.worker import Worker


class PrefillShare(Protocol):
    """The siblings of one ``serve --processes N`` set (``sync.host_prefill``): they hear of
    this process's requests in prefill, and ``poll`` brings theirs into this gate."""

    def sent(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None: ...

    def done(self, key: int) -> None: ...

    def ended(self, key: int) -> None: ...

    def poll(self) -> int: ...


SHARE_POLL_S = 0.002  # while a request waits on a sibling's request: how often the siblings' ends are read


class Selection(Protocol):
    """What the gate reads of a ``router.Selection`` (a protocol: the router owns the gate)."""

    @property
    def worker(self) -> Worker: ...

    @property
    def decision(self) -> Decision: ...

    @property
    def role(self) -> str: ...

    @property
    def prompt(self) -> bytes: ...


@dataclass
class PrefillGateConfig:
    prefill_gate: bool = option(True, "hold a request while a request sharing its prefix is still in prefill on the chosen worker (dispatched, no first token yet), then send it: the prefix is computed once, not once per request admitted into the same batch")
    prefill_gate_free_slot_only: bool = option(True, "prefill gate: hold only while the worker's running slots are not all spoken for (the requests sent to it, not those held for it, below the max_running_requests it reports; no limit when it reports none): then the blocker is being prefilled now and the hold is short; behind a full worker a hold costs the request its place in the queue")
    prefill_gate_min_tokens: int = option(DEFAULT_MIN_GAIN_TOKENS, "prefill gate: hold only when the wait would make at least this many more prompt tokens cached (whole pages)")
    prefill_gate_factor: float = option(2.0, "prefill gate: hold at most this multiple of the expected prefill time of the worker's queue (queued prompt tokens / its learned prefill rate)")
    prefill_gate_min_s: float = option(0.5, "prefill gate: the shortest hold allowed, seconds (the learned rate may still be noise)")
    prefill_gate_max_s: float = option(30.0, "prefill gate: the longest hold ever, seconds")
    prefill_gate_default_tps: float = option(4000.0, "prefill gate: prefill rate assumed (tokens/s) until the worker's own rate is learned")

    def __post_init__(self) -> None:
        if self.prefill_gate_min_tokens < 1:
            raise ValueError("prefill_gate_min_tokens must be >= 1")
        if self.prefill_gate_factor <= 0 or self.prefill_gate_default_tps <= 0:
            raise ValueError("prefill_gate_factor and prefill_gate_default_tps must be > 0")
        if not 0 <= self.prefill_gate_min_s <= self.prefill_gate_max_s:
            raise ValueError("need 0 <= prefill_gate_min_s <= prefill_gate_max_s")


def hold_timeout_s(queued_prefill_tokens: int, prefill_tps: float | None, config: PrefillGateConfig) -> float:
    """The longest hold on a worker with ``queued_prefill_tokens`` prompt tokens that have no
    first token yet (the blocker among them) and a learned prefill rate (None: not learned):
    ``factor`` times the time to prefill that queue, within [min_s, max_s]."""
    rate = prefill_tps or config.prefill_gate_default_tps
    expected = queued_prefill_tokens / rate
    return min(config.prefill_gate_max_s, max(config.prefill_gate_min_s, config.prefill_gate_factor * expected))


@dataclass(slots=True)
class GateStats:
    """What the gate did for one (model, pool)."""

    held: int = 0  # requests that waited
    released: int = 0  # ... and were released by their blocker's first token or ending
    timed_out: int = 0  # ... and were released by the timeout
    cancelled: int = 0  # ... and were cancelled while waiting (client gone, shutdown)
    hold_s: float = 0.0  # total time waited
    gained_tokens: int = 0  # predicted tokens the waits were to turn into cache hits
    waiting: int = 0  # waiting now


@dataclass(frozen=True, slots=True)
class Hold:
    """A request the rule says should wait, and for whom."""

    blocker: Prefilling
    gain_tokens: int
    timeout_s: float


class PrefillHolds:
    """In-prefill requests of every pool and the events their waiters wait on."""

    def __init__(self) -> None:
        self.rule = PrefillGate()
        self._events: dict[int, asyncio.Event] = {}
        self._keys = itertools.count(1)
        self.stats: dict[tuple[str, str], GateStats] = {}
        self._held: dict[str, int] = {}  # worker id -> requests held for it now (not sent yet)
        self.share: PrefillShare | None = None  # serve --processes N: the siblings' requests in prefill
        self._remote_waits = 0  # requests waiting on a sibling's request now
        self._ticker: asyncio.Task[None] | None = None

    def remote_sent(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None:
        """A sibling's request (``key`` below zero) is in prefill on ``worker_id``: it blocks as ours do."""
        self.rule.add(key, worker_id, prompt, cached)

    def on_worker(self, worker: Worker) -> int:
        """The requests on ``worker`` besides the one being checked (whose lease is taken):
        this process's in flight there less the requests held for it, the same-host
        siblings' sent and not ended (their rings, as of the last poll) and other replicas'
        (the bus). A held request is not on the worker yet, whichever process holds it;
        one sent now past it takes a free slot at once, in the same batch as its blocker."""
        return (worker.load.in_flight - 1 - self.held_on(worker.id)
                + worker.sibling_in_flight + worker.peer_in_flight)

    def held_on(self, worker_id: str) -> int:
        """Requests waiting for a blocker on ``worker_id`` now: counted in its in-flight load,
        not yet on the worker."""
        return self._held.get(worker_id, 0)

    def dispatched(self, selection: Selection) -> int:
        """``selection``'s request was sent: it is in prefill until :meth:`prefilled` (returns its key; 0: not tracked)."""
        if not selection.prompt or selection.role == "decode":
            return 0
        key = next(self._keys)
        cached = selection.decision.predicted_cached_tokens
        self.rule.add(key, selection.worker.id, selection.prompt, cached)
        if self.share is not None:
            self.share.sent(key, selection.worker.id, selection.prompt, cached)
        return key

    def prefilled(self, key: int) -> None:
        """The request ``key`` got its first message or ended otherwise: release its waiters."""
        if not key:
            return
        self.rule.remove(key)
        if key > 0 and self.share is not None:
            self.share.done(key)
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def ended(self, key: int) -> None:
        """The request ``key`` is no longer on its worker (its lease ended): the siblings stop
        counting it there."""
        if key > 0 and self.share is not None:
            self.share.ended(key)

    def timeout_s(self, selection: Selection, config: PrefillGateConfig) -> float:
        """The longest this request may wait on the selected worker: its queue is this
        process's prompts in prefill there and the same-host siblings' (a sibling's blocker
        waits behind the sibling's requests too)."""
        worker = selection.worker
        queued = worker.load.queued_prefill_tokens + worker.sibling_queued_prompt_tokens
        return hold_timeout_s(queued, worker.progress.prefill_tps, config)

    def check(self, selection: Selection, config: PrefillGateConfig) -> Hold | None:
        """Whether the selected request should wait (the rule, with this gate's settings)."""
        decision = selection.decision
        if not config.prefill_gate or not selection.prompt or selection.role == "decode":
            return None
        worker = selection.worker
        if self.share is not None:
            self.share.poll()  # the siblings' requests in prefill, as of now
        if config.prefill_gate_free_slot_only and not slot_free(self.on_worker(worker), worker.info.max_running_requests):
            return None
        found = self.rule.blocker(
            selection.worker.id, selection.prompt, decision.predicted_cached_tokens,
            min_gain_tokens=config.prefill_gate_min_tokens, page=max(1, selection.worker.info.page_size),
        )
        if found is None:
            return None
        return Hold(found[0], found[1], self.timeout_s(selection, config))

    def pool_stats(self, model: str, role: str) -> GateStats:
        st = self.stats.get((model, role))
        if st is None:
            st = self.stats[(model, role)] = GateStats()
        return st

    async def wait(self, hold: Hold, model: str, role: str) -> bool:
        """Wait for ``hold``'s blocker (True) or its timeout (False); re-raises cancellation."""
        key = hold.blocker.key
        if key not in self.rule:
            return True  # it got its first token already
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        st = self.pool_stats(model, role)
        wid = hold.blocker.worker_id
        self._held[wid] = self._held.get(wid, 0) + 1
        st.held += 1
        st.gained_tokens += hold.gain_tokens
        st.waiting += 1
        started = time.monotonic()
        remote = key < 0 and self.share is not None
        if remote:
            self._remote_waits += 1
            if self._ticker is None or self._ticker.done():
                self._ticker = asyncio.get_running_loop().create_task(self._hear_siblings())
        try:
            async with asyncio.timeout(hold.timeout_s):
                await event.wait()
        except TimeoutError:
            st.timed_out += 1
            return False
        except asyncio.CancelledError:
            st.cancelled += 1
            raise
        finally:
            if remote:
                self._remote_waits -= 1
            st.waiting -= 1
            left = self._held[wid] - 1
            if left:
                self._held[wid] = left
            else:
                del self._held[wid]
            st.hold_s += time.monotonic() - started
        st.released += 1
        return True

    async def _hear_siblings(self) -> None:
        """While a request waits on a sibling's request: read the siblings' ends every few ms
        (nothing else reads them while no request is being routed)."""
        while self._remote_waits > 0:
            await asyncio.sleep(SHARE_POLL_S)
            share = self.share
            if share is None:  # shutting down: the holds end by their timeouts or cancellation
                return
            share.poll()
