"""The circuit breaker: consecutive failures open it, one trial after the cool-down."""

from __future__ import annotations

from gateway.workers.breaker import BreakerState, CircuitBreaker


def test_opens_after_threshold_and_lets_one_trial_through_after_cooldown() -> None:
    b = CircuitBreaker(failure_threshold=2, cooldown_s=10.0)
    b.record_failure(now=0.0)
    assert b.state is BreakerState.CLOSED and b.allows(now=0.0)
    b.record_failure(now=1.0)
    assert b.state is BreakerState.OPEN and not b.allows(now=5.0)
    assert b.allows(now=11.0)
    b.on_dispatch(now=11.0)
    assert b.state is BreakerState.HALF_OPEN and not b.allows(now=11.0)  # the trial is in flight
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.allows(now=11.0) and b.consecutive_failures == 0


def test_failed_trial_reopens() -> None:
    b = CircuitBreaker(failure_threshold=1, cooldown_s=1.0)
    b.record_failure(now=0.0)
    b.on_dispatch(now=2.0)
    b.record_failure(now=2.0)
    assert b.state is BreakerState.OPEN and not b.allows(now=2.5) and b.allows(now=3.0)


def test_success_resets_the_count() -> None:
    b = CircuitBreaker(failure_threshold=3)
    b.record_failure(now=0.0)
    b.record_failure(now=0.0)
    b.record_success()
    b.record_failure(now=0.0)
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 1
