"""Per-worker circuit breaker, separate from health.

Health says whether the worker answers probes; the breaker says whether recent
*requests* succeeded. It opens on either of two signals:

* ``failure_threshold`` failures in a row (a dead worker: fast), or
* a failure ratio of at least ``failure_ratio`` over the outcomes of the last
  ``window_s`` seconds, once that window holds ``min_requests`` outcomes (a flaky
  worker that fails every other request never trips the consecutive count).

The progress watchdog can also open it directly (``trip``). After ``cooldown_s``
it goes half-open: up to ``half_open_probes`` real requests are let through as
trials; the first trial failure re-opens it (the cool-down starts again), and
``half_open_probes`` successes close it with a clean window. Client faults and
client cancels are not outcomes: callers simply do not record them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class CircuitBreaker:
    failure_threshold: int = 3
    cooldown_s: float = 5.0
    window_s: float = 30.0
    min_requests: int = 10
    failure_ratio: float = 0.3
    half_open_probes: int = 2
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    opens: int = 0  # times it opened since the worker joined
    last_reason: str = ""  # why it last opened: consecutive, ratio, half_open, or the watchdog's word
    _window: deque[tuple[float, bool]] = field(default_factory=deque, repr=False)
    _window_failures: int = field(default=0, repr=False)
    _trials: int = field(default=0, repr=False)  # half-open trial requests in flight
    _trial_successes: int = field(default=0, repr=False)

    # ----------------------------------------------------------------- queries
    def allows(self, now: float | None = None) -> bool:
        """Whether a new request may go to this worker now (does not reserve a trial)."""
        if self.state is BreakerState.CLOSED:
            return True
        now = time.monotonic() if now is None else now
        if self.state is BreakerState.OPEN:
            return now - self.opened_at >= self.cooldown_s
        return self._trials < self.half_open_probes

    def window_counts(self, now: float | None = None) -> tuple[int, int]:
        """(outcomes, failures) inside the sliding window."""
        self._expire(time.monotonic() if now is None else now)
        return len(self._window), self._window_failures

    # ----------------------------------------------------------------- events
    def on_dispatch(self, now: float | None = None) -> None:
        """A request is being sent; past the cool-down it becomes a half-open trial."""
        if self.state is BreakerState.OPEN and self.allows(now):
            self.state = BreakerState.HALF_OPEN
            self._trials = 0
            self._trial_successes = 0
        if self.state is BreakerState.HALF_OPEN:
            self._trials += 1

    def record_success(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.consecutive_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            self._trials = max(0, self._trials - 1)
            self._trial_successes += 1
            if self._trial_successes >= self.half_open_probes:
                self.reset()
            return
        if self.state is BreakerState.OPEN:
            return  # a request from before the opening finished late: no verdict
        self._add(now, False)

    def record_failure(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self._open(now, "half_open")
            return
        if self.state is BreakerState.OPEN:
            return
        self._add(now, True)
        if self.consecutive_failures >= self.failure_threshold:
            self._open(now, "consecutive")
            return
        total, failed = len(self._window), self._window_failures
        if total >= self.min_requests and failed >= self.failure_ratio * total:
            self._open(now, "ratio")

    def release_trial(self) -> None:
        """A request ended with no verdict on the worker (cancelled): a half-open trial
        slot it held is free again."""
        if self.state is BreakerState.HALF_OPEN:
            self._trials = max(0, self._trials - 1)

    def trip(self, reason: str, now: float | None = None) -> None:
        """Open now, whatever the counts say (the watchdog saw the worker stop)."""
        self._open(time.monotonic() if now is None else now, reason)

    def reset(self) -> None:
        """Close with a clean record (probes or trials proved the worker back)."""
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self._trials = 0
        self._trial_successes = 0
        self._window.clear()
        self._window_failures = 0

    # ----------------------------------------------------------------- internals
    def _open(self, now: float, reason: str) -> None:
        if self.state is not BreakerState.OPEN:
            self.opens += 1
        self.state = BreakerState.OPEN
        self.opened_at = now
        self.last_reason = reason
        self._trials = 0
        self._trial_successes = 0
        self._window.clear()
        self._window_failures = 0

    def _add(self, now: float, failed: bool) -> None:
        self._window.append((now, failed))
        self._window_failures += failed
        self._expire(now)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        window = self._window
        while window and window[0][0] < horizon:
            _, failed = window.popleft()
            self._window_failures -= failed
