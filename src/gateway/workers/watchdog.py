"""Progress watchdog: notice a worker that stopped making progress while it has work.

A worker under load sends something on one of its streams every decode step; a
worker whose scheduler hung, whose GPU wedged or whose process froze sends
nothing while its requests wait. Per-request timeouts catch that only after the
longest legitimate wait (a huge prompt's prefill), so every request stuck on it
waits that long. The watchdog judges the *worker* instead: how long since it last
sent anything on any stream while it had requests in flight, against what that
worker normally does:

* its decode-step interval (the gap between consecutive messages, learned online),
* its prefill rate in tokens/s (prompt tokens / time to first message, learned
  online), applied to the prompt tokens it holds that have no first token yet, so
  a worker busy with one huge prompt is given that prompt's expected prefill time,
* a floor (``watchdog_floor_s``) below which nothing is ever called a stall.

A whole answer asked for unstreamed (as SGLang's own frontends ask for it) is silent
by design until it is done, so the worker's silence says nothing about it: it is left
out of the in-flight count judged here, and the call gets a deadline of its own instead
(``answer_allowed_s``): the prefill of what the worker holds plus the answer's token
budget at the worker's learned pace per output token, times a factor.

``ProgressTracker`` is the pure bookkeeping and verdict (unit-tested with a fake
clock); ``Watchdog`` is the asyncio driver that applies a verdict: the worker's
breaker opens (out of rotation) and its requests still waiting for their first
message are cancelled, so the one retry loop re-sends them elsewhere at once.
Streams that already produced output are cancelled too, so they resume elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.settings import option
from gateway.workers.periodic import Periodic

log = logging.getLogger(__name__)


@dataclass
class WatchdogConfig:
    watchdog_interval_s: float = option(0.5, "progress watchdog: seconds between checks of every worker (0: watchdog off)")
    watchdog_floor_s: float = option(5.0, "progress watchdog: a worker with work is never called stalled before it was silent this long, seconds")
    watchdog_step_factor: float = option(20.0, "progress watchdog: silence allowed as a multiple of the worker's learned decode-step interval")
    watchdog_prefill_factor: float = option(3.0, "progress watchdog: silence allowed as a multiple of the expected prefill time of the prompts it holds (queued prefill tokens / learned rate)")
    watchdog_default_prefill_tps: float = option(2000.0, "progress watchdog: prefill rate assumed (tokens/s) until the worker's own rate is learned")
    watchdog_learn_alpha: float = option(0.1, "progress watchdog: weight of each new sample in the learned step interval and prefill rate (EWMA)")
    watchdog_answer_factor: float = option(3.0, "progress watchdog: an answer sent unstreamed may take this multiple of its expected time (prefill of what the worker holds + its token budget at the worker's learned pace) before its worker is called stalled")
    watchdog_default_token_s: float = option(0.05, "progress watchdog: seconds per output token of one answer assumed until the worker's own pace is learned from whole answers")

    def __post_init__(self) -> None:
        if self.watchdog_floor_s <= 0 or self.watchdog_default_prefill_tps <= 0:
            raise ValueError("watchdog_floor_s and watchdog_default_prefill_tps must be > 0")
        if self.watchdog_answer_factor < 1 or self.watchdog_default_token_s <= 0:
            raise ValueError("watchdog_answer_factor must be >= 1 and watchdog_default_token_s > 0")
        if not 0.0 < self.watchdog_learn_alpha <= 1.0:
            raise ValueError("watchdog_learn_alpha must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Verdict:
    stalled: bool
    silent_s: float
    allowed_s: float


# Prompts shorter than this say more about per-request overhead than prefill speed.
_MIN_RATE_SAMPLE_TOKENS = 64
# Gaps longer than this are idle time or prefill, not a decode step.
_MAX_STEP_SAMPLE_S = 2.0
# Whole answers shorter than this say more about queueing and prefill than decode pace.
_MIN_PACE_SAMPLE_TOKENS = 8


@dataclass
class ProgressTracker:
    """One worker's progress record; every method takes ``now`` (monotonic seconds)."""

    config: WatchdogConfig = field(default_factory=WatchdogConfig)
    last_progress_at: float = 0.0
    last_message_at: float = 0.0  # the worker's own last message (``last_progress_at`` also restarts on a send)
    last_alive_at: float = 0.0  # the worker's last answered health probe (it runs, though its answers may be silent)
    step_s: float | None = None  # learned gap between consecutive messages while busy
    prefill_tps: float | None = None  # learned prefill rate, tokens/s
    token_s: float | None = None  # learned seconds per output token of one whole answer (queue and prefill included)
    stalls: int = 0  # verdicts "stalled" acted on
    _kills: set[Callable[[], None]] = field(default_factory=set, repr=False)

    def started(self, now: float, *, idle: bool) -> None:
        """A request was sent; an ``idle`` worker's silence starts counting now."""
        if idle:
            self.last_progress_at = now

    def message(self, now: float, *, first: bool = False) -> None:
        """The worker sent something on one of its streams (``first``: a request's first
        message, whose gap is prefill, not a decode step)."""
        gap = now - self.last_progress_at
        if not first and 0.0 <= gap <= _MAX_STEP_SAMPLE_S:
            a = self.config.watchdog_learn_alpha
            self.step_s = gap if self.step_s is None else (1 - a) * self.step_s + a * gap
        self.last_progress_at = now
        self.last_message_at = now

    def alive(self, now: float) -> None:
        """The worker answered a health probe: evidence that it runs, for answers asked for
        unstreamed (``last_heard_at``); never progress for the watchdog's streamed calls."""
        self.last_alive_at = now

    @property
    def last_heard_at(self) -> float:
        """The last time the worker showed it runs: a message on any call or an answered probe."""
        return max(self.last_message_at, self.last_alive_at)

    def first_message(self, uncached_tokens: int, waited_s: float) -> None:
        """A request's first message arrived ``waited_s`` after it was sent, having had
        ``uncached_tokens`` prompt tokens to prefill (queueing included: a low rate only
        makes the allowance generous)."""
        if uncached_tokens < _MIN_RATE_SAMPLE_TOKENS or waited_s <= 0:
            return
        rate = uncached_tokens / waited_s
        a = self.config.watchdog_learn_alpha
        self.prefill_tps = rate if self.prefill_tps is None else (1 - a) * self.prefill_tps + a * rate

    def whole_answer(self, tokens: int, took_s: float) -> None:
        """An answer sent unstreamed came back with ``tokens`` output tokens ``took_s`` after
        it was sent. Its queueing and prefill count as decode time: the pace learned is
        slower than the worker's decode, which only makes the allowance generous."""
        if tokens < _MIN_PACE_SAMPLE_TOKENS or took_s <= 0:
            return
        pace = took_s / tokens
        a = self.config.watchdog_learn_alpha
        self.token_s = pace if self.token_s is None else (1 - a) * self.token_s + a * pace

    def answer_allowed_s(self, max_new_tokens: int, queued_prefill_tokens: int) -> float:
        """The longest an answer sent unstreamed may take on this worker before the worker
        is called stalled: the prefill of every prompt it holds (this one's included) and
        ``max_new_tokens`` at the worker's pace, times ``watchdog_answer_factor``."""
        cfg = self.config
        rate = self.prefill_tps or cfg.watchdog_default_prefill_tps
        pace = self.token_s or cfg.watchdog_default_token_s
        expected = queued_prefill_tokens / rate + max_new_tokens * pace
        return max(cfg.watchdog_floor_s, cfg.watchdog_answer_factor * expected)

    def allowed_s(self, queued_prefill_tokens: int) -> float:
        """The longest silence this worker may show now without being called stalled."""
        cfg = self.config
        allowed = cfg.watchdog_floor_s
        if self.step_s is not None:
            allowed = max(allowed, cfg.watchdog_step_factor * self.step_s)
        if queued_prefill_tokens > 0:
            # Rates are learned from uncached tokens while the queue counts whole prompts,
            # so a prompt that turns out cached only makes the allowance generous.
            rate = self.prefill_tps or cfg.watchdog_default_prefill_tps
            allowed = max(allowed, cfg.watchdog_prefill_factor * queued_prefill_tokens / rate)
        return allowed

    def judge(self, now: float, *, in_flight: int, queued_prefill_tokens: int) -> Verdict:
        """Whether the worker is stalled: work in flight and silent past the allowance."""
        if in_flight <= 0:
            return Verdict(False, 0.0, 0.0)
        silent = max(0.0, now - self.last_progress_at)
        allowed = self.allowed_s(queued_prefill_tokens)
        return Verdict(silent > allowed, silent, allowed)

    # ------------------------------------------------------------- live requests
    def watch(self, kill: Callable[[], None]) -> Callable[[], None]:
        """Register how to cancel one live request on a stall; returns the unregister."""
        self._kills.add(kill)
        return lambda: self._kills.discard(kill)

    def kill_all(self) -> int:
        """Cancel every registered live request (each maps it to a retry or a resume)."""
        kills, self._kills = list(self._kills), set()
        for kill in kills:
            try:
                kill()
            except Exception:  # one broken callback must not keep the others alive
                log.exception("watchdog: cancelling a request failed")
        return len(kills)

    @property
    def live(self) -> int:
        return len(self._kills)


