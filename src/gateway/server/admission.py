"""Admission control shared by every front door: concurrency cap, FIFO queue, rate limits.

One ``Admission`` object per gateway. A request holds a slot from the moment it is
admitted until its answer (or stream) ends::

    async with admission.admit(api_key):
        ...

or, when the slot must outlive the handler (a streamed response),
``ticket = await admission.acquire(key)`` and ``ticket.release()`` when done. Both
raise ``GatewayError`` subclasses: 429 ``QueueFullError`` (with a Retry-After hint)
when the queue is full, 408 ``QueueTimeoutError`` after waiting too long, 429
``RateLimitedError`` when the key is over its rate, 503 ``ShuttingDownError`` once
``close()`` was called.

Waiters are served in ``policies.fair_queue`` order: by priority within an API key, and
by weighted fair shares between keys. A waiter whose client leaves gives up its place
at once. The cap is ``--max-concurrent-requests``, and, with ``--fleet-headroom``, the
fleet's own running slots (the sum of its workers' ``max_running_requests``, plus the
headroom per worker): past that, a request sent on would only wait in a worker's
first-come queue, where no share or priority holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gateway.pipeline.worker_gate import CALLER
from gateway.policies.fair_queue import Entry, FairQueue, parse_weights
from gateway.protocol.errors import (
    InvalidRequestError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitedError,
    ShuttingDownError,
)
from gateway.settings import check_at_least, option

ANONYMOUS = "-"
RECENT_S = 30.0
"""A key that asked for a slot this recently shares the cap (``fair_reserve``)."""


@dataclass
class AdmissionConfig:
    max_concurrent_requests: int = option(0, "inference requests processed at once (0: no cap)")
    max_queued_requests: int = option(1024, "requests waiting for a slot beyond the cap; more get 429")
    queue_timeout_s: float = option(30.0, "longest wait for a slot before the request gets 408, seconds")
    rate_limit_per_s: float = option(0.0, "token-bucket refill per API key, requests per second (0: off; without --api-keys all callers share one bucket)")
    rate_limit_burst: int = option(0, "token-bucket size per API key (0: max(1, rate))")
    rate_limit_max_keys: int = option(10000, "API keys whose buckets are remembered (least recently used go first)")
    fleet_headroom: int = option(-1, "also queue in the gateway once the requests in flight reach the fleet's running slots (the sum of its workers' max_running_requests) plus this many per worker, so priorities and key weights decide who runs (-1: off; a worker that reports no max_running_requests turns it off)")
    key_weights: list[str] = option([], "KEY=WEIGHT: an API key's (or its id's) share of admission when requests queue, against the others' (default weight 1)")
    fleet_slot_bound: bool = option(True, "with --fleet-headroom: offer the routing policy a worker whose running slots plus the headroom are all taken only while every worker's are (off: locality decides alone, and requests may wait in a full worker's first-come queue)")
    fleet_slot_wait: bool = option(True, "with --fleet-headroom and the slot bound: a request whose chosen worker has its running slots plus the headroom all taken waits in the gateway for one of that worker's, the waiters of one worker let through in fair order, instead of going to a worker with a free slot and a cold cache (off: the hard bound; a cold prefill where prefill is dear stalls the running requests' decode)")
    fair_reserve: int = option(0, "of the capped slots, this many (per worker with --fleet-headroom, in the fleet cap and in each worker's own slots) are kept for API keys holding less than their weighted share: a light key's request finds a slot at once instead of waiting for a heavy key's to end (the fleet runs that many slots short while every key is at its share)")
    prefill_budget_tokens: int = option(0, "with --fleet-headroom and the worker gate: uncached prompt tokens (the policy's prediction) each worker may have sent and not yet answered with a first token; past that its next request waits in the gateway, where the fair order picks it, instead of queueing behind other keys' cold prefills in the worker's first-come queue; only while the fleet is contended (requests wait for admission, every slot is taken, or more than one API key holds slots), and a request alone on its worker always passes (0: no pacing)")
    gate_share_first: bool = option(False, "with --fleet-headroom and the worker gate: a worker's held requests go to an API key holding less than its weighted share of the fleet first (by default each worker's queue takes turns between the keys waiting on it, whatever each holds of the fleet, so a light key's requests there alternate with a heavy key's)")
    fair_prefill_reserve: bool = option(False, "with --fleet-headroom, the worker gate and --prefill-budget-tokens: while an API key holding less than its weighted share, and fewer slots than another key, is active, that other key's cold prompts (half the budget or more uncached) are let through on all workers but one, and the lighter key's cold prompts are routed to a worker with no cold prefill pending; any key's cold prompt waits in the gate while its worker has one pending (by default a heavy key's cold start may have every worker prefilling one of its prompts, and a light key's cold prompt waits for that step wherever it goes)")
    fair_warm_reroute: bool = option(False, "with --fair-prefill-reserve: the lighter key's warm requests too go to a worker with a running slot free for them when the worker holding their prefix has none (prefilled cold there at once), and only a running slot counts as room, not the headroom past them (by default a warm request stays where its prefix is and may wait in that worker's own queue for a heavier key's request to end its decode)")
    fair_spill: bool = option(False, "with --fleet-headroom and the worker gate: a request of an API key holding less than its weighted share of the fleet is routed among the workers with a free running slot (requests held for a worker count as taking one) while any has one, locality deciding among them (by default locality decides alone and the request may wait for a running slot of its prefix's worker to end, past what --fair-reserve keeps there)")
    priority_aging_s: float = option(10.0, "every this many seconds in the queue raise a request's priority one level, so low priorities are not starved (0: no aging)")
    low_priority_values_first: bool = option(False, "a lower 'priority' value goes first (vLLM's sense); by default a higher one does (SGLang's)")
    priority_across_keys: bool = option(False, "priority orders the queue across API keys too, fair shares applying only among equal priorities (by default priority orders each key's own requests: a key cannot jump others by claiming a high priority)")

    def __post_init__(self) -> None:
        check_at_least(self, 0, "max_concurrent_requests", "max_queued_requests", "queue_timeout_s",
                       "rate_limit_per_s", "rate_limit_burst", "priority_aging_s", "fair_reserve",
                       "prefill_budget_tokens")
        check_at_least(self, 1, "rate_limit_max_keys")
        check_at_least(self, -1, "fleet_headroom")
        parse_weights(self.key_weights)


class TokenBucket:
    """A classic token bucket. Hand-written because admission must refuse at once with a
    Retry-After figure; ``aiolimiter`` waits for capacity instead of refusing."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float, count: float = 1.0) -> float:
        """Take ``count`` tokens; returns 0.0 on success, else seconds until they are available."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= count:
            self.tokens -= count
            return 0.0
        return (count - self.tokens) / self.rate


def priority_class(priority: int) -> str:
    """A bounded label for a priority (clients choose the numbers)."""
    return "default" if priority == 0 else ("above" if priority > 0 else "below")


def _granted(waiter: asyncio.Future[None]) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


class Ticket:
    """One admitted request's slots (``weight``: one per prompt of a batch); ``release()`` is idempotent."""

    __slots__ = ("_admission", "released", "tenant", "weight")

    def __init__(self, admission: Admission, weight: int = 1, tenant: str = ANONYMOUS) -> None:
        self._admission = admission
        self.weight = weight
        self.tenant = tenant
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release(self.weight, self.tenant)


