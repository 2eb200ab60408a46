"""Per-worker circuit breaker, separate from health.

Health says whether the worker answers probes; the breaker says whether recent
*requests* succeeded. Consecutive failures open it; after a cool-down one trial
request is let through (half-open) and its outcome closes or re-opens it.
"""

from __future__ import annotations

import time
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
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    _trial_in_flight: bool = field(default=False, repr=False)

    def allows(self, now: float | None = None) -> bool:
        """Whether a new request may go to this worker now (does not reserve the trial)."""
        if self.state is BreakerState.CLOSED:
            return True
        now = time.monotonic() if now is None else now
        if self.state is BreakerState.OPEN:
            return now - self.opened_at >= self.cooldown_s
        return not self._trial_in_flight

    def on_dispatch(self, now: float | None = None) -> None:
        """A request is being sent; past the cool-down it becomes the half-open trial."""
        if self.state is BreakerState.OPEN and self.allows(now):
            self.state = BreakerState.HALF_OPEN
        if self.state is BreakerState.HALF_OPEN:
            self._trial_in_flight = True

    def abandon_trial(self) -> None:
        """A request ended without a verdict on the worker (the client went away first):
        if it was the half-open trial, let the next request be the trial instead."""
        self._trial_in_flight = False

    def record_success(self) -> None:
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self._trial_in_flight = False

    def record_failure(self, now: float | None = None) -> None:
        self.consecutive_failures += 1
        self._trial_in_flight = False
        if self.state is BreakerState.HALF_OPEN or self.consecutive_failures >= self.failure_threshold:
            self.state = BreakerState.OPEN
            self.opened_at = time.monotonic() if now is None else now
