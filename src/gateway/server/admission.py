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
``close()`` was called. Waiters are served strictly first in, first out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gateway.protocol.errors import (
    QueueFullError,
    QueueTimeoutError,
    RateLimitedError,
    ShuttingDownError,
)
from gateway.settings import option

ANONYMOUS = "-"


@dataclass
class AdmissionConfig:
    max_concurrent_requests: int = option(0, "inference requests processed at once (0: no cap)")
    max_queued_requests: int = option(1024, "requests waiting for a slot beyond the cap; more get 429")
    queue_timeout_s: float = option(30.0, "longest wait for a slot before the request gets 408, seconds")
    rate_limit_per_s: float = option(0.0, "token-bucket refill per API key, requests per second (0: off; without --api-keys all callers share one bucket)")
    rate_limit_burst: int = option(0, "token-bucket size per API key (0: max(1, rate))")
    rate_limit_max_keys: int = option(10000, "API keys whose buckets are remembered (least recently used go first)")


class TokenBucket:
    """A classic token bucket. Hand-written because admission must refuse at once with a
    Retry-After figure; ``aiolimiter`` waits for capacity instead of refusing."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> float:
        """Take one token; returns 0.0 on success, else seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def _granted(waiter: asyncio.Future[None]) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


class Ticket:
    """One admitted request's slot; ``release()`` is idempotent."""

    __slots__ = ("_admission", "released")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release()


class Admission:
    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_reject: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """``on_reject`` hears each refusal's reason (queue_full, queue_timeout, rate_limited)
        so metrics can count them without this module knowing about Prometheus."""
        self.config = config or AdmissionConfig()
        self._clock = clock
        self._on_reject = on_reject
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0
        self.closed = False
        self.rejected_full = 0
        self.timed_out = 0
        self.rate_limited = 0

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    # ------------------------------------------------------------------ rate
    def _check_rate(self, key: str) -> None:
        rate = self.config.rate_limit_per_s
        if rate <= 0:
            return
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            burst = self.config.rate_limit_burst or max(1.0, rate)
            bucket = self._buckets[key] = TokenBucket(rate, float(burst), now)
            while len(self._buckets) > max(1, self.config.rate_limit_max_keys):
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        wait = bucket.take(now)
        if wait > 0:
            self.rate_limited += 1
            self._on_reject("rate_limited")
            raise RateLimitedError(
                f"rate limit of {rate:g} requests/s for this API key exceeded", retry_after=wait
            )

    # ------------------------------------------------------------------ slots
    async def acquire(self, key: str | None = None) -> Ticket:
        """Wait (FIFO) for a slot; raises the errors listed in the module docstring."""
        if self.closed:
            self._on_reject("shutting_down")
            raise ShuttingDownError("the gateway is shutting down")
        self._check_rate(key or ANONYMOUS)
        cap = self.config.max_concurrent_requests
        if cap <= 0 or (self.in_flight < cap and not self.queued):
            self._take()
            return Ticket(self)
        if self.queued >= self.config.max_queued_requests:
            self.rejected_full += 1
            self._on_reject("queue_full")
            raise QueueFullError(
                f"the gateway is at its limit of {cap} concurrent requests and its queue of "
                f"{self.config.max_queued_requests} is full; retry later",
                retry_after=1.0,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                await asyncio.shield(waiter)
        except TimeoutError:
            if _granted(waiter):
                # The slot was handed over just as the timer fired: keep it.
                return Ticket(self)
            waiter.cancel()
            self.timed_out += 1
            self._on_reject("queue_timeout")
            raise QueueTimeoutError(
                f"waited {self.config.queue_timeout_s:g} s in the admission queue without a free slot"
            ) from None
        except BaseException:
            if _granted(waiter):
                self._release()  # granted, but the caller is gone: pass it on
            else:
                waiter.cancel()
            raise
        return Ticket(self)

    def _take(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _release(self) -> None:
        # Hand the slot straight to the oldest live waiter (in_flight unchanged).
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def admit(self, key: str | None = None) -> AsyncIterator[Ticket]:
        ticket = await self.acquire(key)
        try:
            yield ticket
        finally:
            ticket.release()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Refuse new requests from now on; queued ones are refused too."""
        self.closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ShuttingDownError("the gateway is shutting down"))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no admitted request is left; False if ``timeout`` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