class WatchedWorker(Protocol):
    """What the driver needs of a worker (``gateway.workers.worker.Worker`` fits)."""

    @property
    def id(self) -> str: ...

    @property
    def progress(self) -> ProgressTracker: ...

    def load_figures(self) -> tuple[int, int]:
        """(requests in flight that stream to the gateway, prompt tokens sent that have no
        first message yet)."""
        ...

    def trip(self, reason: str) -> None:
        """Take the worker out of rotation (open its breaker)."""
        ...


def stalled(worker: WatchedWorker, now: float, silent_s: float, allowed_s: float) -> int:
    """Act on a stall verdict (the watchdog's, or an unstreamed answer's overdue deadline):
    the worker goes out of rotation and every live request on it is cancelled, so each
    is retried or resumed elsewhere. Returns how many were cancelled."""
    progress = worker.progress
    progress.stalls += 1
    progress.last_progress_at = now  # the next verdict judges fresh silence
    worker.trip("watchdog")
    killed = progress.kill_all()
    log.warning(
        "worker %s sent nothing for %.1f s with work in flight (allowed %.1f s): "
        "out of rotation, %d requests moved elsewhere",
        worker.id, silent_s, allowed_s, killed,
    )
    return killed


class Watchdog(Periodic):
    """Checks every worker on an interval and acts on a stall verdict."""

    name = "watchdog"

    def __init__(self, workers: Callable[[], Iterable[WatchedWorker]], config: WatchdogConfig | None = None) -> None:
        self._workers = workers
        self.config = config or WatchdogConfig()
        super().__init__()

    def check(self, now: float | None = None) -> list[str]:
        """One pass; returns the ids of workers found stalled (and acted on)."""
        now = time.monotonic() if now is None else now
        tripped: list[str] = []
        for worker in self._workers():
            progress = worker.progress
            in_flight, queued = worker.load_figures()
            verdict = progress.judge(now, in_flight=in_flight, queued_prefill_tokens=queued)
            if not verdict.stalled:
                continue
            stalled(worker, now, verdict.silent_s, verdict.allowed_s)
            tripped.append(worker.id)
        return tripped

    def interval_s(self) -> float:
        return self.config.watchdog_interval_s

    async def round(self) -> None:
        self.check()