class Admission:
    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_reject: Callable[[str], None] = lambda reason: None,
        fleet_slots: Callable[[], tuple[int, int]] = lambda: (0, 0),
        weights: dict[str, float] | None = None,
    ) -> None:
        """``on_reject`` hears each refusal's reason (queue_full, queue_timeout, rate_limited)
        so metrics can count them without this module knowing about Prometheus.
        ``fleet_slots`` gives (the workers' running slots, the workers) now, for
        ``fleet_headroom`` (slots 0: unknown, no fleet cap). ``weights``: tenant -> weight, keyed as ``acquire``'s
        ``key`` (the key ids; default ``--key-weights`` as given)."""
        self.config = config = config or AdmissionConfig()
        self._clock = clock
        self._on_reject = on_reject
        self._fleet_slots = fleet_slots
        self._waiters = FairQueue(
            parse_weights(config.key_weights) if weights is None else weights,
            aging_s=config.priority_aging_s,
            low_values_first=config.low_priority_values_first,
            across_tenants=config.priority_across_keys,
        )
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0
        self._held: dict[str, int] = {}  # slots in flight by tenant
        self._seen: dict[str, float] = {}  # tenant -> when it last asked for a slot
        self.closed = False
        self.rejected_full = 0
        self.timed_out = 0
        self.rate_limited = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def waiting(self) -> Counter[tuple[str, str]]:
        """Requests waiting now by (priority class, tenant), for ``/metrics``."""
        return Counter((priority_class(e.priority), e.tenant) for e in self._waiters.entries())

    def cap(self) -> int:
        """Slots admitted at once now (0: no cap): the configured cap, and the fleet's with ``fleet_headroom``."""
        return self._limits()[0]

    def _limits(self) -> tuple[int, int]:
        """(cap, reserve): slots admitted at once (0: no cap), and of those the ones only
        keys below their weighted share may take (``fair_reserve``)."""
        config = self.config
        cap = config.max_concurrent_requests
        headroom = config.fleet_headroom
        if headroom < 0:
            return cap, config.fair_reserve if cap > 0 else 0
        reserve = config.fair_reserve if cap > 0 else 0
        slots, workers = self._fleet_slots()
        if slots > 0:
            fleet = slots + headroom * workers
            if cap <= 0 or fleet < cap:
                cap, reserve = fleet, config.fair_reserve * workers
        return cap, reserve

    def _room(self, tenant: str, slots: int, cap: int, reserve: int) -> bool:
        """Whether ``tenant`` may take ``slots`` more now: under the cap (a lone request
        always may), and past ``cap - reserve`` only while it holds less than its share."""
        if cap <= 0 or self.in_flight == 0:
            return True
        after = self.in_flight + slots
        if after > cap:
            return False
        if reserve <= 0 or after <= cap - reserve:
            return True
        return self._held.get(tenant, 0) < self._share(tenant, cap)

    def contended(self) -> bool:
        """Whether the fleet is contended: requests wait for a slot, every slot is taken, or
        more than one API key holds slots (the worker gate paces prefill only then: its
        point is who goes first, and with one key and room for all nobody needs to wait)."""
        if self._waiters or len(self._held) > 1:
            return True
        cap = self._limits()[0]
        return cap > 0 and self.in_flight >= cap

    def below_share(self, tenant: str) -> bool:
        """Whether ``tenant`` holds fewer slots than its weighted share of the cap now (the
        worker gate's ``fair_reserve`` asks; no cap: every key is)."""
        cap = self._limits()[0]
        return cap <= 0 or self._held.get(tenant, 0) < self._share(tenant, cap)

    def yields_prefill(self, tenant: str) -> bool:
        """Whether ``tenant``'s cold prompts should leave one worker's prefill free (the
        worker gate's prefill reservation): another key that asked for a slot lately holds
        less than its weighted share of the cap and, by weight, fewer slots than
        ``tenant``. By holdings, not by share alone: at a heavy key's start both keys are
        below their share, and the heavy one's cold prompts are the ones to keep off the
        free worker. A key alone never yields: a worker kept free for a newcomer that may
        never come would cost its own cold burst (the gate paces its cold prompts instead)."""
        cap = self._limits()[0]
        horizon = self._clock() - RECENT_S
        weight = self._waiters.weight
        mine = self._held.get(tenant, 0) / weight(tenant)
        others = ({t for t, at in self._seen.items() if at >= horizon} | set(self._held)) - {tenant}
        if not others:
            return False
        for other in others:
            held = self._held.get(other, 0)
            if held / weight(other) < mine and (cap <= 0 or held < self._share(other, cap)):
                return True
        return False

    def _share(self, tenant: str, cap: int) -> float:
        """``tenant``'s weighted share of ``cap`` among the keys that asked for a slot in the
        last ``RECENT_S`` (a light key between two requests still counts: its reserve is
        what lets its next one in at once)."""
        horizon = self._clock() - RECENT_S
        if len(self._seen) > 1024:
            self._seen = {t: at for t, at in self._seen.items() if at >= horizon}
        active = {t for t, at in self._seen.items() if at >= horizon} | set(self._held) | {tenant}
        weight = self._waiters.weight
        return cap * weight(tenant) / sum(weight(t) for t in active)

    # ------------------------------------------------------------------ rate
    def _check_rate(self, key: str, weight: int) -> None:
        rate = self.config.rate_limit_per_s
        if rate <= 0:
            return
        burst = self.config.rate_limit_burst or max(1.0, rate)
        if weight > burst:
            raise InvalidRequestError(
                f"a batch of {weight} prompts counts as {weight} requests; this API key may send at most "
                f"{burst:g} at once (rate limit burst)", code="batch_too_large",
            )
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(rate, float(burst), now)
            while len(self._buckets) > max(1, self.config.rate_limit_max_keys):
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        wait = bucket.take(now, float(weight))
        if wait > 0:
            self.rate_limited += 1
            self._on_reject("rate_limited")
            raise RateLimitedError(
                f"rate limit of {rate:g} requests/s for this API key exceeded", retry_after=wait
            )

    # ------------------------------------------------------------------ slots
    async def acquire(self, key: str | None = None, weight: int = 1, priority: int = 0) -> Ticket:
        """Wait for ``weight`` slots (a batch of k prompts takes k: each is a worker request),
        in fair-queue order (``priority`` within the key); raises the errors listed in the
        module docstring, and 400 for a batch larger than the concurrency cap or the
        rate-limit burst (it could never pass)."""
        weight = max(1, weight)
        if self.closed:
            self._on_reject("shutting_down")
            raise ShuttingDownError("the gateway is shutting down")
        fixed = self.config.max_concurrent_requests
        if 0 < fixed < weight:
            raise InvalidRequestError(
                f"a request of {weight} samples (prompts x n) needs {weight} slots; this gateway runs at most {fixed} "
                "requests at once: send smaller batches or a lower n", code="batch_too_large",
            )
        tenant = key or ANONYMOUS
        self._check_rate(tenant, weight)
        CALLER.set((tenant, priority))  # the worker gate orders this task's request by it
        if self.config.fair_reserve or self.config.fair_prefill_reserve:
            self._seen[tenant] = self._clock()
        cap, reserve = self._limits()
        if (cap <= 0 or self._room(tenant, weight, cap, reserve)) and not self._waiters:
            self._take(weight, tenant)
            return Ticket(self, weight, tenant)
        if self.queued >= self.config.max_queued_requests:
            self.rejected_full += 1
            self._on_reject("queue_full")
            raise QueueFullError(
                f"the gateway is at its limit of {cap} concurrent requests and its queue of "
                f"{self.config.max_queued_requests} is full; retry later",
                retry_after=1.0,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._waiters.push(tenant, priority, weight, self._clock(), waiter)
        if reserve:
            self._grant()  # a key below its share may go ahead of a waiter held back by the reserve
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                await asyncio.shield(waiter)
        except TimeoutError:
            if _granted(waiter):
                # The slot was handed over just as the timer fired: keep it.
                return Ticket(self, weight, tenant)
            self._leave(entry)
            self.timed_out += 1
            self._on_reject("queue_timeout")
            raise QueueTimeoutError(
                f"waited {self.config.queue_timeout_s:g} s in the admission queue without a free slot"
            ) from None
        except BaseException:
            if _granted(waiter):
                self._release(weight, tenant)  # granted, but the caller is gone: pass it on
            else:
                self._leave(entry)
            raise
        return Ticket(self, weight, tenant)

    def _leave(self, entry: Entry) -> None:
        """A waiter gives up its place (its client left, or it timed out)."""
        entry.handle.cancel()
        self._waiters.remove(entry)
        self._grant()  # a heavy waiter leaving the head may let lighter ones in

    def _take(self, weight: int, tenant: str) -> None:
        self.in_flight += weight
        held = self._held
        held[tenant] = held.get(tenant, 0) + weight
        self._idle.clear()

    def _release(self, weight: int, tenant: str) -> None:
        self.in_flight -= weight
        held = self._held[tenant] - weight
        if held > 0:
            self._held[tenant] = held
        else:
            del self._held[tenant]
        self._grant()
        if self.in_flight == 0:
            self._idle.set()

    def resize(self, config: AdmissionConfig) -> None:
        """Take new limits now (a process of a set whose active processes changed takes its new
        share of the set's); a raised cap admits waiters at once. The fair queue's settings stay."""
        self.config = config
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters in fair-queue order (a heavy head waits for room
        rather than being overtaken)."""
        if not self._waiters:
            return
        cap, reserve = self._limits()
        now = self._clock()
        held_back: set[str] = set()  # keys past their share while only reserved slots are free
        while self._waiters:
            entry = self._waiters.peek(now, held_back)
            if entry is None:
                return
            waiter = entry.handle
            if waiter.done():  # refused at shutdown
                self._waiters.remove(entry)
                continue
            if not self._room(entry.tenant, entry.slots, cap, reserve):
                if cap > 0 and self.in_flight + entry.slots > cap:
                    return  # no room for anyone this size: first in order waits first
                held_back.add(entry.tenant)
                continue
            self._waiters.pop(entry)
            self._take(entry.slots, entry.tenant)
            waiter.set_result(None)

    @contextlib.asynccontextmanager
    async def admit(self, key: str | None = None, weight: int = 1, priority: int = 0) -> AsyncIterator[Ticket]:
        ticket = await self.acquire(key, weight, priority)
        try:
            yield ticket
        finally:
            ticket.release()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Refuse new requests from now on; queued ones are refused too."""
        self.closed = True
        for entry in self._waiters.drain():
            if not entry.handle.done():
                entry.handle.set_exception(ShuttingDownError("the gateway is shutting down"))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no admitted request is left; False if ``timeout`` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
