"""The progress watchdog's decision logic (fake clock), and its driver against fake workers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.workers.breaker import BreakerState, CircuitBreaker
from gateway.workers.watchdog import ProgressTracker, Watchdog, WatchdogConfig


def tracker(**kw: float) -> ProgressTracker:
    return ProgressTracker(WatchdogConfig(**kw))  # type: ignore[arg-type]


def test_idle_worker_is_never_stalled() -> None:
    p = tracker()
    assert not p.judge(1e6, in_flight=0, queued_prefill_tokens=0).stalled


def test_silence_counts_from_the_dispatch_to_an_idle_worker() -> None:
    p = tracker(watchdog_floor_s=5.0)
    p.started(100.0, idle=True)
    assert not p.judge(104.0, in_flight=1, queued_prefill_tokens=10).stalled
    v = p.judge(105.5, in_flight=1, queued_prefill_tokens=10)
    assert v.stalled and v.silent_s == pytest.approx(5.5) and v.allowed_s == pytest.approx(5.0)


def test_a_busy_worker_keeps_its_silence_clock() -> None:
    p = tracker(watchdog_floor_s=5.0)
    p.started(0.0, idle=True)
    p.message(1.0, first=True)
    p.started(4.0, idle=False)  # a new request does not hide the older silence
    assert p.judge(6.5, in_flight=2, queued_prefill_tokens=0).stalled


def test_any_message_is_progress() -> None:
    p = tracker(watchdog_floor_s=5.0)
    p.started(0.0, idle=True)
    for t in range(1, 60):
        p.message(float(t))
        assert not p.judge(t + 0.9, in_flight=3, queued_prefill_tokens=0).stalled


def test_learned_step_interval_raises_the_allowance_of_a_slow_worker() -> None:
    p = tracker(watchdog_floor_s=1.0, watchdog_step_factor=20.0, watchdog_learn_alpha=1.0)
    p.started(0.0, idle=True)
    p.message(0.0, first=True)
    p.message(0.5)  # one decode step every 0.5 s
    assert p.step_s == pytest.approx(0.5)
    assert p.allowed_s(0) == pytest.approx(10.0)
    assert not p.judge(9.0, in_flight=1, queued_prefill_tokens=0).stalled
    assert p.judge(11.0, in_flight=1, queued_prefill_tokens=0).stalled


def test_first_message_gaps_are_not_steps() -> None:
    p = tracker()
    p.started(0.0, idle=True)
    p.message(1.5, first=True)
    assert p.step_s is None


def test_a_huge_prompt_gets_its_expected_prefill_time() -> None:
    # The worker prefills 10k tokens/s (learned); a 600k-token prompt needs ~60 s.
    p = tracker(watchdog_floor_s=5.0, watchdog_prefill_factor=3.0, watchdog_learn_alpha=1.0)
    p.first_message(10_000, 1.0)
    assert p.prefill_tps == pytest.approx(10_000)
    p.started(0.0, idle=True)
    assert not p.judge(120.0, in_flight=1, queued_prefill_tokens=600_000).stalled
    assert p.judge(181.0, in_flight=1, queued_prefill_tokens=600_000).stalled
    # The same silence with only a short prompt queued is a stall.
    assert p.judge(6.0, in_flight=1, queued_prefill_tokens=100).stalled


def test_unlearned_rate_uses_the_default() -> None:
    p = tracker(watchdog_floor_s=1.0, watchdog_default_prefill_tps=1000.0, watchdog_prefill_factor=2.0)
    assert p.allowed_s(5000) == pytest.approx(10.0)


def test_short_prompts_do_not_teach_the_rate() -> None:
    p = tracker()
    p.first_message(10, 5.0)
    assert p.prefill_tps is None


def test_kill_all_cancels_registered_requests_once() -> None:
    p = tracker()
    killed: list[str] = []
    unwatch_a = p.watch(lambda: killed.append("a"))
    p.watch(lambda: killed.append("b"))
    unwatch_a()
    assert p.kill_all() == 1 and killed == ["b"]
    assert p.kill_all() == 0


@dataclass
class FakeWorker:
    id: str
    in_flight: int = 0
    queued: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    progress: ProgressTracker = field(default_factory=lambda: ProgressTracker(WatchdogConfig(watchdog_floor_s=2.0)))

    def load_figures(self) -> tuple[int, int]:
        return self.in_flight, self.queued

    def trip(self, reason: str) -> None:
        self.breaker.trip(reason)


def test_driver_trips_only_the_silent_worker_and_cancels_its_requests() -> None:
    sick, healthy, idle = FakeWorker("sick", in_flight=2), FakeWorker("ok", in_flight=2), FakeWorker("idle")
    for w in (sick, healthy):
        w.progress.started(0.0, idle=True)
    healthy.progress.message(2.5)
    cancelled: list[int] = []
    sick.progress.watch(lambda: cancelled.append(1))
    sick.progress.watch(lambda: cancelled.append(2))
    dog = Watchdog(lambda: [sick, healthy, idle])
    assert dog.check(now=1.0) == []
    assert dog.check(now=3.0) == ["sick"]
    assert sick.breaker.state is BreakerState.OPEN and sick.breaker.last_reason == "watchdog"
    assert sorted(cancelled) == [1, 2] and sick.progress.stalls == 1
    assert healthy.breaker.state is BreakerState.CLOSED and idle.breaker.state is BreakerState.CLOSED
    # Judged fresh after acting: no second verdict for the same silence.
    assert dog.check(now=3.5) == []


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        WatchdogConfig(watchdog_floor_s=0)
    with pytest.raises(ValueError):
        WatchdogConfig(watchdog_learn_alpha=0)


def test_an_unstreamed_answer_gets_its_prefill_and_its_tokens_at_the_workers_pace() -> None:
    p = tracker(watchdog_floor_s=1.0, watchdog_answer_factor=3.0, watchdog_default_token_s=0.05,
                watchdog_default_prefill_tps=1000.0, watchdog_learn_alpha=1.0)
    # Unlearned: 2,000 held prompt tokens at 1,000 tokens/s + 100 tokens at 0.05 s, times 3.
    assert p.answer_allowed_s(100, 2000) == pytest.approx(3 * (2.0 + 5.0))
    p.whole_answer(200, 2.0)  # learned: 10 ms per token, queueing and prefill included
    assert p.token_s == pytest.approx(0.01)
    assert p.answer_allowed_s(100, 2000) == pytest.approx(3 * (2.0 + 1.0))
    assert p.answer_allowed_s(1, 0) == pytest.approx(1.0)  # never under the floor
    p.whole_answer(4, 2.0)  # a short answer is mostly its queueing and prefill: not a pace
    p.whole_answer(0, 1.0)
    assert p.token_s == pytest.approx(0.01)


def test_answer_knobs_are_checked() -> None:
    for bad in ({"watchdog_answer_factor": 0.5}, {"watchdog_default_token_s": 0.0}):
        with pytest.raises(ValueError):
            WatchdogConfig(**bad)  # type: ignore[arg-type]
