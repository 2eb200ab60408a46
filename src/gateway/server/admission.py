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
    InvalidRequestError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitedError,
    ShuttingDownError,
)
from gateway.settings import check_at_least, option

ANONYMOUS = "-"


@dataclass
class AdmissionConfig:
    max_concurrent_requests: int = option(0, "inference requests processed at once (0: no cap)")
    max_queued_requests: int = option(1024, "requests waiting for a slot beyond the cap; more get 429")
    queue_timeout_s: float = option(30.0, "longest wait for a slot before the request gets 408, seconds")
    rate_limit_per_s: float = option(0.0, "token-bucket refill per API key, requests per second (0: off; without --api-keys all callers share one bucket)")
    rate_limit_burst: int = option(0, "token-bucket size per API key (0: max(1, rate))")
    rate_limit_max_keys: int = option(10000, "API keys whose buckets are remembered (least recently used go first)")

    def __post_init__(self) -> None:
        check_at_least(self, 0, "max_concurrent_requests", "max_queued_requests", "queue_timeout_s",
                       "rate_limit_per_s", "rate_limit_burst")
        check_at_least(self, 1, "rate_limit_max_keys")


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


def _granted(waiter: asyncio.Future[None]) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.exception() is None


class Ticket:
    """One admitted request's slots (``weight``: one per prompt of a batch); ``release()`` is idempotent."""

    __slots__ = ("_admission", "released", "weight")

    def __init__(self, admission: Admission, weight: int = 1) -> None:
        self._admission = admission
        self.weight = weight
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release(self.weight)


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
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()  # (waiter, weight)
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
        return sum(1 for w, _ in self._waiters if not w.done())

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
    async def acquire(self, key: str | None = None, weight: int = 1) -> Ticket:
        """Wait (FIFO) for ``weight`` slots (a batch of k prompts takes k: each is a worker
        request); raises the errors listed in the module docstring, and 400 for a batch
        larger than the concurrency cap or the rate-limit burst (it could never pass)."""
        weight = max(1, weight)
        if self.closed:
            self._on_reject("shutting_down")
            raise ShuttingDownError("the gateway is shutting down")
        cap = self.config.max_concurrent_requests
        if 0 < cap < weight:
            raise InvalidRequestError(
                f"a request of {weight} samples (prompts x n) needs {weight} slots; this gateway runs at most {cap} "
                "requests at once: send smaller batches or a lower n", code="batch_too_large",
            )
        self._check_rate(key or ANONYMOUS, weight)
        if cap <= 0 or (self.in_flight + weight <= cap and not self.queued):
            self._take(weight)
            return Ticket(self, weight)
        if self.queued >= self.config.max_queued_requests:
            self.rejected_full += 1
            self._on_reject("queue_full")
            raise QueueFullError(
                f"the gateway is at its limit of {cap} concurrent requests and its queue of "
                f"{self.config.max_queued_requests} is full; retry later",
                retry_after=1.0,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((waiter, weight))
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                await asyncio.shield(waiter)
        except TimeoutError:
            if _granted(waiter):
                # The slot was handed over just as the timer fired: keep it.
                return Ticket(self, weight)
            waiter.cancel()
            self._grant()  # a heavy waiter leaving the head may let lighter ones in
            self.timed_out += 1
            self._on_reject("queue_timeout")
            raise QueueTimeoutError(
                f"waited {self.config.queue_timeout_s:g} s in the admission queue without a free slot"
            ) from None
        except BaseException:
            if _granted(waiter):
                self._release(weight)  # granted, but the caller is gone: pass it on
            else:
                waiter.cancel()
                self._grant()
            raise
        return Ticket(self, weight)

    def _take(self, weight: int = 1) -> None:
        self.in_flight += weight
        self._idle.clear()

    def _release(self, weight: int = 1) -> None:
        self.in_flight -= weight
        self._grant()
        if self.in_flight == 0:
            self._idle.set()

    def _grant(self) -> None:
        """Hand free slots to waiters, strictly first in, first out (a heavy head waits
        for room rather than being overtaken)."""
        cap = self.config.max_concurrent_requests
        while self._waiters:
            waiter, weight = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if cap > 0 and self.in_flight + weight > cap:
                return
            self._waiters.popleft()
            self._take(weight)
            waiter.set_result(None)

    @contextlib.asynccontextmanager
    async def admit(self, key: str | None = None, weight: int = 1) -> AsyncIterator[Ticket]:
        ticket = await self.acquire(key, weight)
        try:
            yield ticket
        finally:
            ticket.release()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Refuse new requests from now on; queued ones are refused too."""
        self.closed = True
        while self._waiters:
            waiter, _ = self._waiters.popleft()
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
