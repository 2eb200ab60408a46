"""The circuit breaker: consecutive failures, failure ratio over a sliding window,
half-open trials by real traffic, and the watchdog's trip."""

from __future__ import annotations

from gateway.workers.breaker import BreakerState, CircuitBreaker


def make(**kw: object) -> CircuitBreaker:
    args: dict[str, object] = {
        "failure_threshold": 3, "cooldown_s": 5.0, "window_s": 10.0, "min_requests": 10,
        "failure_ratio": 0.3, "half_open_probes": 2,
    }
    args.update(kw)
    return CircuitBreaker(**args)  # type: ignore[arg-type]


def test_consecutive_failures_open() -> None:
    b = make()
    b.record_failure(now=1.0)
    b.record_failure(now=1.1)
    assert b.state is BreakerState.CLOSED
    b.record_failure(now=1.2)
    assert b.state is BreakerState.OPEN
    assert b.last_reason == "consecutive" and b.opens == 1
    assert not b.allows(now=2.0)


def test_alternating_failures_open_on_ratio_once_the_window_is_full() -> None:
    b = make()
    t = 0.0
    for i in range(9):  # fail, ok, fail, ok...: never two failures in a row
        t += 0.1
        (b.record_failure if i % 2 == 0 else b.record_success)(now=t)
    assert b.state is BreakerState.CLOSED, "below min_requests the ratio does not judge"
    assert b.window_counts(now=t) == (9, 5)
    b.record_success(now=t + 0.1)
    assert b.state is BreakerState.CLOSED  # successes never open it
    b.record_failure(now=t + 0.2)
    assert b.state is BreakerState.OPEN and b.last_reason == "ratio"


def test_old_outcomes_leave_the_window() -> None:
    b = make()
    for i in range(8):
        b.record_failure(now=float(i) * 0.01) if i % 3 == 0 else b.record_success(now=float(i) * 0.01)
    assert b.window_counts(now=0.1)[0] == 8
    assert b.window_counts(now=20.0) == (0, 0)
    # A failure after the window emptied sees one failure among few outcomes: closed.
    b.record_failure(now=20.0)
    assert b.state is BreakerState.CLOSED


def test_low_failure_ratio_stays_closed() -> None:
    b = make()
    for i in range(100):
        (b.record_failure if i % 5 == 0 else b.record_success)(now=i * 0.05)
    assert b.state is BreakerState.CLOSED  # 20% < 30%


def test_half_open_needs_every_probe_to_succeed() -> None:
    b = make()
    b.trip("watchdog", now=0.0)
    assert b.state is BreakerState.OPEN and b.last_reason == "watchdog"
    assert not b.allows(now=4.9)
    assert b.allows(now=5.0)
    b.on_dispatch(now=5.0)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allows(now=5.0), "a second probe may go"
    b.on_dispatch(now=5.0)
    assert not b.allows(now=5.0), "the probe budget is spent"
    b.record_success(now=5.1)
    assert b.state is BreakerState.HALF_OPEN
    b.record_success(now=5.2)
    assert b.state is BreakerState.CLOSED
    assert b.window_counts(now=5.2) == (0, 0)


def test_failed_probe_reopens_and_restarts_the_cooldown() -> None:
    b = make()
    b.trip("watchdog", now=0.0)
    b.on_dispatch(now=6.0)
    b.record_failure(now=6.5)
    assert b.state is BreakerState.OPEN and b.last_reason == "half_open"
    assert b.opens == 2
    assert not b.allows(now=10.0)
    assert b.allows(now=11.5)


def test_late_outcomes_while_open_change_nothing() -> None:
    b = make()
    b.trip("watchdog", now=0.0)
    b.record_success(now=0.5)  # a request sent before the trip finished
    b.record_failure(now=0.6)
    assert b.state is BreakerState.OPEN and b.opens == 1
    assert b.opened_at == 0.0


def test_reset_closes_with_a_clean_record() -> None:
    b = make()
    for i in range(3):
        b.record_failure(now=i * 0.1)
    b.reset()
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 0
    assert b.window_counts(now=1.0) == (0, 0)


def test_opens_after_threshold_and_lets_one_trial_through_after_cooldown() -> None:
    b = CircuitBreaker(failure_threshold=2, cooldown_s=10.0, half_open_probes=1)
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


def test_a_cancelled_trial_gives_its_slot_back() -> None:
    b = make(half_open_probes=1)
    b.trip("watchdog", now=0.0)
    b.on_dispatch(now=6.0)
    assert not b.allows(now=6.0)
    b.release_trial()
    assert b.state is BreakerState.HALF_OPEN and b.allows(now=6.0)
